"""An event too large for one destination (issue #4, third "Must show"): that member
halts with a clear condition and metric, the others carry on, nothing is lost or
skipped, and it resumes by itself once the topic's limit is raised."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType

from kdsync import naming
from kdsync.local_group import LocalSidecarGroup
from kdsync.verification.replica_check import global_order
from tests.integration.sidecar.harness import (
    GlobalWatch,
    Traffic,
    brief_status,
    http_get,
    verify_group,
    wait_for,
)
from tests.support.plain_kafka import create_topic

pytestmark = pytest.mark.kafka

SMALL_LIMIT = 200_000
BIG_EVENT_BYTES = 500_000


def _produce_one(bootstrap: str, topic: str, value: bytes) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    errors: list[object] = []
    producer.produce(
        topic,
        key=b"the-big-one",
        value=value,
        partition=0,
        headers=[("size", str(len(value)).encode())],
        on_delivery=lambda error, _m: errors.append(error) if error else None,
    )
    assert producer.flush(60) == 0 and not errors, errors


def test_event_too_large_for_one_destination_halts_that_member_until_raised(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    global_topic = naming.global_topic(source_topic)
    # m3's cluster has a T-global that refuses records over 200 kB (an operator's choice
    # kdsync respects: a smaller max.message.bytes is reported as drift, never changed).
    create_topic(bootstrap["m3"], global_topic, 1, {"max.message.bytes": str(SMALL_LIMIT)})
    group = sidecar_group("toolarge", bootstrap, source_topic)
    group.start()
    group.wait_ready(timeout=90)
    watch = GlobalWatch(bootstrap, global_topic)

    before = Traffic(bootstrap, source_topic, count_per_origin=300).start().join()
    _produce_one(bootstrap["m1"], source_topic, os.urandom(BIG_EVENT_BYTES))
    after = Traffic(bootstrap, source_topic, count_per_origin=300).start().join()
    produced = {m: before[m] + after[m] + (1 if m == "m1" else 0) for m in bootstrap}
    total = sum(produced.values())

    # The members whose T-global accepts it have everything, the big event included.
    wait_for(
        "m1 and m2 to deliver every event",
        lambda: watch.count("m1") >= total and watch.count("m2") >= total,
        90,
        lambda: brief_status(group),
    )
    # m3 halts and says why and what to do.
    statuses = group.wait_until(
        "m3 to report a halt", lambda s: bool(s.get("halted")), 60, names=["m3"]
    )
    halted = statuses["m3"]["halted"]
    assert global_topic in halted and "max.message.bytes" in halted and "Fix" in halted, halted
    assert "nothing is skipped" in halted, halted
    assert statuses["m3"]["ready"] is False
    http = group.members["m3"].http
    code, _ = http_get(http, "/readyz")
    assert code == 503
    _, metrics = http_get(http, "/metrics")
    assert 'kdsync_delivery_halted{reason="record_too_large"} 1.0' in metrics, [
        line for line in metrics.splitlines() if "halted" in line
    ]
    for member in ("m1", "m2"):
        assert (group.status(member) or {}).get("halted") is None

    # Nothing skipped: m3's T-global is a prefix of m1's that ends before the big event.
    watch.count("m3")
    reference = global_order(watch.followers["m1"].records)
    big_seq = next(r.seq for r in reference if r.record.key == b"the-big-one")
    mine = global_order(watch.followers["m3"].records)
    assert len(mine) <= big_seq
    assert mine == reference[: len(mine)]

    # Raise the limit: delivery resumes by itself and m3 catches up.
    admin = AdminClient({"bootstrap.servers": bootstrap["m3"]})
    resource = ConfigResource(
        ResourceType.TOPIC,
        global_topic,
        incremental_configs=[
            ConfigEntry(
                "max.message.bytes",
                str(8 * 1024 * 1024),
                incremental_operation=AlterConfigOpType.SET,
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    verify_group(group, bootstrap, source_topic, global_topic, produced, watch=watch)
    group.wait_until("m3 to resume", lambda s: s.get("halted") is None, 30, names=["m3"])
    group.wait_ready(timeout=60)
    _, metrics = http_get(http, "/metrics")
    assert 'kdsync_delivery_halted{reason="record_too_large"} 1.0' not in metrics
    watch.close()
