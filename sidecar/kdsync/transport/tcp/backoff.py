"""Reconnect delays for a peer link that failed."""

from __future__ import annotations

from collections.abc import Callable


class ExponentialBackoff:
    """Reconnect delays: doubling from ``initial`` up to ``maximum``, with jitter.

    Each delay is uniform in [ceiling/2, ceiling) ("equal jitter"): spread out so
    members that lost the same peer do not retry in lockstep, yet never near zero.
    ``jitter`` returns floats in [0, 1); tests pass a fixed one.
    """

    def __init__(self, initial: float, maximum: float, jitter: Callable[[], float]) -> None:
        self.initial = initial
        self.maximum = maximum
        self._jitter = jitter
        self.failures = 0

    def next_delay(self) -> float:
        # The exponent is capped so 2**n cannot overflow a float after a long outage.
        ceiling = min(self.maximum, self.initial * 2.0 ** min(self.failures, 60))
        self.failures += 1
        return ceiling * (0.5 + 0.5 * self._jitter())

    def reset(self) -> None:
        self.failures = 0
