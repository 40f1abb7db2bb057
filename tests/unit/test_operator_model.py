"""Unit tests of the operator's pure modules: children, PKI, rollout plan, status, audit."""

from __future__ import annotations

import base64
import datetime
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from kdsync.audit.session import DEFAULT_SETTINGS
from kdsync.audit.spark_conf import REDACTION_REGEX
from kdsync.config import parse_config
from kdsync.runtime.metrics import SidecarMetrics
from kdsync_operator import audit, children, desired, pki, rollout, status, validation
from kdsync_operator.spec import Group, SpecProblem

REPO_ROOT = Path(__file__).resolve().parents[2]
NOW = "2030-01-01T00:00:00Z"


def make_group(generation: int = 1, **spec_extra: Any) -> Group:
    spec: dict[str, Any] = {
        "members": [
            {"name": "a", "kafka": {"bootstrapServers": "ka:9092"}},
            {"name": "b", "kafka": {"bootstrapServers": "kb:9092"}},
            {"name": "w", "witness": True},
        ],
        "topics": {"names": ["orders"]},
    }
    spec.update(spec_extra)
    return Group.from_object(
        {
            "metadata": {"name": "g", "namespace": "ns", "uid": "u-1", "generation": generation},
            "spec": spec,
        }
    )


def build(group: Group, secrets: dict[str, dict[str, str]] | None = None) -> desired.Children:
    return desired.build_children(group, pki.desired_pki_secrets(group, {}), secrets or {})


# --- children ------------------------------------------------------------------------


def test_every_member_config_is_a_valid_sidecar_config_differing_only_in_member() -> None:
    group = make_group(ordering={"tickMs": 20})
    configs = {}
    for member in ("a", "b", "w"):
        data, problems = children.sidecar_config(group, member)
        assert problems == []
        parsed = parse_config(data, check_files=False)
        assert parsed.member == member
        assert parsed.ordering.tick_ms == 20
        assert parsed.tls is not None and str(parsed.tls.cert) == "/etc/kdsync/tls/tls.crt"
        configs[member] = {k: v for k, v in data.items() if k != "member"}
    assert configs["a"] == configs["b"] == configs["w"]
    assert configs["a"]["members"][1]["peer"] == "g-b-0.g-peers.ns.svc:7070"


def test_memory_bounds_in_the_spec_reach_every_members_ordering_core() -> None:
    group = make_group(ordering={"maxLogBytes": 2 << 20, "maxApplyBytes": 1 << 20})
    for member in ("a", "b"):
        data, problems = children.sidecar_config(group, member)
        assert problems == []
        timing = parse_config(data, check_files=False).ordering.timing()
        assert (timing.max_log_bytes, timing.max_apply_bytes) == (2 << 20, 1 << 20)


def test_group_offset_sync_reaches_every_member_config() -> None:
    group = make_group(groupOffsetSync={"include": ["app-.*"], "intervalSeconds": 2})
    for member in ("a", "b", "w"):
        data, _ = children.sidecar_config(group, member)
        assert data["groupOffsetSync"] == {"include": ["app-.*"], "intervalSeconds": 2}
        sync = parse_config(data, check_files=False).group_offset_sync
        assert sync.enabled and sync.selects("app-eu") and sync.interval_seconds == 2
    data, _ = children.sidecar_config(make_group(groupOffsetSync={"exclude": ["x"]}), "a")
    assert "groupOffsetSync" not in data  # nothing selected: off, and no section at all


def test_children_carry_owner_references_and_group_labels() -> None:
    bundle = build(make_group())
    objects = bundle.shared + [o for objs in bundle.members.values() for o in objs]
    assert {o["kind"] for o in objects} == {
        "ServiceAccount", "Service", "NetworkPolicy", "Secret", "StatefulSet",
    }  # fmt: skip
    for obj in objects:
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        assert obj["metadata"]["ownerReferences"][0]["controller"] is True
        assert obj["metadata"]["labels"]["kdsync.io/group"] == "g"
    assert bundle.audit == []


