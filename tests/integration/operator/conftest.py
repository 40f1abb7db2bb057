"""Session fixtures for the operator tests: one real control plane, one running operator.

* ``control_plane``: etcd + kube-apiserver (tests/support/envtest.py) with the KdsyncGroup
  CRD from ``crds/`` and a trimmed spark-operator CRD (``spark-operator-crds.yaml``).
* ``operator``: ``kopf run`` of ``kdsync_operator.handlers`` as a subprocess against it,
  with its validating webhook on 127.0.0.1 (a self-signed certificate made here; kopf
  writes the ValidatingWebhookConfiguration pointing at it), resyncing every 2 s, with
  the chart's audit-driver ClusterRole installed for it to bind.

There is no kubelet, scheduler or controller-manager: tests mark StatefulSets ready
through the status subresource themselves, and nothing garbage-collects owned objects.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kdsync_operator.webhook_certs import self_signed
from tests.support.envtest import LocalControlPlane

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[2]
WEBHOOK_CONFIG = "kdsync-operator-test.kdsync.io"
CHART = REPO_ROOT / "charts" / "kdsync-operator"
RELEASE_NS = "kdsync-system"
# What the chart names its ClusterRoles for the release "kd" (see render).
OPERATOR_ROLE = "kd-kdsync-operator"
AUDIT_DRIVER_ROLE = f"{OPERATOR_ROLE}-audit-driver"


def render(cp: LocalControlPlane, *sets: str, check: bool = True) -> Any:
    """``helm template`` of the chart as release "kd" in RELEASE_NS."""
    args = ["template", "kd", str(CHART), "--namespace", RELEASE_NS]
    for item in sets:
        args += ["--set", item]
    return cp.helm(*args, check=check)


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def wait_for(
    what: str,
    probe: Callable[..., Any],
    *args: Any,
    timeout: float = 30.0,
    interval: float = 0.2,
) -> Any:
    """Polls ``probe(*args)`` until it returns something truthy; fails naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe(*args)
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what} (last: {last!r})", pytrace=False)


class Kube:
    """kubectl against the test control plane, with JSON helpers."""

    def __init__(self, cp: LocalControlPlane) -> None:
        self.cp = cp

    def run(self, *args: str, input: str | None = None, check: bool = True) -> Any:
        return self.cp.kubectl(*args, input=input, check=check)

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        result = self.cp.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
        if result.returncode != 0:
            return None
        obj: dict[str, Any] = json.loads(result.stdout)
        return obj

    def apply(self, obj: dict[str, Any], check: bool = True) -> Any:
        return self.cp.kubectl("apply", "-f", "-", input=json.dumps(obj), check=check)

    def patch_status(self, kind: str, name: str, namespace: str, status: dict[str, Any]) -> None:
        self.cp.kubectl(
            "patch", kind, name, "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}),
        )  # fmt: skip

    def namespace(self) -> str:
        name = f"op-{uuid.uuid4().hex[:8]}"
        self.cp.kubectl("create", "namespace", name)
        return name


@pytest.fixture(scope="session")
def control_plane() -> Iterator[LocalControlPlane]:
    with LocalControlPlane() as cp:
        cp.kubectl("apply", "-f", str(REPO_ROOT / "crds"))
        cp.kubectl("apply", "-f", str(HERE / "spark-operator-crds.yaml"))
        for crd in (
            "kdsyncgroups.kdsync.io",
            "sparkapplications.sparkoperator.k8s.io",
            "scheduledsparkapplications.sparkoperator.k8s.io",
        ):
            cp.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
        yield cp


@pytest.fixture(scope="session")
def kube(control_plane: LocalControlPlane) -> Kube:
    return Kube(control_plane)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def operator(
    control_plane: LocalControlPlane, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[subprocess.Popen[bytes]]:
    work = tmp_path_factory.mktemp("operator")
    cert, key = self_signed(["127.0.0.1"])
    (work / "tls.crt").write_bytes(cert)
    (work / "tls.key").write_bytes(key)
    log_path = work / "operator.log"
    # The audit driver's rights come from the chart's ClusterRole, which the operator
    # binds in each group's namespace: install that one as the chart would.
    (driver_role,) = [
        d
        for d in documents(render(control_plane).stdout)
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == AUDIT_DRIVER_ROLE
    ]
    kube.apply(driver_role)
    env = {
        **control_plane.env(),
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "sidecar"), str(REPO_ROOT / "operator")]),
        "KDSYNC_RESYNC_SECONDS": "2",
        "KDSYNC_AUDIT_DRIVER_CLUSTERROLE": AUDIT_DRIVER_ROLE,
        "KDSYNC_WEBHOOK_ADDR": "127.0.0.1",
        "KDSYNC_WEBHOOK_HOST": "127.0.0.1",
        "KDSYNC_WEBHOOK_PORT": str(_free_port()),
        "KDSYNC_WEBHOOK_CERT": str(work / "tls.crt"),
        "KDSYNC_WEBHOOK_KEY": str(work / "tls.key"),
        "KDSYNC_WEBHOOK_MANAGED": WEBHOOK_CONFIG,
    }
    command = [
        sys.executable, "-m", "kopf", "run", "--standalone", "--all-namespaces",
        "-m", "kdsync_operator.handlers",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # Ready = kopf wrote the webhook configuration and the webhook answers: a
        # server-side dry run of an object only the webhook rejects is refused by it.
        def webhook_answers() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"the operator exited:\n{log_path.read_text()[-4000:]}")
            bad = {
                "apiVersion": "kdsync.io/v1alpha1",
                "kind": "KdsyncGroup",
                "metadata": {"name": "probe", "namespace": "default"},
                "spec": {
                    "members": [
                        {"name": "a", "kafka": {"bootstrapServers": "k:9092"}},
                        {"name": "b", "kafka": {"bootstrapServers": "k:9092"}},
                    ],
                    "topics": {"include": ["(["]},
                },
            }
            result = kube.run(
                "create", "--dry-run=server", "-f", "-", input=json.dumps(bad), check=False
            )
            return result.returncode != 0 and "spec.topics.include[0]" in result.stderr

        wait_for("the operator's admission webhook", webhook_answers, timeout=90, interval=1)
        yield proc
    finally:
        # Without the operator, a failurePolicy=Fail webhook would block every later write.
        kube.run(
            "delete", "validatingwebhookconfiguration", WEBHOOK_CONFIG, "--ignore-not-found",
            check=False,
        )  # fmt: skip
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if os.environ.get("KDSYNC_SHOW_OPERATOR_LOG"):
            print(log_path.read_text()[-20000:])
