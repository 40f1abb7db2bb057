"""When a member that hears no leader starts an election: a randomised timeout that backs
off after every election ending without a leader and recovers while a leader holds."""

from __future__ import annotations

import zlib

# Election timeouts a leader must last before the election backoff drops a level.
STABLE_TICKS_PER_LEVEL = 8


class ElectionTimer:
    """Randomised election timeout (Raft, section 5.2) with backoff.

    Each backoff level doubles the timeout (and, through ``level``, check-quorum's
    window), so elections still end with a leader when round trips become slower than
    the configured timeout. Jitter comes from an xorshift32 seeded by member name and
    incarnation: deterministic, and different on every member and restart.
    """

    def __init__(
        self, member: str, incarnation: int, base_ticks: int, max_level: int, period: int
    ) -> None:
        self._rng = (zlib.crc32(member.encode()) ^ incarnation) & 0xFFFFFFFF or 0x9E3779B9
        self._base = base_ticks
        self._max_level = max_level
        self._period = period  # the unscaled election timeout, for the decay
        self.level = 0
        self.elapsed = 0
        self.timeout = 0
        self._stable_since = 0

    def _random(self) -> int:
        x = self._rng
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        self._rng = x
        return x

    def reset(self) -> None:
        base = self._base << self.level
        self.elapsed = 0
        self.timeout = base + self._random() % base

    def expired(self) -> bool:
        """Count one tick; True once the timeout has passed."""
        self.elapsed += 1
        return self.elapsed >= self.timeout

    def round_failed(self) -> None:
        """An election ended without a leader: wait longer next time."""
        self.level = min(self.level + 1, self._max_level)

    def leader_known(self, now: int) -> None:
        """A leader has just been found or lost: stability is counted from now."""
        self._stable_since = now

    def decay(self, now: int) -> None:
        """Called every tick while a leader is known: drop a level per stable period."""
        if self.level and now - self._stable_since >= STABLE_TICKS_PER_LEVEL * self._period:
            self.level -= 1
            self._stable_since = now
