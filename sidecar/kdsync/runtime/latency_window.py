"""Exact percentiles of recent replication latencies, for ``kdsync status`` and the demo
(the Prometheus histogram gives bucketed figures; this gives the real p50/p99)."""

from __future__ import annotations

from collections import deque


class LatencyWindow:
    def __init__(self, size: int = 50_000) -> None:
        self._values: deque[float] = deque(maxlen=size)
        self.count = 0

    def extend(self, milliseconds: list[float]) -> None:
        self._values.extend(milliseconds)
        self.count += len(milliseconds)

    def percentile(self, fraction: float) -> float | None:
        if not self._values:
            return None
        ordered = sorted(self._values)
        rank = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
        return ordered[rank]
