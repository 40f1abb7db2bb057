"""The sidecar's per-member series end with the member: a removed member leaves none
behind on /metrics (a link shown down for good would keep an alert firing)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kdsync.runtime.metrics import SidecarMetrics

# kdsync_member_info names this sidecar itself, not a peer.
_OWN = {"kdsync_member_info"}


def _per_member(metrics: SidecarMetrics) -> list[Gauge | Counter]:
    """Every metric with a label that names another member: new ones are found here."""
    found = [
        value
        for value in vars(metrics).values()
        if isinstance(value, Gauge | Counter)
        and {"member", "peer"} & set(value._labelnames)
        and value._name not in _OWN
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
    text = generate_latest(metrics.registry).decode()
    return {
        value
        for family in text_string_to_metric_families(text)
        if family.name not in _OWN
        for sample in family.samples
        for name, value in sample.labels.items()
        if name in ("member", "peer")
    }


def test_a_removed_member_leaves_no_series_and_the_others_keep_theirs() -> None:
    metrics = SidecarMetrics()
    metrics.info.labels("g", "m1", "false").set(1)
    for metric in _per_member(metrics):
        _set_for(metric, "m2")
        _set_for(metric, "m3")
    assert _members_named(metrics) == {"m2", "m3"}

    metrics.forget_member("m2")

    assert _members_named(metrics) == {"m3"}
    metrics.forget_member("m2")  # again, or one never seen: no error
    metrics.forget_member("m9")
    assert _members_named(metrics) == {"m3"}
