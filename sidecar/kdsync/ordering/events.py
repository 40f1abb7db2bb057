"""What the ordering core orders: batches of source events, identified by their origin.

An event is identified by (origin member, topic, partition, offset). Batches carry consumer
*positions* (Kafka's "next offset to read") rather than offsets so that a chain of batches
from one origin partition can be checked for continuity even though Kafka offsets have
holes (transaction markers, compaction).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

Header = tuple[str, bytes | None]
OriginPartition = tuple[str, str, int]  # (origin member, topic, partition)

# What OriginBatch.size_bytes counts for an event besides its key, value and headers
# (offset, timestamp, the tuple), about.
EVENT_OVERHEAD_BYTES = 24


def header_bytes(headers: Iterable[Header]) -> int:
    """Headers' names (in characters) and values, as OriginBatch.size_bytes counts them."""
    return sum(len(name) + len(value or b"") for name, value in headers)


# Events are tuples, not frozen dataclasses: millions are made per minute on the hot path
# (read, decoded, delivered), and a frozen dataclass's __init__ sets each field through
# object.__setattr__, about 4x the cost of building a tuple. Both are immutable.
class SourceEvent(NamedTuple):
    """One record read (read_committed) from an origin's topic."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class OriginBatch:
    """Consecutive events of one origin partition, offered for ordering by that origin.

    ``start`` is the consumer position before the first event and ``end`` the position
    after the last one, so consecutive batches satisfy ``next.start == prev.end``.
    ``opens`` marks the first batch an origin sends for a partition since it (re)started:
    only such a batch may begin a chain that the ordered stream has not seen yet.
    """

    origin: str
    topic: str
    partition: int
    start: int
    end: int
    opens: bool
    events: tuple[SourceEvent, ...]
    # Computed once, on first use: the leader sizes Appends, the log its memory, by it.
    _size: int = field(default=-1, init=False, compare=False, repr=False)
    # The batch's wire encoding, kept by kdsync.wire_format once made or read: a batch
    # crosses the wire and the log topic several times and is encoded only once.
    _encoded: bytes | None = field(default=None, init=False, compare=False, repr=False)

    @property
    def origin_partition(self) -> OriginPartition:
        return (self.origin, self.topic, self.partition)

    def size_bytes(self) -> int:
        """About what the events take in memory and on the wire."""
        if self._size >= 0:
            return self._size
        size = 0
        for event in self.events:
            size += EVENT_OVERHEAD_BYTES + len(event.key or b"") + len(event.value or b"")
            if event.headers:
                size += header_bytes(event.headers)
        object.__setattr__(self, "_size", size)
        return size


class DeliveredEvent(NamedTuple):
    """An event in its agreed place: ``seq`` is its position in the topic's global stream."""

    seq: int
    origin: str
    topic: str
    partition: int
    event: SourceEvent
