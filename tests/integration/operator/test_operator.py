"""The operator against a real kube-apiserver + etcd (see conftest.py).

No kubelet and no StatefulSet controller run here: where a test needs a member to be
"ready", it writes the StatefulSet's status through the status subresource exactly as the
StatefulSet controller would (observedGeneration, revisions, readyReplicas). And there is
no garbage collector (no kube-controller-manager): deletion is checked as the owner
references the collector would follow.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from typing import Any

import pytest
import yaml

from kdsync.audit.spark_conf import AUDIT_SPARK_CONF
from kdsync.config import parse_config
from tests.integration.operator.conftest import Kube, wait_for

pytestmark = pytest.mark.usefixtures("operator")

MEMBERS = ["east", "west", "wit"]


def group_manifest(name: str, namespace: str, **spec_extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "members": [
            {"name": "east", "kafka": {"bootstrapServers": "kafka-east:9092"}},
            {"name": "west", "kafka": {"bootstrapServers": "kafka-west:9092"}},
            {"name": "wit", "witness": True},
        ],
        "topics": {"names": ["orders"], "include": ["pay\\..*"]},
    }
    spec.update(spec_extra)
    return {
        "apiVersion": "kdsync.io/v1alpha1",
        "kind": "KdsyncGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def mark_ready(kube: Kube, name: str, namespace: str) -> None:
    """Plays the StatefulSet controller + kubelet: the one replica runs the current
    revision and is ready (there is no kubelet in this control plane)."""
    sts = kube.get("statefulset", name, namespace)
    assert sts is not None, name
    revision = f"{name}-{sts['metadata']['generation']}"
    kube.patch_status(
        "statefulset", name, namespace,
        {
            "observedGeneration": sts["metadata"]["generation"],
            "replicas": 1, "readyReplicas": 1, "availableReplicas": 1,
            "updatedReplicas": 1, "currentReplicas": 1,
            "currentRevision": revision, "updateRevision": revision,
        },
    )  # fmt: skip


def config_hash(kube: Kube, name: str, namespace: str) -> str | None:
    sts = kube.get("statefulset", name, namespace)
    if sts is None:
        return None
    value = sts["spec"]["template"]["metadata"]["annotations"].get("kdsync.io/config-hash")
    return str(value)


def stays_old(kube: Kube, name: str, namespace: str, old: str | None, seconds: float) -> None:
    """Polls until a deadline, failing as soon as the StatefulSet's config hash moves."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert config_hash(kube, name, namespace) == old, f"{name} was updated too early"
        time.sleep(0.25)


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for cond in (obj or {}).get("status", {}).get("conditions", []):
        if cond["type"] == kind:
            return dict(cond)
    return {}


def kubectl_wait_ready(kube: Kube, name: str, namespace: str) -> subprocess.CompletedProcess[str]:
    result: subprocess.CompletedProcess[str] = kube.cp.kubectl(
        "wait", "--for=condition=Ready", f"kdsyncgroup/{name}", "-n", namespace,
        "--timeout=60s", timeout=90,
    )  # fmt: skip
    return result


def ready_group(kube: Kube, name: str, namespace: str) -> dict[str, str | None]:
    """Create the group, play every member ready, wait for Ready; the config hashes."""
    kube.apply(group_manifest(name, namespace))
    for member in MEMBERS:
        wait_for(f"{name}-{member}", kube.get, "sts", f"{name}-{member}", namespace)
        mark_ready(kube, f"{name}-{member}", namespace)
    kubectl_wait_ready(kube, name, namespace)
    return {m: config_hash(kube, f"{name}-{m}", namespace) for m in MEMBERS}