def test_rdma_member_gets_sriov_resource_multus_annotation_and_ipc_lock() -> None:
    group = make_group(
        transport={"type": "rdma", "rdma": {"resourceName": "rdma/vf", "networkAttachment": "net1"}}
    )
    group = Group(
        group.name, group.namespace, group.uid, group.generation,
        group.spec.model_copy(update={"members": (
            group.spec.members[0],
            group.spec.members[1].model_copy(update={"transport": children_tcp()}),
            group.spec.members[2],
        )}),
    )  # fmt: skip
    bundle = build(group)
    rdma_sts = bundle.members["a"][1]
    pod = rdma_sts["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["resources"]["requests"]["rdma/vf"] == "1"
    assert container["resources"]["limits"]["rdma/vf"] == "1"
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "net1"
    tcp_pod = bundle.members["b"][1]["spec"]["template"]
    assert "k8s.v1.cni.cncf.io/networks" not in tcp_pod["metadata"]["annotations"]
    assert "add" not in tcp_pod["spec"]["containers"][0]["securityContext"]["capabilities"]
    # The rendered sidecar configs select the transport each member was given, and load.
    for member, expected in (("a", "rdma"), ("b", "tcp")):
        rendered, problems = children.sidecar_config(group, member)
        assert not problems
        loaded = parse_config(rendered, check_files=False)
        assert loaded.transport.type == expected
        assert (loaded.rdma_settings() is not None) == (expected == "rdma")


def children_tcp() -> Any:
    from kdsync_operator.spec import TransportSpec  # noqa: PLC0415

    return TransportSpec(type="tcp")


def test_kafka_properties_from_secret_and_ca_are_resolved() -> None:
    group = make_group(
        members=[
            {
                "name": "a",
                "kafka": {
                    "bootstrapServers": "ka:9093",
                    "properties": {"security.protocol": "SASL_SSL"},
                    "propertiesSecretRef": {"name": "creds"},
                    "caSecretRef": {"name": "ca", "key": "root.pem"},
                },
            },
            {"name": "b", "kafka": {"bootstrapServers": "kb:9092"}},
        ]
    )
    bundle = build(group, {"creds": {"sasl.password": "s3cret"}})
    assert bundle.problems == []
    text = base64.b64decode(bundle.members["b"][0]["data"]["config.yaml"]).decode()
    props = yaml.safe_load(text)["members"][0]["kafka"]["properties"]
    assert props == {
        "security.protocol": "SASL_SSL",
        "sasl.password": "s3cret",
        "ssl.ca.location": "/etc/kdsync/kafka/a/ca.crt",
    }
    volumes = bundle.members["b"][1]["spec"]["template"]["spec"]["volumes"]
    assert {"key": "root.pem", "path": "ca.crt"} in volumes[-1]["secret"]["items"]
    missing = build(group, {})
    assert [p.path for p in missing.problems] == ["spec.members[0].kafka.propertiesSecretRef.name"]


def _texts(obj: dict[str, Any]) -> str:
    """An object as JSON, plus its data decoded if it is a Secret."""
    text = json.dumps(obj)
    if obj.get("kind") == "Secret":
        text += "".join(base64.b64decode(v).decode() for v in (obj.get("data") or {}).values())
    return text


def test_a_secret_kafka_property_lands_in_secrets_only_never_in_status() -> None:
    """The password of propertiesSecretRef reaches the sidecars' config Secrets, and no
    ConfigMap, StatefulSet, audit object or status field (issue #16: secrets never appear)."""
    password = "pw-" + "7f3a9c" * 4
    group = make_group(
        members=[
            {
                "name": "a",
                "kafka": {
                    "bootstrapServers": "ka:9093",
                    "properties": {"security.protocol": "SASL_SSL", "sasl.username": "kd"},
                    "propertiesSecretRef": {"name": "creds"},
                },
            },
            {"name": "b", "kafka": {"bootstrapServers": "kb:9092"}},
            {"name": "w", "witness": True},
        ],
        checks={"enabled": True, "schedule": "@hourly"},
    )
    bundle = build(group, {"creds": {"sasl.password": password}})
    assert bundle.problems == []
    objects = [*bundle.shared, *(o for objs in bundle.members.values() for o in objs)]
    objects += bundle.audit
    holding = {(o["kind"], o["metadata"]["name"]) for o in objects if password in _texts(o)}
    assert holding, "the password reaches no sidecar config at all"
    assert {kind for kind, _ in holding} == {"Secret"}, holding
    # A Secret with a property kdsync refuses: the problem reaches the status (and the
    # operator's events), naming the property, never the values.
    refused = build(group, {"creds": {"sasl.password": password, "group.id": password}})
    assert [p.path for p in refused.problems] == ['spec.members[0].kafka.properties["group.id"]']
    observed = {m: obs(m) for m in ("a", "b", "w")}
    plan = rollout.plan_rollout(dict.fromkeys(observed, "new"), observed)
    st = status.build_status(group, observed, plan, NO_AUDIT, None, NOW, refused.problems)
    assert "group.id" in json.dumps(st)
    assert password not in json.dumps(st)


def test_config_hash_changes_with_the_spec_and_only_then() -> None:
    one = build(make_group()).hashes
    again = desired.build_children(
        make_group(), pki.desired_pki_secrets(make_group(), {}), {}
    ).hashes
    changed = build(make_group(ordering={"tickMs": 20})).hashes
    # New certificates are issued without existing Secrets, so compare with fixed PKI:
    group = make_group()
    fixed = pki.desired_pki_secrets(group, {})
    existing = {name: obj["data"] for name, obj in fixed.items()}
    reused = pki.desired_pki_secrets(group, existing)
    assert reused == fixed  # valid certificates are kept
    a = desired.build_children(group, reused, {}).hashes
    b = desired.build_children(group, fixed, {}).hashes
    assert a == b
    assert set(one) == set(again) == set(changed) == {"a", "b", "w"}
    assert all(changed[m] != one[m] for m in one)


def test_pki_reissues_a_member_certificate_signed_by_another_ca() -> None:
    group = make_group()
    first = pki.desired_pki_secrets(group, {})
    other = pki.desired_pki_secrets(group, {})
    existing = {name: obj["data"] for name, obj in first.items()}
    existing["g-b-tls"] = other["g-b-tls"]["data"]  # signed by the other CA
    later = pki.desired_pki_secrets(group, existing)
    assert later["g-a-tls"] == first["g-a-tls"]
    assert later["g-b-tls"]["data"]["tls.crt"] != other["g-b-tls"]["data"]["tls.crt"]
    assert later["g-b-tls"]["data"]["ca.crt"] == first["g-ca"]["data"]["ca.crt"]
    expiring = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=820)
    renewed = pki.desired_pki_secrets(group, existing, now=expiring)
    assert renewed["g-a-tls"]["data"]["tls.crt"] != first["g-a-tls"]["data"]["tls.crt"]


