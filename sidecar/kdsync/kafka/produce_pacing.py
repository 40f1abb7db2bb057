"""How much the sidecar's writers queue per partition before they wait for the brokers.

librdkafka's idempotent producer (both writers here are idempotent: the ordering log and
the transactional ``T-global`` writer) keeps one ProduceRequest in flight per partition:
it counts the *messages* in flight against its limit of five *requests* (librdkafka pull
request #4989). While that request is out, a record queued behind it whose ``linger.ms``
has passed makes the client's broker thread poll with a zero timeout until the response
arrives. That busy loop took about a quarter of each member's CPU in the 1 KiB benchmark
(docs/performance.md), on a machine where the broker it waits for needs the same cores.

So a writer hands the client at most about one batch per partition at a time: once
``FLUSH_BYTES`` of records are queued for a partition it calls ``flush()``, which waits
for the acknowledgements without spinning, before it produces more. A long ``linger.ms``
keeps a batch from leaving half full while it is still being produced; it costs no
latency, because ``flush()`` and ``commit_transaction()`` send at once whatever the
linger says.
"""

from __future__ import annotations

# librdkafka's default batch.size, set explicitly so FLUSH_BYTES stays below it.
BATCH_BYTES = 1_000_000
# Below BATCH_BYTES by what the writers' estimate leaves out (user headers, framing).
FLUSH_BYTES = 900_000
LINGER_MS = 1_000
# A record's size is estimated as key + value + this: kdsync's own headers
# (record_format.global_headers) and the record's framing, about.
RECORD_OVERHEAD = 128