def test_creates_every_child_and_becomes_ready(kube: Kube) -> None:
    ns = kube.namespace()
    kube.apply(group_manifest("orders", ns))
    group = wait_for("the group", lambda: kube.get("kdsyncgroup", "orders", ns))
    uid = group["metadata"]["uid"]
    for member in MEMBERS:
        wait_for(f"StatefulSet orders-{member}", kube.get, "sts", f"orders-{member}", ns)

    owner = {
        "apiVersion": "kdsync.io/v1alpha1", "kind": "KdsyncGroup", "name": "orders",
        "uid": uid, "controller": True, "blockOwnerDeletion": True,
    }  # fmt: skip
    children = {
        ("service", "orders-peers"), ("networkpolicy", "orders-peers"),
        ("serviceaccount", "orders-sidecar"), ("secret", "orders-ca"),
    } | {("secret", f"orders-{m}-config") for m in MEMBERS} | {
        ("secret", f"orders-{m}-tls") for m in MEMBERS
    } | {("statefulset", f"orders-{m}") for m in MEMBERS}  # fmt: skip
    for kind, name in sorted(children):
        obj = wait_for(f"{kind}/{name}", kube.get, kind, name, ns)
        # No garbage collector here: deletion works through exactly these references.
        assert obj["metadata"]["ownerReferences"] == [owner], (kind, name)

    sts = kube.get("sts", "orders-east", ns)
    assert sts is not None
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["serviceName"] == "orders-peers"
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["kdsync", "run", "--config", "/etc/kdsync/config.yaml"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "peer": 7070, "http": 8080, "admin": 8443,
    }  # fmt: skip
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "IPC_LOCK" not in json.dumps(container)
    volumes = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert volumes == {"config": "orders-east-config", "peer-tls": "orders-east-tls"}

    service = kube.get("service", "orders-peers", ns)
    assert service is not None
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    policy = kube.get("networkpolicy", "orders-peers", ns)
    assert policy is not None
    peer_rule = policy["spec"]["ingress"][0]
    assert peer_rule["ports"] == [{"protocol": "TCP", "port": 7070}]
    assert peer_rule["from"] == [{"podSelector": policy["spec"]["podSelector"]}]

    # Each member's config is the sidecar's own format, valid, and names that member.
    for member in MEMBERS:
        secret = kube.get("secret", f"orders-{member}-config", ns)
        assert secret is not None
        text = base64.b64decode(secret["data"]["config.yaml"]).decode()
        config = parse_config(yaml.safe_load(text), check_files=False)
        assert config.member == member
        assert config.members[0].peer == f"orders-east-0.orders-peers.{ns}.svc:7070"
        assert [m.witness for m in config.members] == [False, False, True]

    # Not ready until the members are.
    group = wait_for(
        "status",
        lambda: (g := kube.get("kdsyncgroup", "orders", ns)) and condition(g, "Ready") and g,
    )
    assert condition(group, "Ready")["status"] == "False"
    for member in MEMBERS:
        mark_ready(kube, f"orders-{member}", ns)
    kubectl_wait_ready(kube, "orders", ns)
    group = kube.get("kdsyncgroup", "orders", ns)
    assert group is not None
    assert group["status"]["observedGeneration"] == group["metadata"]["generation"]
    for kind in ("Ready", "Progressing", "Degraded", "Consistent"):
        cond = condition(group, kind)
        assert cond["observedGeneration"] == group["metadata"]["generation"], cond
        assert cond["reason"] and cond["message"], cond
    assert condition(group, "Degraded")["status"] == "False"
    assert group["status"]["readyMembers"] == "3/3"
    assert [m["ready"] for m in group["status"]["members"]] == [True, True, True]
    events = wait_for(
        "a ReadyTrue event",
        lambda: (
            "ReadyTrue" in kube.run("get", "events", "-n", ns, "-o", "json").stdout
            and kube.run("get", "events", "-n", ns, "-o", "json").stdout
        ),
    )
    assert "KdsyncGroup" in events


def test_spec_change_rolls_one_member_at_a_time(kube: Kube) -> None:
    ns = kube.namespace()
    before = ready_group(kube, "roll", ns)

    kube.apply(group_manifest("roll", ns, ordering={"tickMs": 20}))
    order: list[str] = []
    for step, member in enumerate(MEMBERS):
        wait_for(
            f"member {member} updated",
            lambda m: config_hash(kube, f"roll-{m}", ns) != before[m],
            member,
        )
        order.append(member)
        # The operator has reconciled this state and recorded that it waits for `member`
        # (status is written after the applies of the same pass) ...
        wait_for(
            f"status showing the rollout waiting for {member}",
            lambda m: (
                (g := kube.get("kdsyncgroup", "roll", ns))
                and g["status"].get("rollout", {}).get("updating") == m
                and g["status"]["observedGeneration"] == g["metadata"]["generation"]
            ),
            member,
        )
        group = kube.get("kdsyncgroup", "roll", ns)
        assert condition(group, "Ready")["status"] == "False"
        assert condition(group, "Progressing")["status"] == "True"
        assert condition(group, "Degraded")["status"] == "False", condition(group, "Degraded")
        # ... and every later member still runs the old config: nothing else moves until
        # this member is ready again.
        for later in MEMBERS[step + 1 :]:
            assert config_hash(kube, f"roll-{later}", ns) == before[later], (member, later)
        if step == 0:
            # More passes of the operator (it resyncs every 2 s) must not move the next
            # member either while the first is not ready: watch it for three passes.
            stays_old(kube, "roll-west", ns, before["west"], seconds=6.5)
        mark_ready(kube, f"roll-{member}", ns)
    assert order == MEMBERS
    kubectl_wait_ready(kube, "roll", ns)
    group = kube.get("kdsyncgroup", "roll", ns)
    assert condition(group, "Ready")["observedGeneration"] == 2
    assert condition(group, "Progressing")["reason"] == "RolloutComplete"


