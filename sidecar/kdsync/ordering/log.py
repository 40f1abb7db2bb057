"""The replicated log: entries in agreed positions, with a compacted prefix."""

from __future__ import annotations

from dataclasses import dataclass

from kdsync.ordering.configuration import Configuration
from kdsync.ordering.events import OriginBatch


@dataclass(frozen=True, slots=True)
class Entry:
    """A log position. ``batch`` is None for the no-op a new leader appends in its term
    and for a membership change, which carries the new ``config`` instead."""

    index: int
    term: int
    batch: OriginBatch | None
    config: Configuration | None = None


class ReplicatedLog:
    """In-memory suffix of the log after a compacted prefix ``[1, snapshot_index]``.

    Compacted entries are known to be committed; only their last (index, term) is kept,
    which is all that Raft's consistency check and vote comparison need.
    """

    __slots__ = ("_entries", "bytes", "snapshot_index", "snapshot_term")

    def __init__(self, snapshot_index: int = 0, snapshot_term: int = 0) -> None:
        self.snapshot_index = snapshot_index
        self.snapshot_term = snapshot_term
        self._entries: list[Entry] = []
        self.bytes = 0  # the batches held in memory, about (OriginBatch.size_bytes)

    @property
    def last_index(self) -> int:
        return self.snapshot_index + len(self._entries)

    @property
    def last_term(self) -> int:
        return self._entries[-1].term if self._entries else self.snapshot_term

    def term_at(self, index: int) -> int | None:
        """The term of ``index``, or None when it is compacted away or beyond the end."""
        if index == self.snapshot_index:
            return self.snapshot_term
        if index < self.snapshot_index or index > self.last_index:
            return None
        return self._entries[index - self.snapshot_index - 1].term

    def entry(self, index: int) -> Entry:
        return self._entries[index - self.snapshot_index - 1]

    def has(self, index: int) -> bool:
        return self.snapshot_index < index <= self.last_index

    def slice(self, first: int, last: int) -> list[Entry]:
        """Entries ``first..last`` inclusive; ``first`` must not be compacted."""
        base = self.snapshot_index + 1
        return self._entries[first - base : last - base + 1]

    def append(self, entry: Entry) -> None:
        assert entry.index == self.last_index + 1, (entry.index, self.last_index)
        self._entries.append(entry)
        self.bytes += entry_size(entry)

    def merge(self, entries: list[Entry]) -> int | None:
        """Raft's follower append: skip entries already present with the same term,
        truncate at the first conflict and append the rest.

        Returns the first index that changed (so the caller can persist from there), or
        None when nothing changed.
        """
        changed: int | None = None
        for position, entry in enumerate(entries):
            if entry.index <= self.snapshot_index:
                continue
            existing = self.term_at(entry.index)
            if existing == entry.term:
                continue
            if existing is not None:
                cut = entry.index - self.snapshot_index - 1
                self.bytes -= sum(entry_size(e) for e in self._entries[cut:])
                del self._entries[cut:]
            for rest in entries[position:]:
                self._entries.append(rest)
                self.bytes += entry_size(rest)
            changed = entry.index
            break
        return changed

    def compact(self, upto: int) -> None:
        """Forget entries ``<= upto`` (they must be committed)."""
        if upto <= self.snapshot_index:
            return
        upto = min(upto, self.last_index)
        term = self.term_at(upto)
        assert term is not None
        cut = upto - self.snapshot_index
        self.bytes -= sum(entry_size(e) for e in self._entries[:cut])
        del self._entries[:cut]
        self.snapshot_index = upto
        self.snapshot_term = term

    def reset(self, snapshot_index: int, snapshot_term: int, entries: list[Entry]) -> None:
        self.snapshot_index = snapshot_index
        self.snapshot_term = snapshot_term
        self._entries = list(entries)
        self.bytes = sum(entry_size(e) for e in self._entries)

    def index_after_bytes(self, first: int, budget: int) -> int:
        """The last index from ``first`` on whose entries fit in ``budget`` bytes."""
        index = first - 1
        for entry in self._entries[max(0, first - self.snapshot_index - 1) :]:
            budget -= entry_size(entry)
            if budget < 0:
                break
            index = entry.index
        return index


def entry_size(entry: Entry) -> int:
    """What an entry counts towards byte limits: its batch's events (a no-op: nothing)."""
    return entry.batch.size_bytes() if entry.batch is not None else 0
