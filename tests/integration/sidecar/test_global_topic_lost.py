"""A member's T-global deleted and recreated under a running group (#16, bad input).

The recreated topic is empty, but the member's ledger says it has committed N events to
it. Writing on would give that member's consumers a topic whose history starts at
``kdsync.seq`` N: a silent hole. The sidecar instead halts delivery to it with the reason
on /status, in the metrics and in one ERROR line, the other members go on, and once the
topic is restored (here: copied from another member's T-global up to what the halted
member had committed) delivery resumes by itself and every T-global ends identical.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from kdsync import naming
from kdsync.local_group import LocalSidecarGroup
from kdsync.record_format import SEQ_HEADER
from tests.integration.sidecar.harness import (
    GlobalWatch,
    Traffic,
    brief_status,
    http_get,
    start_with_traffic,
    verify_group,
    wait_for,
)
from tests.support.plain_kafka import create_topic, read_committed

pytestmark = pytest.mark.kafka


def _recreate_empty(servers: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": servers})
    admin.delete_topics([topic], operation_timeout=60)[topic].result(timeout=60)

    def created() -> bool:
        try:  # refused while the deletion is still being carried out
            create_topic(servers, topic, 1)
        except KafkaException:
            return False
        return True

    wait_for(f"{topic} to be created again", created, timeout=90, interval=1.0)


def _halted(group: LocalSidecarGroup, member: str) -> str:
    return str((group.status(member) or {}).get("halted") or "")


def _copy_up_to(source: str, destination: str, topic: str, last_seq: int) -> int:
    """Copy ``topic``'s records with ``kdsync.seq`` <= ``last_seq`` from one cluster to
    another, keys, values, headers and timestamps as they are: the restore a user does."""
    records = [
        r
        for r in read_committed(source, topic, timeout=60)
        if int(dict(r.headers)[SEQ_HEADER] or b"-1") <= last_seq
    ]
    producer = Producer({"bootstrap.servers": destination, "acks": "all"})
    for r in records:
        producer.produce(
            topic,
            value=r.value,
            key=r.key,
            partition=r.partition,
            timestamp=r.timestamp,
            headers=list(r.headers),
        )
    assert producer.flush(60) == 0
    return len(records)


def test_a_lost_global_topic_halts_that_member_until_restored(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    global_topic = naming.global_topic(source_topic)
    group = sidecar_group("lost-global", bootstrap, source_topic)
    before = start_with_traffic(group, bootstrap, source_topic, 200)

    _recreate_empty(bootstrap["m2"], global_topic)
    during = Traffic(bootstrap, source_topic, count_per_origin=50).start().join()
    wait_for(
        "m2 to halt delivery to its recreated T-global",
        lambda: global_topic in _halted(group, "m2"),
        timeout=120,
        describe=lambda: brief_status(group),
    )
    reason = _halted(group, "m2")
    assert "deleted" in reason and "Fix:" in reason, reason
    status_code, metrics = http_get(group.members["m2"].http, "/metrics")
    assert status_code == 200
    assert 'kdsync_delivery_halted{reason="global_topic_lost"} 1.0' in metrics
    errors = [line for line in group.log_tail("m2", 400).splitlines() if " ERROR " in line]
    assert any(global_topic in e and "halted" in e for e in errors), errors

    # The others deliver everything meanwhile; m2 writes nothing more into the holed topic.
    expected = sum(before.values()) + sum(during.values())
    others = [m for m in bootstrap if m != "m2"]
    watch = GlobalWatch({m: bootstrap[m] for m in others}, global_topic)
    try:
        wait_for(
            f"{expected} events in the other members' {global_topic}",
            lambda: all(watch.count(m) >= expected for m in others),
            timeout=120,
            describe=lambda: brief_status(group),
        )
    finally:
        watch.close()
    in_holed_topic = len(read_committed(bootstrap["m2"], global_topic))
    assert in_holed_topic < expected
    assert global_topic in _halted(group, "m2")

    # Restore: a fresh T-global with every event up to what m2's ledger says it committed.
    committed = int((group.status("m2") or {})["deliveredSeq"][source_topic])
    _recreate_empty(bootstrap["m2"], global_topic)
    copied = _copy_up_to(bootstrap["m1"], bootstrap["m2"], global_topic, committed)
    assert copied == committed + 1
    wait_for(
        "m2 to resume delivery",
        lambda: not _halted(group, "m2"),
        timeout=120,
        describe=lambda: brief_status(group),
    )
    produced = {m: before[m] + during[m] for m in before}
    verify_group(group, bootstrap, source_topic, global_topic, produced)