def test_a_topics_change_restarts_every_member_at_once(kube: Kube) -> None:
    """Members with different topics settings refuse each other's peer links, so rolling
    such a change one member at a time would leave the first one out for ever: all are
    updated in one pass, without waiting for any to be ready."""
    ns = kube.namespace()
    before = ready_group(kube, "topics", ns)

    kube.apply(group_manifest("topics", ns, topics={"names": ["orders", "refunds"], "include": []}))
    wait_for(
        "every member updated, none marked ready",
        lambda: all(config_hash(kube, f"topics-{m}", ns) != before[m] for m in MEMBERS),
    )
    for member in MEMBERS:
        secret = kube.get("secret", f"topics-{member}-config", ns)
        assert secret is not None
        text = base64.b64decode(secret["data"]["config.yaml"]).decode()
        config = parse_config(yaml.safe_load(text), check_files=False)
        assert list(config.topics.names) == ["orders", "refunds"], member
    for member in MEMBERS:
        mark_ready(kube, f"topics-{member}", ns)
    kubectl_wait_ready(kube, "topics", ns)


def test_a_data_member_added_while_the_group_cannot_be_asked_is_not_started(
    kube: Kube,
) -> None:
    """Its sidecar may start only once the group counts it as a learner and its cluster is
    seeded: with no pod answering here, the operator creates nothing for it, rolls
    nobody, and says why. Reordering the same members is not a membership change."""
    ns = kube.namespace()
    before = ready_group(kube, "grow", ns)
    manifest = group_manifest("grow", ns)
    manifest["spec"]["members"].append(
        {"name": "north", "kafka": {"bootstrapServers": "kafka-north:9092"}}
    )
    kube.apply(manifest)

    def joining() -> dict[str, Any] | None:
        group = kube.get("kdsyncgroup", "grow", ns) or {}
        found = condition(group, "Joining") if group.get("status") else {}
        return found if found.get("status") == "True" else None

    reported = wait_for("the Joining condition", joining)
    assert reported["reason"] == "GroupUnreachable", reported
    for member in MEMBERS:
        stays_old(kube, f"grow-{member}", ns, before[member], seconds=2.5)
    assert kube.get("sts", "grow-north", ns) is None
    assert kube.get("sparkapplication", "grow-backfill-north", ns) is None
    manifest["spec"]["members"].reverse()
    kube.run("apply", "-f", "-", input=json.dumps(manifest))


def test_a_witness_added_while_the_group_cannot_be_asked_is_created_and_nothing_rolls(
    kube: Kube,
) -> None:
    """The new witness's StatefulSet is created at once (its sidecar waits to be added),
    but the others keep their config: once the witness exists, the StatefulSets are the
    spec's members again, and only their member-set annotation says that the group has
    not taken the change yet."""
    ns = kube.namespace()
    manifest = group_manifest("witness2", ns)
    manifest["spec"]["members"] = manifest["spec"]["members"][:2]  # two regions, no witness
    kube.apply(manifest)
    data_members = ["east", "west"]
    for member in data_members:
        wait_for(f"witness2-{member}", kube.get, "sts", f"witness2-{member}", ns)
        mark_ready(kube, f"witness2-{member}", ns)
    kubectl_wait_ready(kube, "witness2", ns)
    before = {m: config_hash(kube, f"witness2-{m}", ns) for m in data_members}
    manifest["spec"]["members"].append({"name": "wit2", "witness": True})
    kube.apply(manifest)
    wait_for("witness2-wit2", kube.get, "sts", "witness2-wit2", ns)
    for member in data_members:
        stays_old(kube, f"witness2-{member}", ns, before[member], seconds=3.5)
    group = kube.get("kdsyncgroup", "witness2", ns)
    assert condition(group, "Joining")["status"] == "True", condition(group, "Joining")
    assert group is not None and group["status"]["membership"]["joining"] == "wit2"


