"""Three clusters, three sidecars, concurrent producers: every ``T-global`` identical,
every event exactly once, origin order and fidelity kept (issue #4, first "Must show")."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from kdsync import naming
from kdsync.local_group import LocalSidecarGroup
from tests.integration.sidecar.harness import Traffic, latency_figures, verify_group

pytestmark = pytest.mark.kafka


def test_three_clusters_concurrent_traffic_identical_exactly_once(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    """Keys, null keys, tombstones, headers (duplicate names, None values), binary values
    and ~900 KiB events, written concurrently into 3 partitions of every origin; with
    ``globalPartitions: 3`` (the documented rule: origin partition mod P)."""
    group = sidecar_group("basic", bootstrap, source_topic, global_partitions=3)
    group.start()
    group.wait_ready(timeout=90)
    started = time.monotonic()
    # Every 500th event is ~900 KiB: 4 per origin.
    traffic = Traffic(bootstrap, source_topic, count_per_origin=2000, big_every=500).start()
    produced = traffic.join()
    assert all(count == 2000 for count in produced.values())
    result = verify_group(
        group,
        bootstrap,
        source_topic,
        naming.global_topic(source_topic),
        produced,
        global_partitions=3,
    )
    elapsed = time.monotonic() - started
    print(
        f"\n{result.events} events replicated to 3 clusters in {elapsed:.1f}s "
        f"({result.events / elapsed:.0f} events/s end to end); "
        f"{latency_figures(group, list(bootstrap))}"
    )
