"""An origin's batches on their way into the ordered stream.

A batch stays here from the moment its origin offers it until the committed log carries
it on from where its partition's chain stands: the delivery ledger's rule, run at commit
rather than at apply (``committed``). Such a batch is delivered (or found duplicate) by
every data member when applied, so it need never be offered again. Running the rule at
commit lets an origin whose ``T-global`` refuses writes, and so applies nothing, keep
its own events flowing to the others, and still learn at once when a batch of its own
would be a gap.

Only a window of batches travels to the leader at a time: a batch counts against the
window from its ``Forward`` until the origin sees it appended to the log (in an
``Append`` it receives, or by appending it itself as leader). A burst therefore waits
here, in the origin, rather than flooding the leader with copies: the leader's work per
tick stays bounded however far behind the group is. A forwarded batch that does not show
up is sent again after ``resend_ticks``; after a leader change every batch not yet
committed is offered again (the new leader drops what it already holds).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kdsync.ordering.events import OriginBatch, OriginPartition

BatchKey = tuple[OriginPartition, int, int]  # (origin partition, start, end)
_LATER = 1 << 62


def batch_key(batch: OriginBatch) -> BatchKey:
    return (batch.origin_partition, batch.start, batch.end)


@dataclass(slots=True)
class _Pending:
    batch: OriginBatch
    size: int
    sent_at: int | None = None  # forwarded (or appended) at this tick
    appended: bool = False  # seen in the log: no longer counts against the window


class Outbox:
    def __init__(
        self,
        max_batches: int,
        max_bytes: int,
        window: int,
        resend_ticks: int,
        max_forward_bytes: int,
    ) -> None:
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self.window = window
        self.resend_ticks = resend_ticks
        self.max_forward_bytes = max_forward_bytes
        self._queues: dict[OriginPartition, deque[_Pending]] = {}
        self._by_key: dict[BatchKey, _Pending] = {}
        self._bytes = 0
        self._travelling = 0  # forwarded and not yet seen appended
        self._unsent = 0  # neither forwarded nor seen appended
        self._resend_at = _LATER  # no travelling batch is due for a resend before this
        # Per partition of ours, the position up to which committed entries deliver it.
        self._marks: dict[OriginPartition, int] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    @property
    def bytes(self) -> int:
        return self._bytes

    def has_room(self) -> bool:
        return len(self._by_key) < self.max_batches and self._bytes < self.max_bytes

    def start_from(self, marks: dict[OriginPartition, int]) -> None:
        """Our partitions' marks in the ledger we recovered (applied up to the commit
        index we start from)."""
        self._marks = dict(marks)

    def ordered(self, batch: OriginBatch) -> bool:
        """Every event of ``batch`` is in committed entries that deliver it."""
        mark = self._marks.get(batch.origin_partition)
        return mark is not None and batch.end <= mark

    def committed(self, batch: OriginBatch) -> bool:
        """A committed entry carries ``batch`` (ours), in log order. The ledger's rule:
        False when it leaves a gap (applied, it will be rejected; it must travel again),
        else the batches it delivers are settled."""
        where = batch.origin_partition
        mark = self._marks.get(where)
        if mark is None:
            if not batch.opens:
                return False
            mark = batch.start
        if batch.start > mark:
            return False
        if batch.end > mark:
            self._marks[where] = batch.end
            self.settle(where, batch.end)
        return True

    def add(self, batch: OriginBatch) -> None:
        pending = _Pending(batch, batch.size_bytes())
        self._queues.setdefault(batch.origin_partition, deque()).append(pending)
        self._by_key[batch_key(batch)] = pending
        self._bytes += pending.size
        self._unsent += 1

    def due(self, now: int, limit: int | None = None) -> list[OriginBatch]:
        """Batches to send now, in offer order per partition, marked sent: never sent,
        or forwarded ``resend_ticks`` ago without showing up; within the window, and
        together at most ``max_forward_bytes`` (or one batch): they travel in one message,
        and a peer frame has a size limit. What does not fit goes at the next call."""
        room = self.window - self._travelling
        if (not self._unsent or room <= 0) and now < self._resend_at:
            return []  # the common case, asked on every input: nothing to scan for
        out: list[OriginBatch] = []
        size = 0
        resend_at = _LATER
        for queue in self._queues.values():
            for pending in queue:
                if limit is not None and len(out) >= limit:
                    return out
                if pending.appended:
                    continue
                due = pending.sent_at is None or now - pending.sent_at >= self.resend_ticks
                if due and out and size + pending.size > self.max_forward_bytes:
                    self._resend_at = now  # the rest is looked at again at the next call
                    return out
                if pending.sent_at is None:
                    if room <= 0:
                        break  # later batches of this partition wait behind this one
                    room -= 1
                    self._travelling += 1
                    self._unsent -= 1
                elif now - pending.sent_at < self.resend_ticks:
                    resend_at = min(resend_at, pending.sent_at + self.resend_ticks)
                    continue
                pending.sent_at = now
                resend_at = min(resend_at, now + self.resend_ticks)
                out.append(pending.batch)
                size += pending.size
        self._resend_at = resend_at if limit is None or len(out) < limit else now
        return out

    def appended(self, key: BatchKey) -> None:
        """The batch is in the log: it leaves the window (it stays until committed in order)."""
        pending = self._by_key.get(key)
        if pending is not None and not pending.appended:
            if pending.sent_at is not None:
                self._travelling -= 1
            else:
                self._unsent -= 1
            pending.appended = True
            pending.sent_at = pending.sent_at if pending.sent_at is not None else 0

    def retract(self, key: BatchKey) -> None:
        """Undo ``due`` for a batch that could not go (a leader refusing its own batch)."""
        pending = self._by_key.get(key)
        if pending is not None and pending.sent_at is not None and not pending.appended:
            pending.sent_at = None
            self._travelling -= 1
            self._unsent += 1

    def offer_again(self) -> None:
        """After a leader change or a gap: every batch not yet committed travels again."""
        for pending in self._by_key.values():
            pending.sent_at = None
            pending.appended = False
        self._travelling = 0
        self._unsent = len(self._by_key)
        self._resend_at = _LATER

    def settle(self, where: OriginPartition, mark: int) -> None:
        """Drop batches of ``where`` that end at or below ``mark`` (ordered)."""
        queue = self._queues.get(where)
        if not queue:
            return
        while queue and queue[0].batch.end <= mark:
            pending = queue.popleft()
            del self._by_key[batch_key(pending.batch)]
            self._bytes -= pending.size
            if not pending.appended:
                if pending.sent_at is not None:
                    self._travelling -= 1
                else:
                    self._unsent -= 1
        if not queue:
            del self._queues[where]