def test_a_member_removed_while_the_group_cannot_be_asked_stays_and_nothing_rolls(
    kube: Kube,
) -> None:
    """No pod answers here (no kubelet): the operator cannot ask the group to remove the
    member, so it must neither delete that member's StatefulSet nor restart the others
    onto the new member list (they would be refused by a group still counting it), and
    the webhook must take no second change meanwhile."""
    ns = kube.namespace()
    before = ready_group(kube, "shrink", ns)
    manifest = group_manifest("shrink", ns)
    removed = manifest["spec"]["members"].pop()
    kube.apply(manifest)

    def leaving() -> dict[str, Any] | None:
        group = kube.get("kdsyncgroup", "shrink", ns) or {}
        found = condition(group, "Leaving") if group.get("status") else {}
        return found if found.get("status") == "True" else None

    reported = wait_for("the Leaving condition", leaving)
    assert reported["reason"] == "GroupUnreachable", reported
    group = kube.get("kdsyncgroup", "shrink", ns)
    assert group is not None and group["status"]["membership"]["leaving"] == removed["name"]
    # Three operator passes later (it resyncs every 2 s): still there, nothing rolled.
    for member in MEMBERS:
        stays_old(kube, f"shrink-{member}", ns, before[member], seconds=2.5)
    assert kube.get("sts", f"shrink-{removed['name']}", ns) is not None
    again = group_manifest("shrink", ns)
    again["spec"]["members"] = [m for m in again["spec"]["members"] if m != removed]
    again["spec"]["members"].append({"name": "wit2", "witness": True})
    result = kube.run("apply", "-f", "-", input=json.dumps(again), check=False)
    assert result.returncode != 0 and "under way" in result.stderr, result.stderr


INVALID = {
    "one member": (
        {"members": [{"name": "a", "kafka": {"bootstrapServers": "k:9092"}}]},
        "spec.members",
    ),
    "duplicate member names": (
        {
            "members": [
                {"name": "a", "kafka": {"bootstrapServers": "k:9092"}},
                {"name": "a", "kafka": {"bootstrapServers": "k2:9092"}},
            ]
        },
        "spec.members[1]",
    ),
    "witness with kafka": (
        {
            "members": [
                {"name": "a", "kafka": {"bootstrapServers": "k:9092"}},
                {"name": "b", "kafka": {"bootstrapServers": "k:9092"}},
                {"name": "w", "witness": True, "kafka": {"bootstrapServers": "k:9092"}},
            ]
        },
        "a witness owns no Kafka cluster",
    ),
    "data member without kafka": (
        {"members": [{"name": "a", "kafka": {"bootstrapServers": "k:9092"}}, {"name": "b"}]},
        "spec.members[].kafka",
    ),
    "as many witnesses as data members": (
        {
            "members": [
                {"name": "a", "kafka": {"bootstrapServers": "k:9092"}},
                {"name": "w", "witness": True},
            ]
        },
        "more data members than witnesses",
    ),
    "rdma without resource name": (
        {"transport": {"type": "rdma", "rdma": {"networkAttachment": "sriov"}}},
        "transport.rdma.resourceName",
    ),
    "member rdma without network attachment": (
        {
            "members": [
                {"name": "a", "kafka": {"bootstrapServers": "k:9092"}},
                {
                    "name": "b",
                    "kafka": {"bootstrapServers": "k:9092"},
                    "transport": {"type": "rdma", "rdma": {"resourceName": "rdma/vf"}},
                },
            ]
        },
        "transport.rdma.networkAttachment",
    ),
    "no topics": ({"topics": {"globalSuffix": "-g"}}, "spec.topics"),
    "bad include pattern (webhook)": (
        {"topics": {"include": ["orders.(["]}},
        "spec.topics.include[0]",
    ),
    "bad exclude pattern (webhook)": (
        {"topics": {"names": ["a"], "exclude": ["*x"]}},
        "spec.topics.exclude[0]",
    ),
    "topic ending in the suffix (webhook, sidecar rules)": (
        {"topics": {"names": ["orders-global"]}},
        "spec.topics.names[0]",
    ),
    "owned kafka property (webhook, sidecar rules)": (
        {
            "members": [
                {"name": "a", "kafka": {"bootstrapServers": "k:9092"}},
                {
                    "name": "b",
                    "kafka": {
                        "bootstrapServers": "k:9092",
                        "properties": {"enable.auto.commit": "true"},
                    },
                },
            ]
        },
        "spec.members[1].kafka.properties",
    ),
    "election shorter than two heartbeats": (
        {"ordering": {"heartbeatTicks": 5, "electionTicks": 10}},
        "spec.ordering.electionTicks",
    ),
}


