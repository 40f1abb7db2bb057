"""Heartbeats through the group and MirrorMaker 2-named metrics on ``/metrics`` (#15).

With no user traffic at all, each member's heartbeat latency from every origin keeps
updating; with traffic, every MM2-named metric appears with the expected labels. The
heartbeats never show up in the user's ``T-global``: the independent checker still
finds exactly the produced events there.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from kdsync import naming
from kdsync.local_group import LocalSidecarGroup
from tests.integration.sidecar.harness import (
    Traffic,
    http_get,
    start_watched,
    verify_group,
    wait_for,
)

pytestmark = pytest.mark.kafka

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def samples(address: str) -> dict[str, float]:
    """``name{labels}`` -> value, from a sidecar's /metrics."""
    status, text = http_get(address, "/metrics")
    assert status == 200
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and not line.startswith("#"):
            found[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return found


def labelled(found: dict[str, float], name: str, **labels: str) -> float | None:
    """The sample of ``name`` whose labels include ``labels`` (None if absent)."""
    for key, value in found.items():
        metric, _, rest = key.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            return value
    return None


def test_heartbeats_update_without_traffic_and_mm2_metrics_show(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    group = sidecar_group("mirror", bootstrap, source_topic)
    global_topic, watch = start_watched(group, bootstrap, source_topic)
    try:
        heartbeat_topic = naming.heartbeat_topic(group.group)
        target = group.members["m2"].http

        def received(source: str) -> float:
            value = labelled(samples(target), "kdsync_heartbeats_received_total", source=source)
            return value or 0.0

        # No traffic: m2 keeps receiving every member's heartbeats, latency included.
        wait_for(
            "heartbeats from every member at m2",
            lambda: all(received(m) >= 2 for m in bootstrap),
            60,
        )
        before = {m: received(m) for m in bootstrap}
        wait_for(
            "more heartbeats at m2 with no traffic",
            lambda: all(received(m) >= before[m] + 3 for m in bootstrap),
            60,
        )
        idle = samples(target)
        for source in bootstrap:
            latency = labelled(idle, "kdsync_heartbeat_latency_ms", source=source)
            assert latency is not None and 0 <= latency < 30_000, (source, latency)
            pair = {"source": source, "target": "m2", "topic": heartbeat_topic}
            assert labelled(idle, "kdsync_mirror_replication_latency_ms_max", **pair) is not None
        assert watch.count("m2") == 0, "heartbeats leaked into the user's T-global"
        idle_latency = {
            m: labelled(idle, "kdsync_heartbeat_latency_ms", source=m) for m in bootstrap
        }
        print(f"\nidle heartbeat latency at m2, ms: {idle_latency}")
        print()

        produced = Traffic(bootstrap, source_topic, count_per_origin=200, rate_per_origin=200)
        counts = produced.start().join()
        verify_group(group, bootstrap, source_topic, global_topic, counts, watch=watch)
        # /status counts the user's events only; heartbeats are counted apart.
        total = sum(counts.values())
        status = group.wait_until(
            "m2's /status to answer", lambda s: "eventsOut" in s, 30, names=["m2"]
        )["m2"]
        assert status.get("eventsOut") == total, status
        assert status.get("heartbeatsOut", 0) > 0, status
        assert heartbeat_topic not in status.get("deliveredSeq", {}), status

        def mm2_metrics_complete() -> bool:
            found = samples(target)
            pair = {"source": "m1", "target": "m2", "topic": source_topic}
            names = [
                "kdsync_mirror_replication_latency_ms",
                "kdsync_mirror_replication_latency_ms_max",
                "kdsync_mirror_replication_latency_ms_avg",
                "kdsync_mirror_byte_rate",
            ]
            count = labelled(found, "kdsync_mirror_record_count_total", **pair)
            own = {"topic": source_topic}
            lag = labelled(found, "kdsync_mirror_record_lag", topic=source_topic, partition="0")
            return (
                all(labelled(found, n, **pair) is not None for n in names)
                and count == counts["m1"]
                and all(
                    labelled(found, n, **own) is not None
                    for n in (
                        "kdsync_mirror_record_age_ms",
                        "kdsync_mirror_record_age_ms_max",
                        "kdsync_mirror_record_age_ms_avg",
                    )
                )
                and lag == 0
            )

        wait_for(
            "every MM2-named metric on m2's /metrics",
            mm2_metrics_complete,
            30,
            lambda: str({k: v for k, v in samples(target).items() if "mirror" in k}),
        )
    finally:
        watch.close()
