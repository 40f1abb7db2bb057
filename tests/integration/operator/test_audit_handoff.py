"""The audit's report reaches the operator for real: real Kafka, a real API server, the
running operator, and the real ``kdsync audit`` writing the report ConfigMap.

The test plays the two things this control plane lacks: the spark-operator (it starts the
runs of the ScheduledSparkApplication the operator made and records their states, as the
spark-operator does) and the Spark driver pod (it runs the application's own ``arguments``
with ``kdsync audit``, with the config Secret mounted where the driver would see it, logged
in with a token of the driver's ServiceAccount, so a permission the operator forgot to
grant fails the test).

Run 1 audits a clean group: the group becomes Consistent and its lastAudit is that
report. Then one member's T-global gets an altered event; run 2 continues from the
``state.json`` run 1 left in the ConfigMap, finds the damage, and the driver exits 1,
which the spark-operator records as FAILED: the group becomes Consistent=False.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kdsync import naming
from kdsync.audit.state import parse_state
from kdsync.localkafka import LocalKafkaFleet
from tests.integration.audit.replicated_group import MEMBERS, ReplicatedGroup
from tests.integration.operator.conftest import Kube, wait_for
from tests.support.plain_kafka import create_topic

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("operator")]

VENV_BIN = Path(sys.executable).parent
DAMAGED = "m2"
AUDIT_TIMEOUT = 300.0  # one local Spark start and job, on a busy 2-core machine


@pytest.fixture
def clean_group(
    kafka_fleet: LocalKafkaFleet, fresh_topic: Callable[[str], str], tmp_path: Path
) -> ReplicatedGroup:
    """A group replicated by hand on the session's fleet: 4 events per member, seqs 0..11,
    identical in every member's T-global (see tests/integration/audit)."""
    bootstrap = dict(zip(MEMBERS, kafka_fleet.bootstrap_servers().values(), strict=True))
    topic = fresh_topic("handoff")
    for address in bootstrap.values():
        create_topic(address, topic)
        create_topic(address, naming.global_topic(topic))
    # The driver uses the config the operator renders, not a local one.
    group = ReplicatedGroup(f"g{uuid.uuid4().hex[:10]}", topic, bootstrap, tmp_path / "unused")
    group.replicate(group.add_round(4, "a"))
    return group


def consistent(group: dict[str, Any] | None) -> dict[str, Any]:
    for cond in (group or {}).get("status", {}).get("conditions", []):
        if cond["type"] == "Consistent":
            return dict(cond)
    return {}


def wait_consistent(
    kube: Kube, name: str, namespace: str, reason: str, timeout: float = 60.0
) -> dict[str, Any]:
    """Waits for the group's Consistent condition to have ``reason``; returns the group."""

    def probe() -> dict[str, Any] | None:
        group = kube.get("kdsyncgroup", name, namespace)
        return group if consistent(group).get("reason") == reason else None

    found: dict[str, Any] = wait_for(f"Consistent {reason}", probe, timeout=timeout)
    return found