@pytest.mark.parametrize("case", list(INVALID), ids=list(INVALID))
def test_invalid_groups_are_rejected_at_admission(kube: Kube, case: str) -> None:
    override, expected = INVALID[case]
    manifest = group_manifest("bad", "default")
    manifest["spec"].update(override)
    result = kube.run("create", "-f", "-", input=json.dumps(manifest), check=False)
    assert result.returncode != 0, f"{case}: accepted"
    assert expected in result.stderr, result.stderr
    assert kube.get("kdsyncgroup", "bad", "default") is None


def test_audit_results_set_the_consistent_condition(kube: Kube) -> None:
    ns = kube.namespace()
    kube.apply(group_manifest("aud", ns, checks={"enabled": True}))
    app = wait_for("the SparkApplication", lambda: kube.get("sparkapplication", "aud-audit", ns))
    spec = app["spec"]
    assert spec["type"] == "Python"
    assert spec["mainApplicationFile"] == "local:///opt/kdsync/audit/spark_main.py"
    assert spec["arguments"] == [
        "--config", "/etc/kdsync/config.yaml", "--report-configmap", f"{ns}/aud-audit-report",
        "--verbose",
    ]  # fmt: skip
    assert spec["driver"]["serviceAccount"] == "aud-audit"
    assert spec["sparkConf"] == {  # stored as the operator set it
        **AUDIT_SPARK_CONF,
        "spark.sql.shuffle.partitions": "8",
    }
    assert kube.get("configmap", "aud-audit-report", ns) is not None
    role = kube.get("role", "aud-audit", ns)
    assert role is not None
    assert role["rules"][0]["resourceNames"] == ["aud-audit-report"]
    assert kube.get("rolebinding", "aud-audit", ns) is not None
    can = kube.run(
        "auth", "can-i", "update", "configmap/aud-audit-report", "-n", ns,
        f"--as=system:serviceaccount:{ns}:aud-audit", check=False,
    )  # fmt: skip
    assert can.stdout.strip() == "yes"

    def consistent() -> dict[str, Any]:
        return condition(kube.get("kdsyncgroup", "aud", ns), "Consistent")

    wait_for("Consistent NoAuditYet", lambda: consistent().get("reason") == "NoAuditYet")
    kube.patch_status(
        "sparkapplication", "aud-audit", ns, {"applicationState": {"state": "RUNNING"}}
    )
    wait_for("Consistent AuditRunning", lambda: consistent().get("reason") == "AuditRunning")

    def report(passed: bool, violations: int) -> None:
        body = {
            "version": 1, "group": "aud", "passed": passed,
            "checked": {"fromSeq": 0, "toSeq": 99, "events": 100},
            "counts": {"east": 100, "west": 100}, "lag": {"east": 0, "west": 0},
            "violationsTotal": violations,
            "violations": [
                {"kind": "agreement", "seq": 7, "member": "west", "detail": "differs"}
            ][:violations],
            "summary": f"{violations} violations in 100 events",
            "startedAt": "2030-01-01T00:00:00Z", "finishedAt": "2030-01-01T00:01:00Z",
        }  # fmt: skip
        kube.run(
            "patch", "configmap", "aud-audit-report", "-n", ns, "--type=merge",
            "-p", json.dumps({"data": {"report.json": json.dumps(body)}}),
        )  # fmt: skip

    report(True, 0)
    kube.patch_status(
        "sparkapplication", "aud-audit", ns, {"applicationState": {"state": "COMPLETED"}}
    )
    cond = wait_for("Consistent True", lambda: (c := consistent()).get("status") == "True" and c)
    assert cond["reason"] == "AuditPassed"
    group = kube.get("kdsyncgroup", "aud", ns)
    assert group is not None
    assert group["status"]["lastAudit"]["passed"] is True
    assert group["status"]["lastAudit"]["violationsTotal"] == 0

    report(False, 1)
    cond = wait_for("Consistent False", lambda: (c := consistent()).get("status") == "False" and c)
    assert cond["reason"] == "ViolationsFound"
    assert "1 violation" in cond["message"]
    group = kube.get("kdsyncgroup", "aud", ns)
    assert group is not None
    assert group["status"]["lastAudit"] == {
        **group["status"]["lastAudit"], "passed": False, "violationsTotal": 1, "result": "Failed",
    }  # fmt: skip
    printed = kube.run("get", "kdsyncgroup", "aud", "-n", ns).stdout
    assert "LAST AUDIT" in printed and "Failed" in printed

    kube.patch_status(
        "sparkapplication", "aud-audit", ns,
        {"applicationState": {"state": "FAILED", "errorMessage": "driver OOMKilled"}},
    )  # fmt: skip
    cond = wait_for(
        "Consistent Unknown", lambda: (c := consistent()).get("status") == "Unknown" and c
    )
    assert cond["reason"] == "AuditJobFailed"
    assert "driver OOMKilled" in cond["message"]


