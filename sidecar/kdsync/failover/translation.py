"""Exact offset translation between two members' ``T-global`` (pure: no Kafka here).

Every member's ``T-global`` partition ``p`` holds the same records in the same order
(agreement), but at different offsets: transaction markers take offsets, and each member
commits its own transactions. The ``kdsync.seq`` header names a record in every member,
and within one partition it grows with the offset, so a position in member A maps onto
member B exactly:

- the group has read, in partition ``p`` of A, every record up to the one *before* its
  committed offset; call its sequence number ``L``;
- in B the same position is just after the record with sequence number ``L``:
  ``offset_B(L) + 1``. The next record the group reads in B is the one that follows ``L``
  in A too, even if B has not delivered it yet (it is the same partition everywhere).

Where ``L`` is not known or not in B, the first record the group has *not* read (``N``)
serves instead (its offset in B), which covers a B whose retention deleted only records
the group had read. Anything else is reported, never guessed: B has not delivered ``L``
yet (``BEHIND``: wait, or see how far behind), B's retention deleted records the group
has not read (``DELETED_IN_TARGET``: the earliest position is offered), A's retention
deleted them (``DELETED_IN_SOURCE``), or the two disagree (``MISMATCH``: run the audit).

The records are read through :class:`PartitionLog`, which ``kdsync.failover.kafka_io``
implements with a read_committed consumer and the unit tests with a list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Located:
    """A committed ``T-global`` record: its offset in one cluster and its ``kdsync.seq``."""

    offset: int
    seq: int


class PartitionLog(Protocol):
    """The committed records of one ``T-global`` partition in one cluster."""

    def bounds(self) -> tuple[int, int]:
        """(log start offset, end offset): retained offsets are ``[start, end)``."""
        ...

    def read_from(self, offset: int) -> Sequence[Located]:
        """Consecutive committed records from the first one at or after ``offset``
        (at least one unless there is none before the end; any number after it)."""
        ...

    def last_before(self, offset: int) -> Located | None:
        """The last committed, retained record below ``offset``, if any."""
        ...


class Outcome(Enum):
    EXACT = "exact"  # the position in B is known exactly
    NO_OFFSET = "no offset"  # the group has no committed offset here in A
    BEHIND = "behind"  # B has not delivered what the group read in A yet
    DELETED_IN_TARGET = "deleted in target"  # B's retention removed unread records
    DELETED_IN_SOURCE = "deleted in source"  # A's retention removed unread records
    MISMATCH = "mismatch"  # A holds a record B's range should hold and does not


@dataclass(frozen=True, slots=True)
class SourcePosition:
    """Where a group stands in one partition of A."""

    committed: int  # the group's committed offset (the next offset it reads)
    log_start: int
    last_read: Located | None  # the last committed record before ``committed``
    next_unread: Located | None  # the first committed record at or after it


@dataclass(frozen=True, slots=True)
class PartitionTranslation:
    topic: str
    partition: int
    outcome: Outcome
    source_offset: int | None = None
    last_read_seq: int | None = None  # None: nothing read (or not retained in A)
    target_offset: int | None = None  # EXACT: the position; DELETED_*: the earliest offered
    target_last_seq: int | None = None  # BEHIND: the last seq B has in this partition
    detail: str = ""

    @property
    def seqs_behind(self) -> int | None:
        """BEHIND: how many sequence numbers B still lacks (an upper bound of events in
        this partition when ``globalPartitions`` > 1, exact with 1)."""
        if self.outcome is not Outcome.BEHIND or self.last_read_seq is None:
            return None
        return self.last_read_seq - (-1 if self.target_last_seq is None else self.target_last_seq)


class SeqSearch(Enum):
    FOUND = "found"
    BEFORE_START = "before start"  # older than B's first retained record: deleted
    AFTER_END = "after end"  # newer than B's last record: not delivered yet
    MISSING = "missing"  # within B's range but absent


@dataclass(frozen=True, slots=True)
class SeqLookup:
    result: SeqSearch
    record: Located | None  # FOUND: the record; BEFORE_START: B's first retained record
    last: Located | None = None  # AFTER_END: B's last record (None: B has none)


def find_seq(log: PartitionLog, seq: int) -> SeqLookup:
    """Find the record with sequence number ``seq`` (bisection over offsets; each probe
    reads one run of records, and the search ends as soon as a run spans ``seq``)."""
    start, end = log.bounds()
    first_run = log.read_from(start)
    if not first_run:
        return SeqLookup(SeqSearch.AFTER_END, None, log.last_before(end))
    if first_run[0].seq > seq:
        return SeqLookup(SeqSearch.BEFORE_START, first_run[0])
    low, high = start, end
    run: Sequence[Located] = first_run
    while True:
        hit = _in_run(run, seq)
        if hit is not None:
            return hit
        if run and run[-1].seq < seq:
            low = max(low, run[-1].offset + 1)
        elif run:
            high = min(high, run[0].offset)
        if low >= high:
            break
        middle = (low + high) // 2
        run = log.read_from(middle)
        if not run:
            high = middle
            continue
        if run[0].seq > seq:
            high = middle
            run = ()
    # Every record below ``low`` has a smaller seq, and none in [low, high) exists or
    # it would have been probed: ``seq`` is either not delivered yet or missing.
    after = log.read_from(low)
    if not after:
        return SeqLookup(SeqSearch.AFTER_END, None, log.last_before(end))
    hit = _in_run(after, seq)
    if hit is not None:
        return hit
    return SeqLookup(SeqSearch.MISSING, after[0])


def _in_run(run: Sequence[Located], seq: int) -> SeqLookup | None:
    if not run or not run[0].seq <= seq <= run[-1].seq:
        return None
    for record in run:
        if record.seq == seq:
            return SeqLookup(SeqSearch.FOUND, record)
    return SeqLookup(SeqSearch.MISSING, run[0])


def source_position(log: PartitionLog, committed: int) -> SourcePosition:
    """Read where a group whose committed offset is ``committed`` stands in A."""
    start, _ = log.bounds()
    following = log.read_from(committed)
    return SourcePosition(
        committed=committed,
        log_start=start,
        last_read=log.last_before(committed),
        next_unread=following[0] if following else None,
    )


def translate_partition(
    topic: str, partition: int, source: SourcePosition | None, target: PartitionLog
) -> PartitionTranslation:
    """The group's position in B for one partition, or why there is none."""
    if source is None:
        return PartitionTranslation(
            topic, partition, Outcome.NO_OFFSET, detail="no committed offset in the source"
        )
    base = PartitionTranslation(
        topic,
        partition,
        Outcome.EXACT,
        source_offset=source.committed,
        last_read_seq=source.last_read.seq if source.last_read else None,
    )
    if source.committed < source.log_start:
        earliest = _earliest(target)
        return _with(
            base,
            Outcome.DELETED_IN_SOURCE,
            earliest,
            detail=(
                f"the source deleted offsets {source.committed}..{source.log_start - 1} "
                "before the group read them (retention)"
            ),
        )
    if source.last_read is not None:
        lookup = find_seq(target, source.last_read.seq)
        if lookup.result is SeqSearch.FOUND and lookup.record is not None:
            return _with(base, Outcome.EXACT, lookup.record.offset + 1)
        if lookup.result is SeqSearch.BEFORE_START and source.next_unread is not None:
            # B deleted what the group read; fine if B still has the first unread record.
            return _by_next_unread(base, source.next_unread, target)
        return _not_found(base, lookup, source.last_read.seq)
    if source.log_start == 0:
        # Nothing read in this partition: the position is the very beginning.
        target_start, _ = target.bounds()
        if target_start == 0:
            return _with(base, Outcome.EXACT, 0)
        if source.next_unread is not None:
            return _by_next_unread(base, source.next_unread, target)
        return _with(
            base,
            Outcome.DELETED_IN_TARGET,
            _earliest(target),
            detail=f"the target's retention deleted offsets before {target_start}",
        )
    if source.next_unread is not None:
        # The records the group read are gone from A; the first unread one maps it.
        return _by_next_unread(base, source.next_unread, target)
    return _with(
        base,
        Outcome.DELETED_IN_SOURCE,
        _earliest(target),
        detail="the source retains no record around the group's position",
    )