def test_audit_objects_for_a_one_off_and_a_scheduled_check() -> None:
    group = make_group(checks={"enabled": True})
    bundle = build(group)
    kinds = [o["kind"] for o in bundle.audit]
    assert kinds == [
        "ServiceAccount", "Role", "RoleBinding", "RoleBinding", "Secret", "ConfigMap",
        "SparkApplication",
    ]  # fmt: skip
    # The Role holds only the report; executor rights come from binding the chart's
    # audit-driver ClusterRole, in the group's namespace.
    role, binding, driver = bundle.audit[1:4]
    assert [r["resourceNames"] for r in role["rules"]] == [["g-audit-report"]]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "g-audit",
    }  # fmt: skip
    assert driver["roleRef"]["kind"] == "ClusterRole"
    assert driver["roleRef"]["name"] == audit.DEFAULT_DRIVER_CLUSTER_ROLE
    assert driver["metadata"]["namespace"] == "ns"
    assert driver["subjects"] == binding["subjects"]
    app = bundle.audit[-1]
    assert app["spec"]["arguments"] == [
        "--config", "/etc/kdsync/config.yaml", "--report-configmap", "ns/g-audit-report",
        "--verbose",
    ]  # fmt: skip
    assert app["spec"]["volumes"][0]["secret"]["secretName"] == "g-audit-config"
    # Under spark-submit the session exists before the audit runs: the settings the local
    # `kdsync audit` session gets for correctness and secrecy come with the application.
    assert app["spec"]["sparkConf"] == {
        "spark.redaction.regex": REDACTION_REGEX,  # hides the inline client key
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "8",  # not Spark's 200 tasks per shuffle
    }
    assert app["spec"]["sparkConf"].items() <= DEFAULT_SETTINGS.items()
    wide = make_group(checks={"enabled": True, "executor": {"cores": 4, "instances": 3}})
    assert build(wide).audit[-1]["spec"]["sparkConf"]["spark.sql.shuffle.partitions"] == "24"
    config = yaml.safe_load(base64.b64decode(bundle.audit[4]["data"]["config.yaml"]))
    assert parse_config(config, check_files=False).member == "a"  # the first data member
    scheduled = build(make_group(checks={"enabled": True, "schedule": "@hourly"})).audit[-1]
    assert scheduled["kind"] == "ScheduledSparkApplication"
    assert scheduled["spec"]["template"] == app["spec"]
    custom = build(make_group(checks={"enabled": True, "serviceAccountName": "spark"})).audit
    assert [o["kind"] for o in custom][:3] == ["Role", "RoleBinding", "RoleBinding"]
    assert custom[1]["subjects"][0]["name"] == custom[2]["subjects"][0]["name"] == "spark"
    # A pod may request less CPU than the tasks Spark runs (a small node fits the audit).
    assert "coreRequest" not in app["spec"]["driver"]
    small = make_group(checks={"enabled": True, "executor": {"cores": 2, "coreRequest": "250m"}})
    executor = build(small).audit[-1]["spec"]["executor"]
    assert (executor["cores"], executor["coreRequest"]) == (2, "250m")


