"""An event larger than kdsync carries (#16, bad input: events over every size limit).

A source topic whose max.message.bytes was raised past kdsync's per-event limit (32 MiB)
can hold an event no peer frame or ordering-log record can carry. Before, the member that
read it failed with FrameTooLarge (or could not store its ordering log) and failed again
at every restart. Now that source partition stops at the event with a reason on /status
and one ERROR line; the sidecar keeps running and everything else is replicated. (Events
above the T-global's own limit, 8 MiB by default, halt delivery instead:
test_halt_too_large.)
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType

from kdsync import naming
from kdsync.kafka.source_reader import MAX_EVENT_BYTES
from kdsync.local_group import LocalSidecarGroup
from tests.integration.sidecar.harness import (
    Traffic,
    brief_status,
    start_with_traffic,
    wait_for,
    wait_for_exactly,
)

pytestmark = pytest.mark.kafka

_SOURCE_LIMIT = 64 * 1024 * 1024


def _raise_source_limit(servers: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": servers})
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(
                "max.message.bytes", str(_SOURCE_LIMIT), incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def _produce_huge(servers: str, topic: str) -> int:
    """Writes one event just over kdsync's limit to partition 0; returns its offset."""
    producer = Producer({"bootstrap.servers": servers, "message.max.bytes": _SOURCE_LIMIT})
    offsets: list[int] = []
    errors: list[object] = []

    def delivered(error: object, message: object) -> None:
        if error:
            errors.append(error)
        else:
            offsets.append(message.offset())  # type: ignore[attr-defined]

    producer.produce(
        topic,
        key=b"the-huge-one",
        value=b"h" * (MAX_EVENT_BYTES + 1),
        partition=0,
        on_delivery=delivered,
    )
    assert producer.flush(60) == 0 and not errors and offsets, errors
    return offsets[0]


def test_an_event_over_the_limit_stops_its_partition_and_nothing_else(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    global_topic = naming.global_topic(source_topic)
    group = sidecar_group("overlimit", bootstrap, source_topic)
    before = start_with_traffic(group, bootstrap, source_topic, 200)

    _raise_source_limit(bootstrap["m1"], source_topic)
    offset = _produce_huge(bootstrap["m1"], source_topic)

    wait_for(
        "m1 to stop reading the partition with the huge event",
        lambda: bool((group.status("m1") or {}).get("stoppedSources")),
        timeout=90,
        describe=lambda: brief_status(group),
    )
    status = group.status("m1") or {}
    assert status.get("fatal") is None, status.get("fatal")
    [(where, reason)] = status["stoppedSources"].items()
    assert where == f"{source_topic}[0]", where
    assert f"offset {offset}" in reason and "Fix:" in reason, reason
    errors = [line for line in group.log_tail("m1", 400).splitlines() if " ERROR " in line]
    assert [e for e in errors if "kdsync carries per event" in e], errors
    assert not [e for e in errors if "sidecar stopping" in e], errors

    # The group goes on: new events from every other origin reach every member once.
    others = {m: bootstrap[m] for m in ("m2", "m3")}
    later = Traffic(others, source_topic, count_per_origin=50).start().join()
    expected = sum(before.values()) + sum(later.values())
    _wait_for_every_global(group, bootstrap, global_topic, expected)
    assert (group.status("m1") or {}).get("phase") == "running", brief_status(group)

    # The way on that the message gives: delete the event at the source, restart the
    # sidecar. It reads on after the event; no member ever has the event.
    _delete_through(bootstrap["m1"], source_topic, offset)
    group.stop("m1")
    group.start_member("m1")
    group.wait_ready(timeout=90)
    after = Traffic({"m1": bootstrap["m1"]}, source_topic, count_per_origin=40).start().join()
    _wait_for_every_global(group, bootstrap, global_topic, expected + after["m1"])
    assert not (group.status("m1") or {}).get("stoppedSources"), brief_status(group)


def _delete_through(servers: str, topic: str, offset: int) -> None:
    admin = AdminClient({"bootstrap.servers": servers})
    [future] = admin.delete_records([TopicPartition(topic, 0, offset + 1)]).values()
    future.result(timeout=30)


def _wait_for_every_global(
    group: LocalSidecarGroup, bootstrap: dict[str, str], global_topic: str, expected: int
) -> None:
    """Every member's T-global holds exactly ``expected`` events, the huge one not among
    them."""
    watch = wait_for_exactly(group, bootstrap, global_topic, expected)
    for member, follower in watch.followers.items():
        assert not [r for _, _, r in follower.records if r.key == b"the-huge-one"], member