def _by_next_unread(
    base: PartitionTranslation, next_unread: Located, target: PartitionLog
) -> PartitionTranslation:
    lookup = find_seq(target, next_unread.seq)
    if lookup.result is SeqSearch.FOUND and lookup.record is not None:
        return _with(base, Outcome.EXACT, lookup.record.offset)
    return _not_found(base, lookup, next_unread.seq)


def _not_found(base: PartitionTranslation, lookup: SeqLookup, seq: int) -> PartitionTranslation:
    if lookup.result is SeqSearch.AFTER_END:
        last = lookup.last
        has = "nothing" if last is None else f"up to seq {last.seq}"
        return PartitionTranslation(
            base.topic,
            base.partition,
            Outcome.BEHIND,
            source_offset=base.source_offset,
            last_read_seq=seq if base.last_read_seq is None else base.last_read_seq,
            target_last_seq=None if last is None else last.seq,
            detail=f"the target has delivered {has} here; the group needs seq {seq}",
        )
    if lookup.result is SeqSearch.BEFORE_START and lookup.record is not None:
        return _with(
            base,
            Outcome.DELETED_IN_TARGET,
            lookup.record.offset,
            detail=(
                f"the target's retention deleted seq {seq}; its earliest record is seq "
                f"{lookup.record.seq} at offset {lookup.record.offset}"
            ),
        )
    return _with(
        base,
        Outcome.MISMATCH,
        None,
        detail=(
            f"seq {seq} is in the source but not where it belongs in the target: the "
            "members disagree (run kdsync audit)"
        ),
    )


