"""Exact consumer failover between members: ``kdsync failover translate|apply``.

- ``translation``: the pure mapping of a group's position in one member's ``T-global``
  onto another's, by ``kdsync.seq`` (no Kafka; unit-tested with in-memory logs);
- ``report``: the table and JSON the commands print;
- ``kafka_io``: the Kafka side (read_committed probes, group offsets, group members);
- ``service``: the library call (``Failover(config, source, target).translate/apply``);
- ``command``: the command line.

See docs/operations.md ("Failing consumers over") for the runbook.
"""
