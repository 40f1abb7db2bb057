"""A seeded network that delays, drops, duplicates, reorders and partitions frames (the
encoded peer messages, exactly as the sidecar sends them)."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LinkFaults:
    max_delay: int = 2  # ticks; a random delay in [0, max_delay]
    drop: float = 0.0
    duplicate: float = 0.0
    # Links are FIFO like the TCP connections they model; with this chance a message
    # may overtake earlier ones (as after a reconnect).
    reorder: float = 0.0


class SimNetwork:
    def __init__(self, rng: random.Random, faults: LinkFaults) -> None:
        self._rng = rng
        self.faults = faults
        self._queue: list[tuple[int, int, str, str, bytes]] = []
        self._counter = 0
        self._cut: set[frozenset[str]] = set()
        self._link_clock: dict[tuple[str, str], int] = {}
        self.sent = 0
        self.dropped = 0

    def partition(self, side_a: set[str], side_b: set[str]) -> None:
        for a in side_a:
            for b in side_b:
                self._cut.add(frozenset((a, b)))

    def heal(self) -> None:
        self._cut.clear()

    def connected(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self._cut

    def send(self, now: int, sender: str, receiver: str, frame: bytes) -> None:
        self.sent += 1
        faults = self.faults
        if not self.connected(sender, receiver) or (
            faults.drop and self._rng.random() < faults.drop
        ):
            self.dropped += 1
            return
        copies = 2 if faults.duplicate and self._rng.random() < faults.duplicate else 1
        link = (sender, receiver)
        for _ in range(copies):
            delay = self._rng.randint(0, faults.max_delay) if faults.max_delay else 0
            at = now + delay
            if not (faults.reorder and self._rng.random() < faults.reorder):
                at = max(at, self._link_clock.get(link, 0))
                self._link_clock[link] = at
            self._counter += 1
            heapq.heappush(self._queue, (at, self._counter, sender, receiver, frame))

    def due(self, now: int) -> list[tuple[str, str, bytes]]:
        """Frames due by ``now``; a partition formed meanwhile still cuts them."""
        out: list[tuple[str, str, bytes]] = []
        queue = self._queue
        while queue and queue[0][0] <= now:
            _, _, sender, receiver, frame = heapq.heappop(queue)
            if self.connected(sender, receiver):
                out.append((sender, receiver, frame))
        return out

    def in_flight(self) -> int:
        return len(self._queue)