# --- validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"topics": {"include": ["(["]}}, "spec.topics.include[0]"),
        ({"topics": {"names": ["x"], "exclude": ["+"]}}, "spec.topics.exclude[0]"),
        ({"topics": {"names": ["x-global"]}}, "spec.topics.names[0]"),
        ({"topics": {"names": ["x"], "globalPartitions": "many"}}, "spec.topics.globalPartitions"),
        ({"groupOffsetSync": {"include": ["(["]}}, "spec.groupOffsetSync.include[0]"),
        (
            {
                "members": [
                    {
                        "name": "a",
                        "kafka": {"bootstrapServers": "k:1", "properties": {"group.id": "x"}},
                    },
                    {"name": "b", "kafka": {"bootstrapServers": "k:2"}},
                ]
            },
            "spec.members[0].kafka.properties",
        ),
    ],
)
def test_webhook_problems_name_the_field(override: dict[str, Any], field: str) -> None:
    spec = {
        "members": [
            {"name": "a", "kafka": {"bootstrapServers": "k:1"}},
            {"name": "b", "kafka": {"bootstrapServers": "k:2"}},
        ],
        "topics": {"names": ["x"]},
        **override,
    }
    problems = validation.spec_problems("g", "ns", spec)
    assert problems, override
    assert any(p.path.startswith(field) for p in problems), problems
    assert all(p.fix for p in problems)