def rfc3339_now() -> str:
    """Now, as the spark-operator writes times (seconds; Kubernetes drops fractions)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def start_run(kube: Kube, scheduled: dict[str, Any]) -> str:
    """What the spark-operator does when a schedule fires: a SparkApplication from the
    template, with the scheduled app's labels and an owner reference to it, submitted and
    running; the scheduled app's status names it as the last run."""
    meta = scheduled["metadata"]
    name = f"{meta['name']}-{time.time_ns()}"
    kube.apply(
        {
            "apiVersion": "sparkoperator.k8s.io/v1beta2",
            "kind": "SparkApplication",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": {
                    "sparkoperator.k8s.io/scheduled-app-name": meta["name"],
                    **meta.get("labels", {}),
                },
                "ownerReferences": [
                    {
                        "apiVersion": "sparkoperator.k8s.io/v1beta2",
                        "kind": "ScheduledSparkApplication",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": scheduled["spec"]["template"],
        }
    )
    now = rfc3339_now()
    kube.patch_status(
        "sparkapplication", name, meta["namespace"],
        {"applicationState": {"state": "RUNNING"}, "lastSubmissionAttemptTime": now},
    )  # fmt: skip
    kube.patch_status(
        "scheduledsparkapplication", meta["name"], meta["namespace"],
        {"lastRunName": name, "lastRun": now, "scheduleState": "Scheduled"},
    )  # fmt: skip
    return name


def end_run(kube: Kube, name: str, namespace: str, exit_status: int) -> None:
    """The driver pod ended: the spark-operator records COMPLETED for exit 0, else FAILED."""
    if exit_status == 0:
        state: dict[str, Any] = {"state": "COMPLETED"}
    else:
        error = f"driver container failed with ExitCode: {exit_status}, Reason: Error"
        state = {"state": "FAILED", "errorMessage": error}
    kube.patch_status(
        "sparkapplication", name, namespace,
        {"applicationState": state, "terminationTime": rfc3339_now()},
    )  # fmt: skip


def mount_secrets(kube: Kube, namespace: str, app_spec: dict[str, Any], root: Path) -> list[str]:
    """Writes the Secrets the driver mounts under ``root`` + mount path (what the kubelet
    does in the pod); returns the mount paths."""
    volumes = {v["name"]: v for v in app_spec.get("volumes", [])}
    mounted = []
    for mount in app_spec["driver"]["volumeMounts"]:
        source = volumes[mount["name"]].get("secret")
        if source is None:
            continue
        secret = kube.get("secret", source["secretName"], namespace)
        assert secret is not None, f"the driver mounts Secret {source['secretName']}"
        items = source.get("items") or [{"key": k, "path": k} for k in secret["data"]]
        folder = root / mount["mountPath"].lstrip("/")
        for item in items:
            (folder / item["path"]).parent.mkdir(parents=True, exist_ok=True)
            (folder / item["path"]).write_bytes(base64.b64decode(secret["data"][item["key"]]))
        mounted.append(mount["mountPath"])
    return mounted


def in_pod(arguments: list[str], mounts: list[str], root: Path) -> list[str]:
    """The application's arguments with paths inside the driver's mounts moved under root."""
    return [
        str(root / arg.lstrip("/")) if any(arg.startswith(f"{m}/") for m in mounts) else arg
        for arg in arguments
    ]


def kubeconfig_for(kube: Kube, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig logged in as ServiceAccount ``account`` (a TokenRequest token, like
    the projected token in a pod) instead of the admin."""
    token = kube.run("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
    config = yaml.safe_load(kube.cp.kubeconfig_path.read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = account
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    path.chmod(0o600)
    return path


def run_driver(arguments: list[str], kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    """``kdsync audit`` as the driver pod would run it (but with local Spark)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("KUBERNETES_")}
    env.update(
        KUBECONFIG=str(kubeconfig),
        PATH=os.pathsep.join([str(VENV_BIN), env.get("PATH", "")]),
        KDSYNC_AUDIT_DEBUG="1",
    )
    return subprocess.run(
        [str(VENV_BIN / "kdsync"), "audit", *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=AUDIT_TIMEOUT,
        check=False,
    )


def report_configmap(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    found = kube.get("configmap", name, namespace)
    assert found is not None, f"ConfigMap {namespace}/{name}"
    return found


def test_the_audit_report_reaches_the_group_status_through_the_configmap(
    kube: Kube, clean_group: ReplicatedGroup, tmp_path: Path
) -> None:
    group = clean_group
    ns = kube.namespace()
    members = [{"name": m, "kafka": {"bootstrapServers": group.bootstrap[m]}} for m in MEMBERS]
    kube.apply(
        {
            "apiVersion": "kdsync.io/v1alpha1",
            "kind": "KdsyncGroup",
            "metadata": {"name": group.group, "namespace": ns},
            "spec": {
                "members": members,
                "topics": {"names": [group.topic]},
                "checks": {"enabled": True, "schedule": "0 3 * * *"},
            },
        }
    )
    uid = wait_for("the group", kube.get, "kdsyncgroup", group.group, ns)["metadata"]["uid"]
    scheduled = wait_for(
        "the ScheduledSparkApplication",
        kube.get, "scheduledsparkapplication", f"{group.group}-audit", ns,
    )  # fmt: skip
    template = scheduled["spec"]["template"]
    arguments: list[str] = template["arguments"]
    # Where the report goes is whatever the operator tells the driver.
    reference = arguments[arguments.index("--report-configmap") + 1]
    cm_namespace, cm_name = reference.split("/")
    assert cm_namespace == ns
    account = template["driver"]["serviceAccount"]
    wait_for("the driver's ServiceAccount", kube.get, "serviceaccount", account, ns)
    wait_for("the report ConfigMap", kube.get, "configmap", cm_name, ns)
    can_create = kube.run(
        "auth", "can-i", "create", "configmaps", "-n", ns,
        f"--as=system:serviceaccount:{ns}:{account}", check=False,
    )  # fmt: skip
    assert can_create.stdout.strip() == "yes", "the driver cannot re-create a deleted report"

    pod_root = tmp_path / "driver-pod"
    mounts = mount_secrets(kube, ns, template, pod_root)
    driver_args = in_pod(arguments, mounts, pod_root)
    assert Path(driver_args[driver_args.index("--config") + 1]).is_file(), driver_args
    as_driver = kubeconfig_for(kube, ns, account, tmp_path / "driver.kubeconfig")

    # Control: the same driver under an identity without the Role cannot touch the report,
    # so the runs below really depend on what the operator granted.
    kube.run("create", "serviceaccount", "nobody", "-n", ns)
    denied = run_driver(driver_args, kubeconfig_for(kube, ns, "nobody", tmp_path / "nobody"))
    assert denied.returncode == 2, denied.stderr
    assert f"cannot read ConfigMap {reference}: 403" in denied.stderr, denied.stderr

    # --- run 1: a clean group --------------------------------------------------------
    run1 = start_run(kube, scheduled)
    running = wait_consistent(kube, group.group, ns, "AuditRunning")
    assert run1 in consistent(running)["message"]
    done = run_driver(driver_args, as_driver)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"PASS group {group.group}: seqs 0..11"), done.stdout

    written = report_configmap(kube, ns, cm_name)
    first = json.loads(written["data"]["report.json"])
    assert first["passed"] is True and first["group"] == group.group
    assert first["checked"] == {"fromSeq": 0, "toSeq": 11, "events": 12}
    first_state = written["data"]["state.json"]
    saved = parse_state(first_state, "state.json", group.group)
    assert saved.topics[group.topic].next_seq == 12
    # Rewriting the ConfigMap keeps the operator's ownership (garbage collection).
    assert [r["uid"] for r in written["metadata"]["ownerReferences"]] == [uid]

    end_run(kube, run1, ns, done.returncode)
    passed = wait_consistent(kube, group.group, ns, "AuditPassed")
    assert consistent(passed)["status"] == "True"
    assert passed["status"]["lastAudit"] == {
        "time": first["finishedAt"],
        "passed": True,
        "result": "Passed",
        "summary": first["summary"],
        "violationsTotal": 0,
        "checkedEvents": 12,
        "fromSeq": 0,
        "toSeq": 11,
        "application": run1,
    }

    # --- damage after the clean end -------------------------------------------------
    more = group.add_round(2, "b")  # seqs 12..17
    altered = more[2]._replace(event=more[2].event._replace(value=b"tampered"))
    for member in MEMBERS:
        group.write_global(member, [*more[:2], altered, *more[3:]] if member == DAMAGED else more)
    for member in MEMBERS:
        group.commit_source_offsets(member)
    # Someone else's key in the report ConfigMap must survive the driver's rewrite.
    kube.run(
        "patch", "configmap", cm_name, "-n", ns, "--type=merge",
        "-p", json.dumps({"data": {"notes": "kept"}}),
    )  # fmt: skip

    # --- run 2: continues from run 1's state.json and finds the damage -----------------
    run2 = start_run(kube, scheduled)

    # While run 2 runs, run 1's verdict stands; the message says run 2 is under way.
    def run2_noted() -> dict[str, Any] | None:
        found = kube.get("kdsyncgroup", group.group, ns)
        return found if run2 in consistent(found).get("message", "") else None

    running = wait_for("Consistent to mention run 2", run2_noted, timeout=60)
    assert (consistent(running)["status"], consistent(running)["reason"]) == ("True", "AuditPassed")
    assert running["status"]["lastAudit"]["application"] == run1  # until run 2 reports
    found = run_driver(driver_args, as_driver)
    assert found.returncode == 1, found.stderr[-3000:]
    assert found.stdout.startswith(f"FAIL group {group.group}"), found.stdout

    written = report_configmap(kube, ns, cm_name)
    second = json.loads(written["data"]["report.json"])
    assert second["passed"] is False
    assert second["checked"]["fromSeq"] == first["checked"]["toSeq"] + 1
    assert second["checked"] == {"fromSeq": 12, "toSeq": 17, "events": 6}
    violations = {(v["kind"], v["seq"], v["member"]) for v in second["violations"]}
    assert {("fidelity", 14, DAMAGED), ("disagreement", 14, DAMAGED)} <= violations
    assert {member for _, _, member in violations} == {DAMAGED}
    assert written["data"]["state.json"] == first_state  # a failed run does not move it
    assert written["data"]["notes"] == "kept"

    # The driver exited 1: the spark-operator records the run as FAILED.
    end_run(kube, run2, ns, found.returncode)
    failed = wait_consistent(kube, group.group, ns, "ViolationsFound")
    assert consistent(failed)["status"] == "False"
    assert "fidelity" in consistent(failed)["message"], consistent(failed)
    assert failed["status"]["lastAudit"] == {
        "time": second["finishedAt"],
        "passed": False,
        "result": "Failed",
        "summary": second["summary"],
        "violationsTotal": second["violationsTotal"],
        "checkedEvents": 6,
        "fromSeq": 12,
        "toSeq": 17,
        "application": run2,
    }