def _earliest(target: PartitionLog) -> int:
    start, _ = target.bounds()
    return start


def _with(
    base: PartitionTranslation, outcome: Outcome, offset: int | None, detail: str = ""
) -> PartitionTranslation:
    return PartitionTranslation(
        base.topic,
        base.partition,
        outcome,
        source_offset=base.source_offset,
        last_read_seq=base.last_read_seq,
        target_offset=offset,
        detail=detail,
    )


@dataclass(frozen=True, slots=True)
class GroupTranslation:
    """A consumer group's translated positions from member ``source`` to ``target``."""

    group: str
    source: str
    target: str
    partitions: tuple[PartitionTranslation, ...]
    skipped_topics: tuple[str, ...] = ()  # the group's topics that are no T-global

    def behind(self) -> tuple[PartitionTranslation, ...]:
        return tuple(p for p in self.partitions if p.outcome is Outcome.BEHIND)

    def blocking(self, accept_earliest: bool) -> tuple[PartitionTranslation, ...]:
        """The partitions that keep ``apply`` from writing anything."""
        allowed = {Outcome.EXACT, Outcome.NO_OFFSET}
        if accept_earliest:
            allowed |= {Outcome.DELETED_IN_TARGET, Outcome.DELETED_IN_SOURCE}
        return tuple(p for p in self.partitions if p.outcome not in allowed)

    def offsets(self, accept_earliest: bool) -> dict[tuple[str, int], int]:
        """What to commit in the target; only meaningful when nothing is ``blocking``."""
        chosen: dict[tuple[str, int], int] = {}
        for p in self.partitions:
            if p.target_offset is None or p.outcome in (Outcome.NO_OFFSET, Outcome.MISMATCH):
                continue
            if p.outcome is Outcome.EXACT or accept_earliest:
                chosen[(p.topic, p.partition)] = p.target_offset
        return chosen
