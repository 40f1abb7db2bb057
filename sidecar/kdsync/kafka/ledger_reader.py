"""Read a member's latest delivery ledger (``kdsync-<group>.ledger.internal``).

The sidecar reads it when it starts (where to resume, and the configuration in force);
the audit reads it to learn which members the group has now. Every ledger record has one
key, so the latest is near the end of the partition: a short tail is read first, and a
longer one only when the tail held none (compaction not yet done, or aborted writes).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer

from kdsync.kafka.partition_reader import read_to_end, watermarks
from kdsync.ordering import LedgerState
from kdsync.wire_format.records import decode_ledger_state

LEDGER_KEY = b"ledger"
# A member seeded by a backfill (kdsync.backfill) gets a hand-over record under its own key
# in the same transaction as its first ledger, after the backfill's marker: both kept for
# ever by compaction, ahead of every ledger record. JSON: donor, appliedIndex, appliedTerm,
# nextSeq and firstSeq (per source topic: the first sequence number its T-global holds),
# copied, presentBefore, at.
HANDOVER_KEY = b"handover"
# Written before a backfill copies anything (by the member's own transactional id, which
# fences a sidecar started too early): a sidecar that finds it without a ledger refuses
# to start, since its T-global is half copied.
BACKFILL_KEY = b"backfill"
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


@dataclass(frozen=True)
class Seeding:
    """What a backfill left at the start of a member's ledger topic: ``started`` once a
    backfill began seeding it (its marker record), ``handover`` once it finished."""

    started: bool = False
    handover: dict[str, Any] | None = None


def read_seeding(consumer: Consumer, topic: str, timeout: float) -> Seeding:
    """Read the first committed records of a ledger topic, up to its first ledger record
    (a member never seeded starts with one: one record read)."""
    started = False
    with contextlib.closing(read_to_end(consumer, topic, 0, None, None, timeout)) as records:
        for message in records:
            key, value = message.key(), message.value()
            if key == BACKFILL_KEY:
                started = True
                continue
            if key == HANDOVER_KEY and value is not None:
                try:
                    found = json.loads(value)
                except ValueError:  # not ours to judge here: no first seqs then
                    found = None
                return Seeding(True, found if isinstance(found, dict) else None)
            break
    return Seeding(started, None)


def first_seqs(handover: dict[str, Any] | None) -> dict[str, int]:
    """Source topic -> the first sequence number the member's T-global holds (topics not
    named start at 0, as every T-global of a member that was not seeded does)."""
    if handover is None:
        return {}
    found = handover.get("firstSeq")
    if not isinstance(found, dict):
        return {}
    return {str(topic): int(seq) for topic, seq in found.items()}
