"""Three sidecars ordering over RDMA (Soft-RoCE), checked by the independent checker.

It runs inside the ``hack/rdma-vm`` guest, started by ``test_rdma_vm.py``, which runs the
Kafka brokers on the host, creates the topics and passes their addresses in
``KDSYNC_RDMA_TEST_KAFKA``. Elsewhere it skips.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from kdsync import naming
from kdsync.local_group import LocalSidecarGroup
from kdsync.transport.address import parse_address
from kdsync.verification.traffic import Traffic
from tests.integration.sidecar.harness import GlobalWatch, brief_status, verify_group, wait_for
from tests.support.tcp_forward import forwarded

KAFKA = os.environ.get("KDSYNC_RDMA_TEST_KAFKA")
TOPIC = os.environ.get("KDSYNC_RDMA_TEST_TOPIC", "")

pytestmark = pytest.mark.skipif(
    not (KAFKA and os.environ.get("KDSYNC_VM")),
    reason="runs inside hack/rdma-vm with the host's Kafka (test_rdma_vm.py starts it)",
)


def test_three_members_replicate_over_rdma_through_a_sigkill_and_the_checker_passes(
    tmp_path: Path,
) -> None:
    """The group orders over queue pairs; m2 is SIGKILLed mid-traffic (its queue pairs
    vanish with it, mid-frame or not), restarts and links up over RDMA again; every
    T-global ends identical and exactly once."""
    assert KAFKA is not None
    bootstrap: dict[str, str] = json.loads(KAFKA)
    ports = [parse_address(servers)[1] for servers in bootstrap.values()]
    with (
        forwarded(ports, os.environ["KDSYNC_VM_HOST"]),
        LocalSidecarGroup(
            # A fresh name: a guest boots with the same pids every time.
            f"rdma-{uuid.uuid4().hex[:8]}",
            bootstrap,
            tmp_path / "group",
            topics={"names": [TOPIC]},
            ordering={"tickMs": 50},
            transport={"type": "rdma", "rdma": {"device": os.environ["KDSYNC_VM_RDMA_DEVICE"]}},
        ) as group,
    ):
        try:
            run_group(group, bootstrap)
        except BaseException:
            kept = os.environ.get("KDSYNC_VM_OUT")
            for name in group.members:  # the guest's files are gone after it stops
                print(f"\n--- sidecar {name}, log tail\n{group.log_tail(name, 120)}")
                if kept:  # whole logs, on the host (hack/rdma-vm --out)
                    shutil.copy(group.members[name].log_path, Path(kept) / f"sidecar-{name}.log")
            raise


def run_group(group: LocalSidecarGroup, bootstrap: dict[str, str]) -> None:
    group.start()
    group.wait_ready(timeout=240)

    def all_links_rdma() -> bool:
        for name in group.members:
            transport = (group.status(name) or {}).get("transport", {})
            others = sorted(set(group.members) - {name})
            if transport.get("rdmaTo") != others or transport.get("rdmaFrom") != others:
                return False
        return True

    wait_for("every link to run over RDMA", all_links_rdma, 120, lambda: brief_status(group))
    global_topic = naming.global_topic(TOPIC)
    watch = GlobalWatch(bootstrap, global_topic)
    # 400 events per origin over 20 s, every 150th ~900 KiB (15 messages of 64 KiB):
    # enough to kill m2 mid-traffic, little enough for an emulated CPU to catch up.
    traffic = Traffic(
        bootstrap, TOPIC, count_per_origin=400, rate_per_origin=20, big_every=150
    ).start()
    try:
        grows(watch, group, ["m1", "m2", "m3"], 60)
        group.kill("m2")
        grows(watch, group, ["m1", "m3"], 60)
        group.start_member("m2")
        group.wait_ready(timeout=240, names=["m2"])
        wait_for("m2 to link up over RDMA again", all_links_rdma, 120, lambda: brief_status(group))
    finally:
        produced = traffic.join()
    result = verify_group(group, bootstrap, TOPIC, global_topic, produced, timeout=300, watch=watch)
    watch.close()
    assert result.events == sum(produced.values())
    # An emulated CPU under load can miss /status's 2 s timeout: poll with a deadline.
    statuses = group.wait_until("every member's /status", lambda s: "transport" in s, 120)
    for name in group.members:
        status = statuses[name]
        assert status["transport"]["type"] == "rdma", status
        assert status["transport"]["fallbackReason"] is None
        assert "rxe" in status["transport"]["device"]
    print(f"\nreplicated over RDMA: {result.events} events, {brief_status(group)}")


def grows(watch: GlobalWatch, group: LocalSidecarGroup, members: list[str], by: int) -> None:
    start = {m: watch.count(m) for m in members}
    wait_for(
        f"T-global of {members} to grow by {by}",
        lambda: all(watch.count(m) >= start[m] + by for m in members),
        180,
        lambda: f"from {start}; status {brief_status(group)}",
    )
