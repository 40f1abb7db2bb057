"""Read a member's latest delivery ledger (``kdsync-<group>.ledger.internal``).

The sidecar reads it when it starts (where to resume, and the configuration in force);
the audit reads it to learn which members the group has now. Every ledger record has one
key, so the latest is near the end of the partition: a short tail is read first, and a
longer one only when the tail held none (compaction not yet done, or aborted writes).
"""

from __future__ import annotations

from confluent_kafka import Consumer

from kdsync.kafka.partition_reader import read_to_end, watermarks
from kdsync.ordering import LedgerState
from kdsync.wire_format.records import decode_ledger_state

LEDGER_KEY = b"ledger"
_FIRST_TAIL = 64


def read_latest_ledger(consumer: Consumer, topic: str, timeout: float) -> LedgerState | None:
    """The last committed ledger in ``topic`` (None when it holds none). ``consumer``
    must read committed records only and report partition ends (``reading_consumer``)."""
    low, high = watermarks(consumer, topic, 0, timeout)
    tail = _FIRST_TAIL
    while True:
        start = max(low, high - tail)
        latest: bytes | None = None
        for message in read_to_end(consumer, topic, 0, start, high, timeout):
            if message.key() == LEDGER_KEY and message.value() is not None:
                latest = message.value()
        if latest is not None:
            return decode_ledger_state(latest)
        if start <= low:
            return None
        tail *= 8
