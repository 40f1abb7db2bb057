"""End-to-end fixtures: kdsync installed the way users install it, on a real kubelet.

Package-scoped (started once for tests/e2e and torn down as soon as its tests are done, so
the suites after it get the machine back):

* ``node``: a single-node cluster (tests/support/localnode) with the images of
  ``hack/build-images --pause`` imported (operator, sidecar, Kafka, spark-operator and pause,
  built from docker/*.Dockerfile, cached by their inputs); skipped, saying so, without root;
* ``kafka``: examples/dev-kafka.yaml in namespace ``kdsync-e2e`` (Pod Security "restricted"
  enforced, so every pod in it is held to that standard): two single-node KRaft
  clusters as pods, with the source topic ``events`` created in both (applied first, by
  ``kafka_applied``, so that they start while the charts below are installed);
* ``spark_operator``: the Kubeflow spark-operator's own Helm chart (from its Go module),
  running the image built here, watching ``kdsync-e2e``;
* ``release``: ``helm install`` of charts/kdsync-operator with the image built here.

Kafka runs as pods (not on the host) because then the e2e and ``hack/kind-up`` use the
same manifests, and every client (sidecars, the Spark audit, the tests' traffic and the
independent checker) reaches the brokers the same way, by Service name. The tests' own
Kafka work runs in pods too (``tools/kafka_tool.py``, mounted from a ConfigMap into a pod
of the sidecar image): nothing outside the node's network namespace talks to Kafka.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.envtest import KubectlError
from tests.support.localnode import LocalNode, NodeError

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
NAMESPACE = "kdsync-e2e"
OPERATOR_NAMESPACE = "kdsync-system"
SPARK_NAMESPACE = "spark-operator"
RELEASE = "kdsync-operator"
FIGURES_PATH = REPO_ROOT / ".kdsync-run" / "e2e-figures.json"
POD_LOGS_KEPT = REPO_ROOT / ".kdsync-run" / "e2e-pod-logs"
TOOL_IMAGE = "kdsync-sidecar:dev"


def wait_for(what: str, probe: Callable[[], Any], timeout: float, interval: float = 1.0) -> Any:
    """Polls ``probe`` until it returns something truthy; fails naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(
        f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})", pytrace=False
    )


class Cluster:
    """kubectl and helm against the node, with JSON helpers and in-cluster Kafka chores."""

    def __init__(self, node: LocalNode) -> None:
        self.node = node

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        return self.node.kubectl(*args, input=input, check=check, timeout=timeout)

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.node.helm(*args, check=check)

    def get(self, kind: str, name: str, namespace: str = NAMESPACE) -> dict[str, Any] | None:
        result = self.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
        if result.returncode != 0:
            return None
        found: dict[str, Any] = json.loads(result.stdout)
        return found

    def items(self, kind: str, namespace: str = NAMESPACE, selector: str = "") -> list[Any]:
        args = ["get", kind, "-n", namespace, "-o", "json"]
        if selector:
            args += ["-l", selector]
        found: list[Any] = json.loads(self.kubectl(*args).stdout)["items"]
        return found

    def apply(self, obj: dict[str, Any], namespace: str = NAMESPACE) -> None:
        self.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(obj))

    def condition(
        self, kind: str, name: str, type_: str, namespace: str = NAMESPACE
    ) -> dict[str, Any]:
        obj = self.get(kind, name, namespace) or {}
        for condition in obj.get("status", {}).get("conditions", []):
            if condition.get("type") == type_:
                found: dict[str, Any] = condition
                return found
        return {}

    # -- Kafka chores, in pods ---------------------------------------------------------

    def tool_pod(self, *args: str, name: str | None = None) -> str:
        """Starts tools/kafka_tool.py with ``args`` in a pod of the sidecar image; returns
        the pod's name without waiting for it."""
        pod_name = name or f"tool-{uuid.uuid4().hex[:8]}"
        self.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod_name, "labels": {"app.kubernetes.io/name": "e2e-tool"}},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 10001,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "tool",
                            "image": TOOL_IMAGE,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["python", "/tools/kafka_tool.py", *args],
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            # /tmp: the admin client writes its key there while it loads it.
                            "volumeMounts": [
                                {"name": "tools", "mountPath": "/tools"},
                                {"name": "tmp", "mountPath": "/tmp"},
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "tools", "configMap": {"name": "e2e-tools"}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}},
                    ],
                },
            }
        )
        return pod_name

    def tool_result(self, pod_name: str, timeout: float = 300.0) -> dict[str, Any]:
        """Waits for a tool pod to end and returns the JSON it printed (fails if it failed)."""

        def ended() -> str | None:
            pod = self.get("pod", pod_name) or {}
            phase = pod.get("status", {}).get("phase")
            return phase if phase in ("Succeeded", "Failed") else None

        phase = wait_for(f"tool pod {pod_name}", ended, timeout)
        logs = self.kubectl("logs", "-n", NAMESPACE, pod_name).stdout
        self.kubectl("delete", "pod", "-n", NAMESPACE, pod_name, "--wait=false")
        lines = [line for line in logs.splitlines() if line.startswith("{")]
        if phase != "Succeeded" or not lines:
            pytest.fail(f"tool pod {pod_name} ended {phase}:\n{logs[-3000:]}", pytrace=False)
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    def tool(self, *args: str, timeout: float = 300.0) -> dict[str, Any]:
        return self.tool_result(self.tool_pod(*args), timeout)


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="package")
def figures() -> Iterator[dict[str, float]]:
    """Durations the e2e measures (seconds), written to .kdsync-run/e2e-figures.json."""
    found: dict[str, float] = {}
    yield found
    FIGURES_PATH.parent.mkdir(parents=True, exist_ok=True)
    FIGURES_PATH.write_text(json.dumps(found, indent=2) + "\n")
    print(f"\ne2e figures ({FIGURES_PATH}): {json.dumps(found)}", file=sys.stderr)


