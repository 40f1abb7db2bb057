"""The sidecar's per-member series end with the member: a removed member leaves none
behind on /metrics (a link shown down for good, or a heartbeat counter that stopped,
would keep an alert firing)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kdsync.runtime.metrics import SidecarMetrics
from kdsync.runtime.mirror_metrics import MirrorMetrics

# kdsync_member_info and the mirror metrics' target label name this sidecar itself.
_OWN = "m1"
_NAMING = ("member", "peer", "source", "target")
HEARTBEATS = "kdsync-g.heartbeats"


def _per_member(metrics: SidecarMetrics) -> list[Gauge | Counter]:
    """Every SidecarMetrics metric with a label that names a member: new ones are found
    here."""
    found = [
        value
        for value in vars(metrics).values()
        if isinstance(value, Gauge | Counter)
        and {"member", "peer"} & set(value._labelnames)
        and value is not metrics.info
    ]
    assert found, "no per-member metric found: the test would check nothing"
    return found


def _set_for(metric: Gauge | Counter, member: str) -> None:
    labels = {name: member if name in ("member", "peer") else "out" for name in metric._labelnames}
    child = metric.labels(**labels)
    if isinstance(child, Gauge):
        child.set(1)
    else:
        child.inc()
    if "direction" in labels:
        metric.labels(**{**labels, "direction": "in"})


def _members_named(metrics: SidecarMetrics) -> set[str]:
    """Every member named by any series of the registry (whoever declared it), this
    sidecar itself left out."""
    text = generate_latest(metrics.registry).decode()
    return {
        value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        for name, value in sample.labels.items()
        if name in _NAMING and value != _OWN
    }


def _removed(metrics: SidecarMetrics, mirror: MirrorMetrics, member: str) -> None:
    """What the sidecar does once ``member``'s removal is committed."""
    metrics.forget_member(member)
    mirror.forget_source(member)


def test_a_removed_member_leaves_no_series_and_the_others_keep_theirs() -> None:
    metrics = SidecarMetrics()
    mirror = MirrorMetrics(metrics.registry, _OWN, HEARTBEATS)
    metrics.info.labels("g", _OWN, "false").set(1)
    for member in ("m2", "m3"):
        for metric in _per_member(metrics):
            _set_for(metric, member)
        for topic in ("orders", HEARTBEATS):
            mirror.replicated(member, topic, [12.0, 15.0], [100, 200], now=1000.0)
        mirror.replicated(member, "payments", [], [50], now=1000.0)  # no latency series
    assert _members_named(metrics) == {"m2", "m3"}

    _removed(metrics, mirror, "m2")

    assert _members_named(metrics) == {"m3"}
    _removed(metrics, mirror, "m2")  # again, or one never seen: no error
    _removed(metrics, mirror, "m9")
    assert _members_named(metrics) == {"m3"}
    # Its last batches, ordered before its removal and applied after it, bring nothing
    # back (an alert on its heartbeats would fire for a member that is gone).
    mirror.replicated("m2", HEARTBEATS, [20.0], [10], now=1001.0)
    mirror.members_in_force(["m1", "m3"])
    mirror.replicated("m2", "orders", [20.0], [10], now=1001.0)
    assert _members_named(metrics) == {"m3"}
    # A member added back starts its series afresh.
    mirror.members_in_force(["m1", "m2", "m3"])
    mirror.replicated("m2", "orders", [20.0], [10], now=1002.0)
    assert _members_named(metrics) == {"m2", "m3"}
