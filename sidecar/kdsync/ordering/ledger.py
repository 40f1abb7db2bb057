"""Turns committed log entries into delivered events, exactly once and in origin order.

Every data member runs the same ledger over the same committed log, so every decision
here (duplicate, gap, sequence number) comes out the same everywhere: exactly-once is
decided by the ordered stream itself, not by any member's local view.

The marks are, per origin partition, the consumer position up to which events have been
delivered. A batch continues the chain when it starts at (or before) the mark and ends
after it; events before the mark were delivered already and are dropped. A batch that
starts after the mark would leave a hole and is rejected whole; its origin offers it
again after the missing batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from kdsync.ordering.configuration import Configuration
from kdsync.ordering.events import DeliveredEvent, OriginBatch, OriginPartition
from kdsync.ordering.log import Entry


class BatchVerdict(Enum):
    DELIVERED = "delivered"  # some or all events were new
    DUPLICATE = "duplicate"  # every event was delivered before
    GAP = "gap"  # would skip events: rejected, to be offered again in order
    NOOP = "noop"  # a leader's no-op entry
    CONFIG = "config"  # a membership change: nothing to deliver, the ledger keeps it


@dataclass(frozen=True, slots=True)
class LedgerState:
    """What a data member persists atomically with each write to its global topics."""

    applied_index: int = 0
    applied_term: int = 0
    marks: dict[OriginPartition, int] = field(default_factory=dict)
    next_seq: dict[str, int] = field(default_factory=dict)
    # The latest membership change applied, and its index: applied entries leave the
    # ordering log, so a restarted member takes its configuration from here, never from
    # its startup file (which only seeds a new group). None: the seed is still in force.
    config: Configuration | None = None
    config_index: int = 0

    def positions_of(self, origin: str) -> dict[tuple[str, int], int]:
        """The marks of ``origin``'s own partitions, by (topic, partition): where that
        origin's source reader resumes, and the source offsets it may commit."""
        return {
            (topic, partition): mark
            for (member, topic, partition), mark in self.marks.items()
            if member == origin
        }


@dataclass(frozen=True, slots=True)
class Delivery:
    """The outcome of applying one committed entry."""

    index: int
    term: int
    verdict: BatchVerdict
    events: tuple[DeliveredEvent, ...]
    origin_partition: OriginPartition | None


class DeliveryLedger:
    __slots__ = ("applied_index", "applied_term", "config", "config_index", "marks", "next_seq")

    def __init__(self, state: LedgerState | None = None) -> None:
        state = state or LedgerState()
        self.applied_index = state.applied_index
        self.applied_term = state.applied_term
        self.marks: dict[OriginPartition, int] = dict(state.marks)
        self.next_seq: dict[str, int] = dict(state.next_seq)
        self.config = state.config
        self.config_index = state.config_index

    def snapshot(self) -> LedgerState:
        return LedgerState(
            self.applied_index,
            self.applied_term,
            dict(self.marks),
            dict(self.next_seq),
            self.config,
            self.config_index,
        )

    def covers(self, batch: OriginBatch) -> bool:
        """True when every event of ``batch`` has been delivered."""
        mark = self.marks.get(batch.origin_partition)
        return mark is not None and batch.end <= mark

    def apply(self, entry: Entry) -> Delivery:
        assert entry.index == self.applied_index + 1, (entry.index, self.applied_index)
        self.applied_index = entry.index
        self.applied_term = entry.term
        batch = entry.batch
        if batch is None:
            if entry.config is not None:
                self.config, self.config_index = entry.config, entry.index
                return Delivery(entry.index, entry.term, BatchVerdict.CONFIG, (), None)
            return Delivery(entry.index, entry.term, BatchVerdict.NOOP, (), None)
        where = batch.origin_partition
        mark = self.marks.get(where)
        if mark is None:
            if not batch.opens:
                return Delivery(entry.index, entry.term, BatchVerdict.GAP, (), where)
            mark = batch.start
        if batch.start > mark:
            return Delivery(entry.index, entry.term, BatchVerdict.GAP, (), where)
        if batch.end <= mark:
            return Delivery(entry.index, entry.term, BatchVerdict.DUPLICATE, (), where)
        seq = self.next_seq.get(batch.topic, 0)
        events = batch.events
        if events and events[0].offset < mark:  # a batch that overlaps what was delivered
            events = tuple(event for event in events if event.offset >= mark)
        origin, topic, partition = where
        # tuple.__new__ builds the NamedTuple without its Python-level constructor: this
        # runs once per delivered event.
        new = tuple.__new__
        delivered = [
            new(DeliveredEvent, (number, origin, topic, partition, event))
            for number, event in enumerate(events, seq)
        ]
        self.next_seq[batch.topic] = seq + len(delivered)
        self.marks[where] = batch.end
        return Delivery(entry.index, entry.term, BatchVerdict.DELIVERED, tuple(delivered), where)
