"""The MM2-named metrics: windowed max/mean/rate and what each update sets."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from kdsync.runtime.mirror_metrics import MirrorMetrics, WindowStat


def test_window_keeps_only_the_last_thirty_seconds() -> None:
    stat = WindowStat(window=30.0)
    stat.add(100.0, [10.0, 50.0])
    stat.add(120.0, [20.0])
    assert (stat.max(), stat.mean()) == (50.0, 80.0 / 3)
    stat.add(135.0, [5.0])  # the values of t=100 fall out
    assert (stat.max(), stat.mean()) == (20.0, 12.5)
    assert stat.rate(135.0) == 25.0 / 30.0


def test_a_burst_is_kept_in_a_bounded_number_of_buckets() -> None:
    """A window holds per-second aggregates, not every value: a burst of records must not
    make each update slower (it once stalled the sidecar's event loop for 25 s)."""
    stat = WindowStat(window=30.0)
    for i in range(6000):  # 600,000 values over 60 s
        stat.add(1000.0 + i / 100, [float(v) for v in range(100)])
    assert stat.buckets <= 31
    assert (stat.max(), stat.mean()) == (99.0, 49.5)


def test_replicated_records_set_the_pair_series_and_heartbeats_their_own() -> None:
    registry = CollectorRegistry()
    metrics = MirrorMetrics(registry, "eu", "kdsync-g.heartbeats")
    metrics.replicated("us", "orders", [40.0, 10.0], [100, 300], now=1000.0)
    pair = {"source": "us", "target": "eu", "topic": "orders"}
    value = registry.get_sample_value
    assert value("kdsync_mirror_replication_latency_ms", pair) == 10.0
    assert value("kdsync_mirror_replication_latency_ms_max", pair) == 40.0
    assert value("kdsync_mirror_replication_latency_ms_avg", pair) == 25.0
    assert value("kdsync_mirror_record_count_total", pair) == 2
    assert value("kdsync_mirror_byte_rate", pair) == 400 / 30
    assert value("kdsync_heartbeats_received_total", {"source": "us"}) is None
    metrics.replicated("us", "kdsync-g.heartbeats", [7.0], [2], now=1001.0)
    assert value("kdsync_heartbeat_latency_ms", {"source": "us"}) == 7.0
    assert value("kdsync_heartbeats_received_total", {"source": "us"}) == 1
    metrics.consumed("orders", [5.0, 15.0], now=1002.0)
    assert value("kdsync_mirror_record_age_ms_max", {"topic": "orders"}) == 15.0
    metrics.lag("orders", 2, 12)
    assert value("kdsync_mirror_record_lag", {"topic": "orders", "partition": "2"}) == 12