def test_scheduled_audit_follows_the_last_run(kube: Kube) -> None:
    ns = kube.namespace()
    kube.apply(group_manifest("sch", ns, checks={"enabled": True, "schedule": "0 */6 * * *"}))
    scheduled = wait_for(
        "the ScheduledSparkApplication",
        lambda: kube.get("scheduledsparkapplication", "sch-audit", ns),
    )
    assert scheduled["spec"]["schedule"] == "0 */6 * * *"
    assert scheduled["spec"]["template"]["type"] == "Python"
    assert scheduled["spec"]["template"]["sparkConf"] == {
        **AUDIT_SPARK_CONF,
        "spark.sql.shuffle.partitions": "8",
    }
    # What the spark-operator does on schedule: a run with the template, then lastRunName.
    run = {
        "apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
        "metadata": {"name": "sch-audit-1", "namespace": ns,
                     "labels": {"kdsync.io/group": "sch"}},
        "spec": scheduled["spec"]["template"],
    }  # fmt: skip
    kube.apply(run)
    kube.patch_status("scheduledsparkapplication", "sch-audit", ns, {"lastRunName": "sch-audit-1"})
    kube.run(
        "patch", "configmap", "sch-audit-report", "-n", ns, "--type=merge", "-p",
        json.dumps({"data": {"report.json": json.dumps({
            "version": 1, "group": "sch", "passed": True, "violationsTotal": 0,
            "summary": "ok", "finishedAt": "2030-01-01T00:00:00Z"})}}),
    )  # fmt: skip
    kube.patch_status(
        "sparkapplication", "sch-audit-1", ns, {"applicationState": {"state": "COMPLETED"}}
    )
    wait_for(
        "Consistent from the scheduled run",
        lambda: (
            (c := condition(kube.get("kdsyncgroup", "sch", ns), "Consistent"))
            and c.get("status") == "True"
        ),
    )
    group = kube.get("kdsyncgroup", "sch", ns)
    assert group is not None
    assert group["status"]["lastAudit"]["application"] == "sch-audit-1"


def test_delete_leaves_children_to_the_garbage_collector(kube: Kube) -> None:
    ns = kube.namespace()
    kube.apply(group_manifest("gone", ns))
    wait_for("StatefulSets", lambda: all(kube.get("sts", f"gone-{m}", ns) for m in MEMBERS))
    group = kube.get("kdsyncgroup", "gone", ns)
    assert group is not None
    assert group["spec"]["deletionPolicy"] == "Retain"  # the CRD's default
    owned = json.loads(
        kube.run("get", "sts,secret,svc,networkpolicy,sa", "-n", ns, "-o", "json").stdout
    )
    mine = [
        o for o in owned["items"]
        if o["metadata"].get("labels", {}).get("kdsync.io/group") == "gone"
    ]  # fmt: skip
    assert len(mine) >= 3 + 3 + 3 + 1 + 3
    for obj in mine:
        refs = obj["metadata"]["ownerReferences"]
        assert [(r["uid"], r["controller"]) for r in refs] == [(group["metadata"]["uid"], True)]
    # kopf must see the deletion and drop its finalizer: slow on a busy machine.
    kube.cp.kubectl(
        "delete", "kdsyncgroup", "gone", "-n", ns, "--wait=true", "--timeout=300s", timeout=330
    )
    assert kube.get("kdsyncgroup", "gone", ns) is None
