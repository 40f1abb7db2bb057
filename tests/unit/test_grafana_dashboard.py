"""The chart's Grafana dashboard asks only for what the sidecar exports.

Every query is parsed with Prometheus' grammar (promql-parser); every metric it reads
must be one the sidecar registers, and every label it groups or matches by must be one
those metrics carry or one the ServiceMonitor's scrape adds. A renamed metric or label
breaks this test instead of leaving an empty panel in someone's Grafana.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from prometheus_client.metrics import MetricWrapperBase

from kdsync.runtime.metrics import SidecarMetrics
from kdsync.runtime.mirror_metrics import MirrorMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "charts/kdsync-operator/dashboards/kdsync.json"
# Labels the scrape adds: the ServiceMonitor's targetLabels (kdsync.io/group) and
# Prometheus' own target labels.
SCRAPE_LABELS = {"kdsync_io_group", "pod", "namespace", "service", "instance", "job"}
# Series Prometheus makes itself.
BUILTIN_SERIES = {"up": set[str]()}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def _exported() -> dict[str, set[str]]:
    """Series name -> its label names, for every metric the sidecar registers."""
    metrics = SidecarMetrics()
    mirror = MirrorMetrics(metrics.registry, "m1", "kdsync-heartbeats")
    series = dict(BUILTIN_SERIES)
    for holder in (metrics, mirror):
        for metric in vars(holder).values():
            if isinstance(metric, MetricWrapperBase):
                # prometheus_client keeps a metric's name and label names in these fields.
                for suffix in SUFFIXES[str(metric._type)]:
                    series[metric._name + suffix] = set(metric._labelnames)
    return series


def _queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def _walk(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, promql_parser.MatrixSelector):
        yield from _walk(node.vector_selector)
    for field in ("expr", "lhs", "rhs", "param"):
        child = getattr(node, field, None)
        if isinstance(child, promql_parser.Expr):
            yield from _walk(child)
    for arg in getattr(node, "args", None) or []:
        yield from _walk(arg)


def test_the_dashboard_has_latency_lag_and_throughput_panels_per_pair() -> None:
    titles = " / ".join(title for title, _ in _queries()).lower()
    for wanted in ("latency per pair", "throughput per pair", "events behind"):
        assert wanted in titles, titles


@pytest.mark.parametrize(("title", "expr"), _queries())
def test_each_query_reads_exported_series_by_their_labels(title: str, expr: str) -> None:
    exported = _exported()
    tree = promql_parser.parse(expr)
    nodes = list(_walk(tree))
    selectors = [n for n in nodes if isinstance(n, promql_parser.VectorSelector)]
    assert selectors, f"{title}: no series read"
    available = set(SCRAPE_LABELS)
    for selector in selectors:
        assert selector.name in exported, f"{title}: {selector.name} is not exported"
        available |= exported[selector.name]
        for matcher in selector.matchers.matchers:
            assert matcher.name in available, f"{title}: no label {matcher.name}"
    for node in nodes:
        modifier = getattr(node, "modifier", None)
        labels = getattr(modifier, "labels", None) or getattr(modifier, "matching", None)
        names = getattr(labels, "labels", labels) or []
        unknown = set(names) - available
        assert not unknown, f"{title}: grouped by labels no series has: {unknown}"