def _hack(script: str, *args: str) -> list[Path]:
    """Runs a hack/ script (its progress goes to the test log); returns its stdout lines."""
    result = subprocess.run(
        [str(REPO_ROOT / "hack" / script), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(
            f"hack/{script} {' '.join(args)} failed:\n{result.stderr[-4000:]}", pytrace=False
        )
    return [Path(line) for line in result.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="package")
def node(figures: dict[str, float]) -> Iterator[LocalNode]:
    if os.geteuid() != 0:
        pytest.skip("the e2e node needs root (containerd, network namespaces, cgroups)")
    began = time.monotonic()
    archives = _hack("build-images", "--pause")
    figures["build-images (this run)"] = round(time.monotonic() - began, 1)
    _hack(
        "host-packages",
        "containerd",
        "runc",
        "containernetworking-plugins",
        "iptables",
        "socat",
        "conntrack",
    )
    bin_dir = _hack("fetch-k8s", "node", "spark-operator")[-1]
    local = LocalNode(images=archives, bin_dir=bin_dir)
    try:
        local.start()
    except NodeError as error:
        pytest.fail(str(error), pytrace=False)
    figures["node start incl. image import"] = round(local.timings["start"], 1)
    try:
        yield local
    finally:
        local.stop()
        figures["node stop"] = round(local.timings["stop"], 1)


@pytest.fixture(scope="package")
def cluster(node: LocalNode) -> Cluster:
    return Cluster(node)


def _copy_pod_logs(pod_logs: Path, kept: Path) -> None:
    """Copies the test namespace's container logs (not the tool pods') that grew since
    the last copy. The kubelet names a pod's folder by namespace, name and uid."""
    for log in pod_logs.glob(f"{NAMESPACE}_*/*/*.log"):
        folder = log.parent.parent.name
        if folder.startswith(f"{NAMESPACE}_tool-"):
            continue
        target = kept / folder / f"{log.parent.name}-{log.name}"
        try:
            if target.exists() and target.stat().st_size == log.stat().st_size:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log, target)
        except FileNotFoundError:  # the pod was deleted meanwhile
            continue


@pytest.fixture(scope="package", autouse=True)
def pod_logs_kept(node: LocalNode) -> Iterator[Path]:
    """Every sidecar's (and broker's) log in ``.kdsync-run/e2e-pod-logs``, killed and
    rolled pods' too: the kubelet deletes a pod's logs with it, and a pause in delivery
    over a roll is found in the logs of the pods rolled. Copied every second, so up to
    the last second of a killed pod's log may be missing."""
    shutil.rmtree(POD_LOGS_KEPT, ignore_errors=True)
    stop = threading.Event()

    def keep() -> None:
        while not stop.wait(1.0):
            _copy_pod_logs(node.paths.pod_logs, POD_LOGS_KEPT)

    keeper = threading.Thread(target=keep, name="pod-logs-kept", daemon=True)
    keeper.start()
    try:
        yield POD_LOGS_KEPT
    finally:
        stop.set()
        keeper.join(30)
        _copy_pod_logs(node.paths.pod_logs, POD_LOGS_KEPT)


@pytest.fixture(scope="package")
def kafka_applied(cluster: Cluster) -> None:
    """The test namespace with the two development clusters applied, not waited for (they
    start while the charts are installed)."""
    cluster.kubectl("create", "namespace", NAMESPACE)
    # Every pod in it (brokers, sidecars, the audit's Spark driver and executors, the test's
    # tool pods) must pass the "restricted" Pod Security Standard, judged by the API server.
    cluster.kubectl(
        "label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted"
    )
    cluster.kubectl(
        "create",
        "configmap",
        "e2e-tools",
        "-n",
        NAMESPACE,
        f"--from-file={HERE / 'tools' / 'kafka_tool.py'}",
    )
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", str(REPO_ROOT / "examples" / "dev-kafka.yaml"))


@pytest.fixture(scope="package")
def kafka(cluster: Cluster, kafka_applied: None) -> dict[str, str]:
    """The two development clusters, ready, with topic ``events`` (3 partitions) in both."""
    for name in ("kafka-one", "kafka-two"):
        cluster.kubectl(
            "rollout",
            "status",
            f"statefulset/{name}",
            "-n",
            NAMESPACE,
            "--timeout=300s",
            timeout=320,
        )
    servers = {"one": "kafka-one:9092", "two": "kafka-two:9092"}
    pods = [
        cluster.tool_pod("topic", "--bootstrap", b, "--topic", "events") for b in servers.values()
    ]
    for pod in pods:
        cluster.tool_result(pod, timeout=180)
    return servers


@pytest.fixture(scope="package")
def spark_operator(cluster: Cluster, node: LocalNode) -> None:
    """The spark-operator's own chart, its image replaced by the one built here."""
    chart = node.bin_dir.parent / "charts" / "spark-operator"
    cluster.helm(
        "install",
        "spark-operator",
        str(chart),
        "--namespace",
        SPARK_NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
        "--set",
        "image.registry=docker.io",
        "--set",
        "image.repository=library/kdsync-spark-operator",
        "--set",
        "image.tag=dev",
        "--set",
        "image.pullPolicy=IfNotPresent",
        "--set",
        f"spark.jobNamespaces={{{NAMESPACE}}}",
        # Burstable, not BestEffort: spark-submit runs in the controller and the webhook
        # mutates every driver and executor pod; on a busy node a BestEffort pod's CPU
        # weight is 2 (of 1024).
        "--set",
        "controller.resources.requests.cpu=100m",
        "--set",
        "webhook.resources.requests.cpu=50m",
        "--set",
        "controller.uiService.enable=false",
        "--set",
        "prometheus.metrics.enable=false",
    )


@pytest.fixture(scope="package")
def release(
    cluster: Cluster, kafka_applied: None, spark_operator: None, figures: dict[str, float]
) -> str:
    """charts/kdsync-operator installed with Helm; returns the release name."""
    began = time.monotonic()
    cluster.helm(
        "install",
        RELEASE,
        str(REPO_ROOT / "charts" / "kdsync-operator"),
        "--namespace",
        OPERATOR_NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
        "--set",
        "image.repository=kdsync-operator",
        "--set",
        "image.tag=dev",
        "--set",
        "resyncSeconds=10",
        "--set",
        "scrapeMemberMetrics=true",
    )
    figures["helm install -> operator Ready"] = round(time.monotonic() - began, 1)
    return RELEASE


def dump_state(cluster: Cluster) -> str:
    """What to look at when a test fails: pods, events, the group, the operator's log."""
    parts = []
    for args in (
        ("get", "pods", "-A", "-o", "wide"),
        ("get", "kdg", "-n", NAMESPACE, "-o", "yaml"),
        ("get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp"),
        ("logs", "-n", OPERATOR_NAMESPACE, f"deploy/{RELEASE}", "--tail=80"),
    ):
        try:
            parts.append(cluster.kubectl(*args, check=False).stdout[-6000:])
        except (KubectlError, subprocess.TimeoutExpired) as error:
            parts.append(str(error))
    return "\n".join(parts)
