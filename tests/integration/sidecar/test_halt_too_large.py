"""An event too large for one destination (issue #4, third "Must show"): that member
halts with a clear condition and metric, the others carry on, nothing is lost or
skipped, and it resumes by itself once the topic's limit is raised. While halted it
keeps ordering in bounded memory (issue #13): what it cannot write waits in its own
ordering log, not in memory."""

from __future__ import annotations

import os
import threading
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
    BIG_VALUE_BYTES,
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


def _start_with_small_limit_at_m3(
    group: LocalSidecarGroup, bootstrap: dict[str, str], source_topic: str
) -> tuple[LocalSidecarGroup, str, GlobalWatch]:
    """m3's cluster has a T-global that refuses records over 200 kB (an operator's choice
    kdsync respects: a smaller max.message.bytes is reported as drift, never changed)."""
    global_topic = naming.global_topic(source_topic)
    create_topic(bootstrap["m3"], global_topic, 1, {"max.message.bytes": str(SMALL_LIMIT)})
    group.start()
    group.wait_ready(timeout=90)
    return group, global_topic, GlobalWatch(bootstrap, global_topic)


def test_event_too_large_for_one_destination_halts_that_member_until_raised(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    group, global_topic, watch = _start_with_small_limit_at_m3(
        sidecar_group("toolarge", bootstrap, source_topic), bootstrap, source_topic
    )

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
    _raise_limit(bootstrap["m3"], global_topic)
    verify_group(group, bootstrap, source_topic, global_topic, produced, watch=watch)
    group.wait_until("m3 to resume", lambda s: s.get("halted") is None, 30, names=["m3"])
    group.wait_ready(timeout=60)
    _, metrics = http_get(http, "/metrics")
    assert 'kdsync_delivery_halted{reason="record_too_large"} 1.0' not in metrics
    watch.close()


def _raise_limit(bootstrap: str, global_topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
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


MIB = 1024 * 1024
MAX_LOG_BYTES = 2 * MIB  # committed entries kept in memory
MAX_UNCOMMITTED_BYTES = 2 * MIB  # uncommitted ones a leader admits
MAX_APPLY_BYTES = MIB
# Entries read back from the ordering log for a lagging peer or its own applying: a
# quarter of maxLogBytes at a time, for each of the 2 peers and itself. Each bound may be
# crossed by one entry (a batch is at most maxBatchBytes, 1 MiB by default).
READ_BACK_BYTES = 3 * (MAX_LOG_BYTES // 4 + MIB)
BOUND_BYTES = MAX_LOG_BYTES + MAX_UNCOMMITTED_BYTES + READ_BACK_BYTES + 2 * MIB


class _PeakMemory:
    """Follows one member's logMemoryBytes in /status until stopped."""

    def __init__(self, group: LocalSidecarGroup, member: str) -> None:
        self.peak = 0
        self.samples = 0
        self._group = group
        self._member = member
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            status = self._group.status(self._member) or {}
            if "logMemoryBytes" in status:
                self.peak = max(self.peak, int(status["logMemoryBytes"]))
                self.samples += 1

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        return self.peak


def test_a_halted_member_orders_on_in_bounded_memory_and_catches_up_from_its_log(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    ordering = {
        "tickMs": 20,
        "maxLogBytes": MAX_LOG_BYTES,
        "maxUncommittedBytes": MAX_UNCOMMITTED_BYTES,
        "maxApplyBytes": MAX_APPLY_BYTES,
    }
    group, global_topic, watch = _start_with_small_limit_at_m3(
        sidecar_group("halt-memory", bootstrap, source_topic, ordering=ordering),
        bootstrap,
        source_topic,
    )

    _produce_one(bootstrap["m1"], source_topic, os.urandom(BIG_EVENT_BYTES))
    group.wait_until("m3 to report a halt", lambda s: bool(s.get("halted")), 60, names=["m3"])
    # Far more than the bound while m3 is halted: every 25th event is ~900 KiB, so each
    # origin sends about 36 MiB that m3 orders but cannot write.
    peak = _PeakMemory(group, "m3")
    traffic = Traffic(bootstrap, source_topic, count_per_origin=1000, big_every=25)
    after = traffic.start().join()
    total = sum(after.values()) + 1
    wait_for(
        "m1 and m2 to deliver every event",
        lambda: watch.count("m1") >= total and watch.count("m2") >= total,
        180,
        lambda: brief_status(group),
    )
    status = group.status("m3") or {}
    assert status.get("halted"), brief_status(group)
    assert status["commitIndex"] - status["appliedIndex"] > 100, status
    held = peak.stop()
    ordered_bytes = 3 * 40 * BIG_VALUE_BYTES
    assert peak.samples > 10, peak.samples
    print(f"halted m3: at most {held} bytes of log in memory ({peak.samples} samples)")
    assert 0 < held <= BOUND_BYTES < ordered_bytes // 5, (held, ordered_bytes)
    _, metrics = http_get(group.members["m3"].http, "/metrics")
    assert "kdsync_log_memory_bytes" in metrics

    # Raised: m3 writes what it ordered while halted, read back from its ordering log,
    # and its T-global ends identical to the others'.
    _raise_limit(bootstrap["m3"], global_topic)
    produced = {m: after[m] + (1 if m == "m1" else 0) for m in bootstrap}
    verify_group(group, bootstrap, source_topic, global_topic, produced, watch=watch, timeout=240)
    group.wait_until("m3 to resume", lambda s: s.get("halted") is None, 30, names=["m3"])
    watch.close()
