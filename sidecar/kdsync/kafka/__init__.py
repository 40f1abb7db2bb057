"""The Kafka side of a sidecar: thin I/O shells around the ordering core.

- ``topics``: creates the internal topics and ``T-global`` and finds the source topics.
- ``log_store``: the ordering core's durable log (term, vote, entries) in the internal
  log topic of the member's own cluster.
- ``global_writer``: one Kafka transaction per group of deliveries: ``T-global`` records,
  the delivery ledger and the source offsets, so they commit or vanish together.
- ``source_reader``: reads the member's own topics (read_committed) into origin batches.
"""
