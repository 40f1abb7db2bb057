"""Metrics named after MirrorMaker 2's, so dashboards and alerts carry over.

MM2's source connector reports, per replicated partition, ``replication-latency-ms``
(with ``-max`` and ``-avg``), ``record-count``, ``byte-rate`` and ``record-age-ms``
(with ``-max`` and ``-avg``). Here the same quantities, in Prometheus spelling
(``kdsync_mirror_`` + the name with ``_`` for ``-``; a counter gets ``_total``):

- ``replication-latency-ms`` (``-max``, ``-avg``): ``kdsync_mirror_replication_latency_ms``
  (``_max``, ``_avg``) by source, target, topic: origin record timestamp to commit in this
  member's ``T-global`` (the last record; max and mean over the last 30 s);
- ``record-count``: ``kdsync_mirror_record_count_total``, same labels: records committed;
- ``byte-rate``: ``kdsync_mirror_byte_rate``, same labels: key and value bytes per second
  committed over the last 30 s;
- ``record-age-ms`` (``-max``, ``-avg``): ``kdsync_mirror_record_age_ms`` (...) by topic,
  on the origin: how old a record is when this sidecar reads it from ``T``;
- not in MM2 (KIP-971): ``kdsync_mirror_record_lag`` by topic and partition, on the
  origin: records of ``T`` not yet in its own ``T-global``.

``source`` is the origin member, ``target`` this member; the heartbeat topic
(``kdsync-<group>.heartbeats``) shows up as a topic like any other, and also in
``kdsync_heartbeat_latency_ms`` and ``kdsync_heartbeats_received_total`` per origin.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

WINDOW_SECONDS = 30.0


class WindowStat:
    """Values seen in the last ``WINDOW_SECONDS``: their max, mean and sum.

    Kept as one (count, sum, max) bucket per second, not value by value: a burst puts
    hundreds of thousands of records in a window, and a max over each of them for every
    batch stalled the event loop for 25 s. A bucket leaves the window once all of its second
    is older than the window (so the window is up to a second longer)."""

    def __init__(self, window: float = WINDOW_SECONDS) -> None:
        self._window = window
        # [second, count, sum, max], oldest first
        self._buckets: deque[list[float]] = deque()

    @property
    def buckets(self) -> int:
        return len(self._buckets)

    def add(self, now: float, values: Iterable[float]) -> None:
        batch = list(values)
        self._expire(now)
        if not batch:
            return
        second = float(int(now))
        top = max(batch)
        if self._buckets and self._buckets[-1][0] == second:
            bucket = self._buckets[-1]
            bucket[1] += len(batch)
            bucket[2] += sum(batch)
            bucket[3] = max(bucket[3], top)
        else:
            self._buckets.append([second, len(batch), sum(batch), top])

    def _expire(self, now: float) -> None:
        while self._buckets and self._buckets[0][0] + 1 <= now - self._window:
            self._buckets.popleft()

    def max(self) -> float:
        return max((b[3] for b in self._buckets), default=0.0)

    def mean(self) -> float:
        count = sum(b[1] for b in self._buckets)
        return sum(b[2] for b in self._buckets) / count if count else 0.0

    def rate(self, now: float) -> float:
        self._expire(now)
        return sum(b[2] for b in self._buckets) / self._window


class MirrorMetrics:
    def __init__(self, registry: CollectorRegistry, member: str, heartbeat_topic: str) -> None:
        self.member = member
        self.heartbeat_topic = heartbeat_topic
        pair = ["source", "target", "topic"]
        r = registry
        self.latency = Gauge(
            "kdsync_mirror_replication_latency_ms",
            "MM2 replication-latency-ms: origin timestamp to commit here, last record",
            pair,
            registry=r,
        )
        self.latency_max = Gauge(
            "kdsync_mirror_replication_latency_ms_max",
            "MM2 replication-latency-ms-max over the last 30 s",
            pair,
            registry=r,
        )
        self.latency_avg = Gauge(
            "kdsync_mirror_replication_latency_ms_avg",
            "MM2 replication-latency-ms-avg over the last 30 s",
            pair,
            registry=r,
        )
        self.record_count = Counter(
            "kdsync_mirror_record_count",
            "MM2 record-count: records committed to this member's T-global",
            pair,
            registry=r,
        )
        self.byte_rate = Gauge(
            "kdsync_mirror_byte_rate",
            "MM2 byte-rate: key and value bytes per second committed, over the last 30 s",
            pair,
            registry=r,
        )
        self.record_age = Gauge(
            "kdsync_mirror_record_age_ms",
            "MM2 record-age-ms: age of a source record when this sidecar read it, last",
            ["topic"],
            registry=r,
        )
        self.record_age_max = Gauge(
            "kdsync_mirror_record_age_ms_max",
            "MM2 record-age-ms-max over the last 30 s",
            ["topic"],
            registry=r,
        )
        self.record_age_avg = Gauge(
            "kdsync_mirror_record_age_ms_avg",
            "MM2 record-age-ms-avg over the last 30 s",
            ["topic"],
            registry=r,
        )
        self.record_lag = Gauge(
            "kdsync_mirror_record_lag",
            "Records of a source partition not yet in this member's T-global (KIP-971)",
            ["topic", "partition"],
            registry=r,
        )
        self.heartbeat_latency = Gauge(
            "kdsync_heartbeat_latency_ms",
            "Latency of the last heartbeat from the source member to this member's T-global",
            ["source"],
            registry=r,
        )
        self.heartbeats = Counter(
            "kdsync_heartbeats_received",
            "Heartbeats from the source member committed here",
            ["source"],
            registry=r,
        )
        self._latency_window: dict[tuple[str, str], WindowStat] = {}
        self._bytes_window: dict[tuple[str, str], WindowStat] = {}
        self._age_window: dict[str, WindowStat] = {}
        # Members whose removal committed: their last batches, ordered before the removal,
        # may be applied after it, and must not bring their series back.
        self._departed: set[str] = set()

    def replicated(
        self, source: str, topic: str, latencies_ms: list[float], sizes: list[int], now: float
    ) -> None:
        """Records from ``source``'s ``topic`` were committed here (one transaction)."""
        if source in self._departed:
            return
        labels = (source, self.member, topic)
        key = (source, topic)
        self.record_count.labels(*labels).inc(len(sizes))
        sent = self._bytes_window.setdefault(key, WindowStat())
        sent.add(now, sizes)
        self.byte_rate.labels(*labels).set(sent.rate(now))
        if not latencies_ms:
            return
        window = self._latency_window.setdefault(key, WindowStat())
        window.add(now, latencies_ms)
        self.latency.labels(*labels).set(latencies_ms[-1])
        self.latency_max.labels(*labels).set(window.max())
        self.latency_avg.labels(*labels).set(window.mean())
        if topic == self.heartbeat_topic:
            self.heartbeat_latency.labels(source).set(latencies_ms[-1])
            self.heartbeats.labels(source).inc(len(latencies_ms))

    def consumed(self, topic: str, ages_ms: list[float], now: float) -> None:
        """This sidecar read records of its own ``topic`` (ages at read time)."""
        if not ages_ms:
            return
        window = self._age_window.setdefault(topic, WindowStat())
        window.add(now, ages_ms)
        self.record_age.labels(topic).set(ages_ms[-1])
        self.record_age_max.labels(topic).set(window.max())
        self.record_age_avg.labels(topic).set(window.mean())

    def lag(self, topic: str, partition: int, records: int) -> None:
        self.record_lag.labels(topic, str(partition)).set(max(0, records))

    def members_in_force(self, members: Iterable[str]) -> None:
        """The configuration in force names ``members``: one removed and added back
        again has series again."""
        self._departed.difference_update(members)

    def forget_source(self, source: str) -> None:
        """Drop every series and window of origin ``source``, a member whose removal
        committed, and keep them dropped until it is a member again
        (``members_in_force``): a heartbeat counter that no longer grows would fire an
        alert for a member that is gone."""
        self._departed.add(source)
        keys = {k for k in (*self._bytes_window, *self._latency_window) if k[0] == source}
        pair_metrics = (
            self.latency, self.latency_max, self.latency_avg, self.record_count, self.byte_rate,
        )  # fmt: skip
        for key in keys:
            self._bytes_window.pop(key, None)
            self._latency_window.pop(key, None)
            for metric in pair_metrics:
                with contextlib.suppress(KeyError):
                    metric.remove(source, self.member, key[1])
        for by_source in (self.heartbeat_latency, self.heartbeats):
            with contextlib.suppress(KeyError):
                by_source.remove(source)
