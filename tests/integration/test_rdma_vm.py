"""The RDMA transport on a real verbs device: Soft-RoCE in a qemu guest (``hack/rdma-vm``).

This machine's kernel has no RDMA, so these tests boot Debian's kernel under plain
emulation with ``rdma_rxe`` on the guest's network device, and run there, through
pyverbs, the tests that ran here over the in-process device. They skip only where qemu
cannot run at all (``hack/rdma-vm`` exits 77 and says why).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from kdsync.localkafka import LocalKafkaFleet
from kdsync.verification.traffic import PARTITIONS
from tests.support.plain_kafka import create_topic

REPO_ROOT = Path(__file__).resolve().parents[2]
RDMA_VM = REPO_ROOT / "hack" / "rdma-vm"
SKIP = 77


def in_rdma_vm(
    *command: str, env: dict[str, str] | None = None, timeout: int = 900, out: Path | None = None
) -> str:
    """Run ``command`` in the guest; its output, or the test fails with it. ``out``: a
    host folder the guest may write (``$KDSYNC_VM_OUT`` there), named in a failure."""
    extra = [arg for name, value in (env or {}).items() for arg in ("--env", f"{name}={value}")]
    if out is not None:
        extra += ["--out", str(out)]
    result = subprocess.run(
        [str(RDMA_VM), "run", "--timeout", str(timeout - 60), *extra, "--", *command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode == SKIP:
        pytest.skip(f"hack/rdma-vm cannot run here: {result.stderr.strip()[-500:]}")
    kept = f"\nwhat the guest kept (whole sidecar logs): {out}" if out is not None else ""
    assert result.returncode == 0, f"{result.stdout[-6000:]}\n{result.stderr[-4000:]}{kept}"
    return result.stdout


def test_rdma_transport_on_soft_roce() -> None:
    """The transport suite over rxe0, then a tiny hack/bench-transport (TCP and RDMA side
    by side) so that the benchmark keeps working; its figures are not checked. One boot."""
    out = in_rdma_vm(
        "sh", "-c",
        "python3 -m pytest -p no:cacheprovider -q -rs tests/integration/test_rdma_transport.py "
        "-k rxe && python3 -m kdsync.benchmark.transport --transports tcp,rdma "
        "--host 10.0.2.15 --sizes 1024,65536 --megabytes 1 --pings 50",
    )  # fmt: skip
    # Every case ran over the device (none skipped for want of it, none failed).
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= 7, out[-3000:]
    assert "skipped" not in out and "failed" not in out, out[-3000:]
    assert "| rdma/tcp |" in out, out[-3000:]


def test_a_three_member_group_replicates_over_soft_roce(
    kafka_fleet: LocalKafkaFleet, fresh_topic: Callable[[str], str], tmp_path: Path
) -> None:
    """Three sidecars in the guest, one per host cluster, their links over rxe0; traffic
    and the independent check run in the guest too (test_rdma_group_in_vm.py)."""
    servers = kafka_fleet.bootstrap_servers()
    bootstrap = dict(zip(("m1", "m2", "m3"), servers.values(), strict=True))
    topic = fresh_topic("rdma")[:100]
    for address in bootstrap.values():
        create_topic(address, topic, PARTITIONS)
    out = in_rdma_vm(
        "python3", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "-s",
        "tests/integration/test_rdma_group_in_vm.py",
        env={"KDSYNC_RDMA_TEST_KAFKA": json.dumps(bootstrap), "KDSYNC_RDMA_TEST_TOPIC": topic},
        timeout=1200,
        out=tmp_path / "guest",
    )  # fmt: skip
    assert "1 passed" in out and "skipped" not in out, out[-3000:]
