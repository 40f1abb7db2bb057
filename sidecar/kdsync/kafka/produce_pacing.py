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

from kdsync.record_format import OFFSET_HEADER, SEQ_HEADER, OriginHeaders

# librdkafka's default batch.size, set explicitly so FLUSH_BYTES stays below it.
BATCH_BYTES = 1_000_000
# Below BATCH_BYTES by what the writers' estimate leaves out (a batch's own framing,
# multi-byte header names).
FLUSH_BYTES = 900_000
LINGER_MS = 1_000
# A record's framing in its batch, about: length, attributes, deltas, key and value
# lengths, and each header's two lengths.
RECORD_FRAMING = 64
# The longest kdsync.seq / kdsync.offset values (decimal, up to 19 digits each).
_NUMBER_HEADERS = 2 * 19

# The producer settings the check of the user's Kafka properties must build with too: a
# user's message.timeout.ms at or below LINGER_MS is refused by librdkafka.
PACED_PRODUCER: dict[str, int] = {"linger.ms": LINGER_MS, "batch.size": BATCH_BYTES}


def fixed_record_bytes(shared: OriginHeaders) -> int:
    """What every ``T-global`` record of one origin partition adds to its batch besides
    key, value and the user's headers: framing, the ``shared`` origin headers, and the
    seq and offset headers at their longest (record_format.global_headers)."""
    size = RECORD_FRAMING + len(SEQ_HEADER) + len(OFFSET_HEADER) + _NUMBER_HEADERS
    return size + sum(len(name) + len(value or b"") for name, value in shared)


def must_flush(queued: int, size: int) -> bool:
    """Whether a record of ``size`` bytes waits for a flush of the ``queued`` bytes already
    produced to its partition (never when nothing is queued: a large record goes alone)."""
    return queued > 0 and queued + size > FLUSH_BYTES
