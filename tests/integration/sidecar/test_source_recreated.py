"""A source topic deleted and recreated under a running group (#16, bad input).

The recreated topic's offsets start again at 0, below the positions kdsync has already
replicated. Reading it from its start would hand the group records at offsets it has
seen, which the ordering core drops as duplicates: silent loss. The sidecar instead stops
reading those partitions, says why on /status, in ``kdsync status`` and in one ERROR line
per partition, and keeps replicating everything else. The new records stay in the topic.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from kdsync import naming
from kdsync.local_group import LocalSidecarGroup
from kdsync.runtime.status_report import render
from tests.integration.sidecar.harness import (
    PARTITIONS,
    Traffic,
    brief_status,
    start_with_traffic,
    wait_for,
    wait_for_exactly,
)
from tests.support.plain_kafka import create_topic

pytestmark = pytest.mark.kafka


def _recreate(servers: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": servers})
    admin.delete_topics([topic], operation_timeout=60)[topic].result(timeout=60)

    def created() -> bool:
        try:  # refused while the deletion is still being carried out
            create_topic(servers, topic, PARTITIONS)
        except KafkaException:
            return False
        return True

    wait_for(f"{topic} to be created again", created, timeout=90, interval=1.0)


def test_a_recreated_source_topic_is_stopped_not_taken_for_duplicates(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    global_topic = naming.global_topic(source_topic)
    group = sidecar_group("recreated", bootstrap, source_topic)
    before = start_with_traffic(group, bootstrap, source_topic, 300)

    _recreate(bootstrap["m1"], source_topic)
    Traffic({"m1": bootstrap["m1"]}, source_topic, count_per_origin=30).start().join()

    def every_partition_stopped() -> bool:
        stopped = (group.status("m1") or {}).get("stoppedSources") or {}
        return len(stopped) == PARTITIONS

    wait_for(
        "m1 to stop reading the recreated partitions",
        every_partition_stopped,
        timeout=120,
        describe=lambda: brief_status(group),
    )
    status = group.status("m1") or {}
    for reason in status["stoppedSources"].values():
        assert "recreated" in reason and "Fix:" in reason, reason
    assert "SOURCE STOPPED" in render([{**status, "url": "m1"}])
    errors = [line for line in group.log_tail("m1", 400).splitlines() if " ERROR " in line]
    assert len([e for e in errors if "stops reading this partition" in e]) == PARTITIONS, errors
    # Only the source is affected: m1's own T-global was never taken for a lost one.
    assert not [e for e in errors if "delivery halted" in e], errors

    # Everything else goes on: m2's new events reach both members, exactly once, and
    # none of m1's new records was taken in (nor any old one lost).
    later = Traffic({"m2": bootstrap["m2"]}, source_topic, count_per_origin=50).start().join()
    expected = sum(before.values()) + later["m2"]
    wait_for_exactly(group, bootstrap, global_topic, expected)
