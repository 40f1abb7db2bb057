"""The batch histogram exposes exactly what prometheus_client's own Histogram would."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from kdsync.runtime.bulk_histogram import BulkHistogram

BUCKETS = (0.002, 0.005, 0.01, 0.5, 1.0, 300.0)
# Values on the bounds too: a value equal to a bound belongs in that bound's bucket.
VALUES = st.one_of(
    st.sampled_from(BUCKETS),
    st.floats(min_value=0.0, max_value=1000.0, allow_nan=False),
)


def _exposition(batches: list[list[float]], bulk: bool) -> str:
    registry = CollectorRegistry()
    if bulk:
        histogram = BulkHistogram("latency_seconds", "help", BUCKETS, registry)
        for batch in batches:
            histogram.observe_many(batch)
    else:
        reference = Histogram("latency_seconds", "help", buckets=BUCKETS, registry=registry)
        for batch in batches:
            for value in batch:
                reference.observe(value)
    lines = generate_latest(registry).decode().splitlines()
    # prometheus_client's own histogram adds a _created series; the rest must be identical.
    return "\n".join(line for line in lines if "_created" not in line)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(VALUES, max_size=20), max_size=6))
def test_same_series_as_prometheus_histogram(batches: list[list[float]]) -> None:
    assert _exposition(batches, bulk=True) == _exposition(batches, bulk=False)


def test_buckets_must_be_finite_bounds() -> None:
    with pytest.raises(ValueError, match="finite upper bounds"):
        BulkHistogram("x_seconds", "help", (0.1, float("inf")), CollectorRegistry())
