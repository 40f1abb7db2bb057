"""Events of several MiB from every origin at once (under every limit on the way: the
T-global takes 8 MiB) arrive in every member exactly once and in one order. Before the
Forward was bounded in bytes, a follower offering a burst of them sent up to 16 in one
peer message, over the 64 MiB frame limit, and stopped (FrameTooLarge)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType

from kdsync import naming
from kdsync.local_group import LocalSidecarGroup
from tests.integration.sidecar.harness import verify_group

pytestmark = pytest.mark.kafka

EVENT_BYTES = 6 * 1024 * 1024
EVENTS_PER_ORIGIN = 24
_LIMIT = 8 * 1024 * 1024


def _allow_large(servers: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": servers})
    set_op = AlterConfigOpType.SET
    entry = ConfigEntry("max.message.bytes", str(_LIMIT), incremental_operation=set_op)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def _burst(servers: str, topic: str, origin: str, errors: list[object]) -> None:
    producer = Producer(
        {"bootstrap.servers": servers, "message.max.bytes": _LIMIT, "linger.ms": 50}
    )
    for i in range(EVENTS_PER_ORIGIN):
        value = f"{origin}-{i}:".encode() + bytes(EVENT_BYTES)
        producer.produce(
            topic,
            key=f"{origin}-{i}".encode(),
            value=value,
            on_delivery=lambda error, _m: errors.append(error) if error else None,
        )
        producer.poll(0)
    if producer.flush(120) != 0:
        errors.append(f"{origin}: not all delivered to the source")


def test_a_burst_of_multi_mib_events_from_every_origin_arrives_once_everywhere(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    global_topic = naming.global_topic(source_topic)
    for servers in bootstrap.values():
        _allow_large(servers, source_topic)
    group = sidecar_group("large", bootstrap, source_topic)
    group.start()
    group.wait_ready(timeout=90)

    errors: list[object] = []
    producers = [
        threading.Thread(target=_burst, args=(servers, source_topic, origin, errors))
        for origin, servers in bootstrap.items()
    ]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join()
    assert not errors, errors

    produced = {origin: EVENTS_PER_ORIGIN for origin in bootstrap}
    verify_group(group, bootstrap, source_topic, global_topic, produced, timeout=240)
    for name in bootstrap:
        status = group.status(name) or {}
        assert status.get("phase") == "running" and status.get("fatal") is None, (name, status)
