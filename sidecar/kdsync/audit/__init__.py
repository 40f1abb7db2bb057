"""kdsync's consistency audit: a PySpark job that proves or disproves a group's properties.

It reads every data member's ``T-global`` (and each origin's ``T``) through Spark's Kafka
source and checks agreement, gaps, duplicates, completeness, origin order and fidelity over
a range of global sequence numbers; see ``docs/audit.md``. Modules:

- ``report``: the JSON report (the contract the operator reads) and the human summary;
- ``state``: where the last clean run ended, for incremental runs;
- ``positions``: the offsets to read, planned with a plain Kafka client before Spark starts;
- ``reader``: Spark DataFrames of ``T-global`` and ``T`` records, kdsync headers parsed;
- ``checks``: the checks, pure functions over DataFrames;
- ``session``: the Spark session (local, or the one ``spark-submit`` made);
- ``configmap``: report and state in a Kubernetes ConfigMap;
- ``job``: one audit run, end to end;
- ``command``: the ``kdsync audit`` command line;
- ``in_process``: that command run inside another (the demo, the fault campaigns).
"""

from __future__ import annotations