def test_examples_pass_the_webhook() -> None:
    for path in sorted((REPO_ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "KdsyncGroup":
                meta = doc["metadata"]
                assert validation.spec_problems(meta["name"], "default", doc["spec"]) == [], path


def test_the_rdma_example_renders_sidecar_configs_that_select_rdma() -> None:
    doc = yaml.safe_load((REPO_ROOT / "examples" / "three-members-rdma.yaml").read_text())
    doc["metadata"].update(uid="u-1", generation=1)
    group = Group.from_object(doc)
    selected = {}
    for member in ("a", "b", "c"):
        rendered, problems = children.sidecar_config(group, member)
        assert problems == []
        selected[member] = parse_config(rendered, check_files=False).transport.type
    # c's node has no RDMA NIC (its override); a and b talk RDMA to each other.
    assert selected == {"a": "rdma", "b": "rdma", "c": "tcp"}


# --- rollout -------------------------------------------------------------------------


def obs(name: str, ready: bool = True, hash: str = "new", exists: bool = True) -> Any:
    return rollout.MemberObservation(name, exists, ready, hash if exists else None)


DESIRED = {"a": "new", "b": "new", "c": "new"}


def test_missing_members_are_created_together() -> None:
    plan = rollout.plan_rollout(DESIRED, {})
    assert plan.apply == ("a", "b", "c")


def test_update_one_member_at_a_time_in_spec_order() -> None:
    observed = {m: obs(m, hash="old") for m in DESIRED}
    plan = rollout.plan_rollout(DESIRED, observed)
    assert plan.apply == ("a",) and plan.updating == "a"
    # a updated, not ready yet: nothing else moves.
    observed["a"] = obs("a", ready=False)
    plan = rollout.plan_rollout(DESIRED, observed)
    assert plan.apply == () and plan.waiting_for == ("a",)
    observed["a"] = obs("a")
    plan = rollout.plan_rollout(DESIRED, observed)
    assert plan.apply == ("b",)


def test_an_unready_outdated_member_is_updated_first_but_never_two_down() -> None:
    observed = {
        "a": obs("a", hash="old"),
        "b": obs("b", ready=False, hash="old"),
        "c": obs("c", hash="old"),
    }
    assert rollout.plan_rollout(DESIRED, observed).apply == ("b",)
    observed["c"] = obs("c", ready=False, hash="old")
    plan = rollout.plan_rollout(DESIRED, observed)
    assert plan.apply == () and set(plan.waiting_for) == {"b", "c"}


def test_a_change_of_shared_settings_updates_every_member_at_once() -> None:
    """Members whose members/topics settings differ refuse each other: rolled one at a
    time, the first would never be ready again and the rollout would wait for ever."""
    observed = {
        m: rollout.MemberObservation(m, True, m != "c", "old", agreement="shared-1")
        for m in DESIRED
    }
    plan = rollout.plan_rollout(DESIRED, observed, agreement="shared-2")
    assert plan.together and plan.apply == ("a", "b", "c")  # even with c not ready
    assert plan.notes and "every member restarts at once" in plan.notes[0]
    # Part of it applied (a pass cut short): the rest follows at once.
    observed["a"] = rollout.MemberObservation("a", True, False, "new", agreement="shared-2")
    plan = rollout.plan_rollout(DESIRED, observed, agreement="shared-2")
    assert plan.together and plan.apply == ("b", "c")
    # The same shared settings: one member at a time, as ever.
    same = {m: rollout.MemberObservation(m, True, True, "old", "shared-2") for m in DESIRED}
    plan = rollout.plan_rollout(DESIRED, same, agreement="shared-2")
    assert not plan.together and plan.apply == ("a",)
    # A StatefulSet of an older operator (no agreement annotation): not taken as a change.
    unknown = {m: obs(m, hash="old") for m in DESIRED}
    assert rollout.plan_rollout(DESIRED, unknown, agreement="shared-2").apply == ("a",)


def _agreement_hash(group: Group) -> str:
    sts = build(group).members["a"][1]
    value = children.agreement_hash(sts)
    assert value is not None
    return value


def _sidecar_agreement(group: Group) -> Any:
    data, _ = children.sidecar_config(group, "a")
    return parse_config(data, check_files=False).agreement()


@pytest.mark.parametrize(
    ("change", "shared"),
    [
        ({"ordering": {"tickMs": 20}}, False),
        ({"sidecar": {"podAnnotations": {"x": "1"}}}, False),
        ({"topics": {"names": ["orders", "refunds"]}}, True),
        ({"topics": {"names": ["orders"], "globalPartitions": 3}}, True),
        (
            {
                "members": [
                    {"name": "b", "kafka": {"bootstrapServers": "kb:9092"}},
                    {"name": "a", "kafka": {"bootstrapServers": "ka:9092"}},
                    {"name": "w", "witness": True},
                ]
            },
            True,
        ),
        (
            {
                "members": [
                    {"name": "a", "kafka": {"bootstrapServers": "elsewhere:9092"}},
                    {"name": "b", "kafka": {"bootstrapServers": "kb:9092"}},
                    {"name": "w", "witness": True},
                ]
            },
            False,
        ),
    ],
)
def test_the_agreement_hash_moves_exactly_when_the_sidecars_agreement_does(
    change: dict[str, Any], shared: bool
) -> None:
    before, after = make_group(), make_group(**change)
    assert (_sidecar_agreement(before) != _sidecar_agreement(after)) is shared
    assert (_agreement_hash(before) != _agreement_hash(after)) is shared


MEMBER_SPECS = [
    {"name": "a", "kafka": {"bootstrapServers": "ka:9092"}},
    {"name": "b", "kafka": {"bootstrapServers": "kb:9092"}},
    {"name": "w", "witness": True},
]


def test_reordering_or_readdressing_members_is_not_a_membership_change() -> None:
    old = {"members": MEMBER_SPECS}
    moved = {"members": [MEMBER_SPECS[1], MEMBER_SPECS[0], MEMBER_SPECS[2]]}
    readdressed = {
        "members": [{"name": "a", "kafka": {"bootstrapServers": "x:1"}}, *MEMBER_SPECS[1:]]
    }
    assert validation.membership_change_problems(old, moved) == []
    assert validation.membership_change_problems(old, readdressed) == []


def test_removed_members_are_deleted_after_the_rest_is_done() -> None:
    observed = {"a": obs("a"), "b": obs("b", hash="old"), "c": obs("c")}
    assert rollout.plan_rollout(DESIRED, observed, ["x"]).delete == ()
    observed["b"] = obs("b")
    assert rollout.plan_rollout(DESIRED, observed, ["x"]).delete == ("x",)


def test_statefulset_readiness_needs_the_current_generation_and_revision() -> None:
    base = {"metadata": {"generation": 2}}
    assert not rollout.statefulset_ready(None)
    assert not rollout.statefulset_ready(
        {**base, "status": {"observedGeneration": 1, "readyReplicas": 1}}
    )
    assert not rollout.statefulset_ready(
        {**base, "status": {"observedGeneration": 2, "readyReplicas": 1,
                            "currentRevision": "r1", "updateRevision": "r2"}}
    )  # fmt: skip
    assert rollout.statefulset_ready(
        {**base, "status": {"observedGeneration": 2, "readyReplicas": 1}}
    )


# --- status --------------------------------------------------------------------------


def conditions(st: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in st["conditions"]}


NO_AUDIT = audit.AuditOutcome("Unknown", "ChecksDisabled", "off")


def test_ready_when_every_member_is_ready_and_current() -> None:
    group = make_group(generation=3)
    observed = {m: obs(m) for m in ("a", "b", "w")}
    plan = rollout.plan_rollout(dict.fromkeys(observed, "new"), observed)
    st = status.build_status(group, observed, plan, NO_AUDIT, None, NOW)
    cond = conditions(st)
    assert cond["Ready"]["status"] == "True"
    assert cond["Progressing"]["status"] == "False"
    assert cond["Degraded"]["status"] == "False"
    assert cond["Consistent"]["status"] == "Unknown"
    assert {c["observedGeneration"] for c in st["conditions"]} == {3}
    assert st["observedGeneration"] == 3 and st["readyMembers"] == "3/3"
    # lastTransitionTime stays while the status does not change.
    again = status.build_status(group, observed, plan, NO_AUDIT, st, "2031-01-01T00:00:00Z")
    assert conditions(again)["Ready"]["lastTransitionTime"] == NOW


def test_rolling_member_is_progress_not_degradation() -> None:
    group = make_group(generation=2)
    observed = {"a": obs("a", ready=False), "b": obs("b", hash="old"), "w": obs("w", hash="old")}
    plan = rollout.plan_rollout(dict.fromkeys(observed, "new"), observed)
    st = status.build_status(group, observed, plan, NO_AUDIT, None, NOW, just_updated="a")
    cond = conditions(st)
    assert cond["Progressing"]["reason"] == "RollingUpdate"
    assert cond["Degraded"]["status"] == "False"
    assert st["rollout"]["updating"] == "a"
    # The next pass remembers the rolling member from the previous status.
    later = status.build_status(group, observed, plan, NO_AUDIT, st, NOW)
    assert conditions(later)["Degraded"]["status"] == "False"
    assert later["rollout"]["updating"] == "a"


def test_degraded_when_a_settled_member_fails_or_the_majority_is_lost() -> None:
    group = make_group()
    observed = {"a": obs("a"), "b": obs("b", ready=False), "w": obs("w")}
    plan = rollout.plan_rollout(dict.fromkeys(observed, "new"), observed)
    cond = conditions(status.build_status(group, observed, plan, NO_AUDIT, None, NOW))
    assert (cond["Degraded"]["status"], cond["Degraded"]["reason"]) == ("True", "MemberNotReady")
    observed["w"] = obs("w", ready=False)
    cond = conditions(status.build_status(group, observed, plan, NO_AUDIT, None, NOW))
    assert cond["Degraded"]["reason"] == "MajorityLost"
    assert cond["Ready"]["status"] == "False"


def test_config_problems_make_the_group_degraded() -> None:
    problem = SpecProblem("spec.x", "bad", "fix it")
    st = status.build_status(
        make_group(), {}, rollout.RolloutPlan(), NO_AUDIT, None, NOW, [problem]
    )
    assert conditions(st)["Degraded"]["reason"] == "ConfigInvalid"
    assert "spec.x" in conditions(st)["Ready"]["message"]


def test_transitions_become_events() -> None:
    group = make_group()
    observed = {m: obs(m) for m in ("a", "b", "w")}
    plan = rollout.plan_rollout(dict.fromkeys(observed, "new"), observed)
    first = status.build_status(group, observed, plan, NO_AUDIT, None, NOW)
    assert {t.condition for t in status.transitions(None, first)} == {
        "Ready", "Progressing", "Degraded", "Consistent",
    }  # fmt: skip
    assert status.transitions(first, first) == []
    observed["b"] = obs("b", ready=False)
    second = status.build_status(group, observed, plan, NO_AUDIT, first, NOW)
    changes = {t.condition: t for t in status.transitions(first, second)}
    assert changes["Degraded"].warning and not changes["Ready"].warning


def test_metrics_hook_reads_what_a_sidecar_exposes() -> None:
    # The text a leader's sidecar serves: delivered seq per topic, every member's lag.
    exposed = SidecarMetrics()
    exposed.delivered_seq.labels("orders").set(41)
    exposed.delivered_seq.labels("payments").set(42)
    for member, lag in (("a", 0), ("b", 3), ("w", 7)):
        exposed.member_lag.labels(member).set(lag)
    text = generate_latest(exposed.registry).decode()
    assert status.parse_metrics(text, "a") == status.MemberMetrics(42, 0)
    assert status.parse_metrics(text, "b") == status.MemberMetrics(42, 3)
    assert status.parse_metrics("", "a") == status.MemberMetrics(None, None)
    assert status.parse_metrics("<html>not metrics</html>", "a") == status.MemberMetrics()
    observed = {m: obs(m) for m in ("a", "b", "w")}
    plan = rollout.plan_rollout(dict.fromkeys(observed, "new"), observed)
    st = status.build_status(
        make_group(), observed, plan, NO_AUDIT, None, NOW,
        metrics={"a": status.MemberMetrics(10, 0), "b": status.MemberMetrics(7, 3)},
    )  # fmt: skip
    assert st["deliveredSeq"] == 7
    assert st["members"][1] == {
        "name": "b", "witness": False, "ready": True, "updated": True, "deliveredSeq": 7, "lag": 3,
    }  # fmt: skip


def test_metrics_hook_reports_t_global_config_drift_per_member() -> None:
    exposed = SidecarMetrics()
    exposed.topic_config_drift.labels("orders-global", "partitions").set(1)
    exposed.topic_config_drift.labels("orders-global", "cleanup.policy").set(0)  # put back
    text = generate_latest(exposed.registry).decode()
    facts = status.parse_metrics(text, "a")
    assert facts.config_drift == ("orders-global partitions",)
    observed = {m: obs(m) for m in ("a", "b", "w")}
    plan = rollout.plan_rollout(dict.fromkeys(observed, "new"), observed)
    st = status.build_status(make_group(), observed, plan, NO_AUDIT, None, NOW,
                             metrics={"a": facts, "b": status.MemberMetrics(7, 3)})  # fmt: skip
    assert st["members"][0]["globalTopicConfigDrift"] == ["orders-global partitions"]
    assert "globalTopicConfigDrift" not in st["members"][1]


# --- audit outcome -------------------------------------------------------------------


def app_in(state: str, **status_extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": "g-audit"},
            "status": {"applicationState": {"state": state}, **status_extra}}  # fmt: skip


def report_cm(**fields: Any) -> dict[str, Any]:
    body = {"version": 1, "group": "g", "passed": True, "violationsTotal": 0, "summary": "ok",
            "finishedAt": "2030-01-01T00:05:00Z", **fields}  # fmt: skip
    return {"data": {"report.json": json.dumps(body)}}


@pytest.mark.parametrize(
    ("app", "report", "expected"),
    [
        (None, None, ("Unknown", "NoAuditYet")),
        (app_in(""), None, ("Unknown", "NoAuditYet")),  # created, not yet submitted
        (app_in("RUNNING"), None, ("Unknown", "AuditRunning")),
        (app_in("SUBMISSION_FAILED"), report_cm(), ("Unknown", "AuditJobFailed")),
        (app_in("FAILED"), report_cm(), ("Unknown", "AuditJobFailed")),
        # The driver exits 1 on violations, so the run ends FAILED with a fresh report.
        (
            app_in("FAILED", lastSubmissionAttemptTime="2030-01-01T00:00:00Z"),
            report_cm(passed=False, violationsTotal=2),
            ("False", "ViolationsFound"),
        ),
        (  # ... but a failing report older than the run is not its verdict
            app_in("FAILED", lastSubmissionAttemptTime="2030-01-02T00:00:00Z"),
            report_cm(passed=False, violationsTotal=2),
            ("Unknown", "AuditJobFailed"),
        ),
        (  # ... and a run that failed after a passing report proved nothing
            app_in("FAILED", lastSubmissionAttemptTime="2030-01-01T00:00:00Z"),
            report_cm(),
            ("Unknown", "AuditJobFailed"),
        ),
        (app_in("COMPLETED"), None, ("Unknown", "ReportMissing")),
        (app_in("COMPLETED"), {"data": {"report.json": "{"}}, ("Unknown", "ReportMissing")),
        (app_in("COMPLETED"), report_cm(group="other"), ("Unknown", "ReportMissing")),
        (app_in("COMPLETED"), report_cm(version=2), ("Unknown", "ReportMissing")),
        (
            app_in("COMPLETED", lastSubmissionAttemptTime="2030-01-02T00:00:00Z"),
            report_cm(),
            ("Unknown", "ReportMissing"),
        ),
        (app_in("COMPLETED"), report_cm(), ("True", "AuditPassed")),
        (
            app_in("COMPLETED"),
            report_cm(passed=False, violationsTotal=4),
            ("False", "ViolationsFound"),
        ),
    ],
)
def test_audit_outcome(
    app: dict[str, Any] | None, report: dict[str, Any] | None, expected: tuple[str, str]
) -> None:
    outcome = audit.audit_outcome(make_group(checks={"enabled": True}), app, report)
    assert (outcome.status, outcome.reason) == expected, outcome.message
    if expected[0] != "Unknown":
        assert outcome.last_audit is not None
        assert outcome.last_audit["passed"] is (expected[0] == "True")


def test_a_new_scheduled_run_keeps_the_last_verdict_until_it_ends() -> None:
    group = make_group(checks={"enabled": True, "schedule": "@hourly"})
    observed = {m: obs(m) for m in ("a", "b", "w")}
    plan = rollout.plan_rollout(dict.fromkeys(observed, "new"), observed)
    passed = audit.audit_outcome(group, app_in("COMPLETED"), report_cm())
    first = status.build_status(group, observed, plan, passed, None, NOW)
    consistent = next(c for c in first["conditions"] if c["type"] == "Consistent")
    assert consistent["status"] == "True"
    # The next run was just created (no state yet), then runs: neither proves anything.
    later = "2030-01-01T01:00:00Z"
    for state in ("", "RUNNING"):
        running = audit.audit_outcome(group, app_in(state), report_cm())
        assert running.in_progress and running.status == "Unknown"
        st = status.build_status(group, observed, plan, running, first, later)
        kept = next(c for c in st["conditions"] if c["type"] == "Consistent")
        assert {k: v for k, v in kept.items() if k != "message"} == {
            k: v for k, v in consistent.items() if k != "message"
        }
        assert kept["message"] == f"{consistent['message']} (meanwhile: {running.message})"
        assert kept["message"].endswith(
            "has not been submitted yet)" if not state else f"is {state})"
        ), kept
        assert st["lastAudit"] == first["lastAudit"]
        # A second reconcile during the same run does not pile the note up.
        again = status.build_status(group, observed, plan, running, st, later)
        assert next(c for c in again["conditions"] if c["type"] == "Consistent") == kept
    # Without an earlier verdict, a running audit is simply Unknown.
    running = audit.audit_outcome(group, app_in("RUNNING"), None)
    st = status.build_status(group, observed, plan, running, None, later)
    assert next(c for c in st["conditions"] if c["type"] == "Consistent")["status"] == "Unknown"


def test_a_changed_audit_schedule_is_noticed() -> None:
    hourly = build(make_group(checks={"enabled": True, "schedule": "@hourly"})).audit[-1]
    often = build(make_group(checks={"enabled": True, "schedule": "*/5 * * * *"})).audit[-1]
    assert audit.schedule_changed(hourly, often)
    assert not audit.schedule_changed(hourly, hourly)
    assert not audit.schedule_changed(None, often)  # created now: nothing to reset
    one_off = build(make_group(checks={"enabled": True})).audit[-1]
    assert not audit.schedule_changed(hourly, one_off)


def test_checks_disabled_and_last_run_name() -> None:
    assert audit.audit_outcome(make_group(), app_in("COMPLETED"), report_cm()).reason == (
        "ChecksDisabled"
    )
    assert audit.last_run_name({"status": {"lastRunName": "g-audit-17"}}) == "g-audit-17"
    assert audit.last_run_name({"status": {}}) is None
