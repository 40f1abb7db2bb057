"""kdsync as a user runs it: Helm, kubectl, the spark-operator, real pods on a real kubelet.

The tests run in file order and build on each other (one group, one traffic history):
install, a group from examples/ becoming Ready, traffic checked by the independent
checker, a sidecar pod killed under traffic, a spec change rolled out member by member,
the witness removed and another added, then a data member added with a Spark backfill
and removed again, by editing `members` under traffic, the witness removed by hand (drift
reported, then the spec made to agree: two data members from then on), a scheduled
audit through the spark-operator (passing, then catching an injected
duplicate), helm upgrade, helm uninstall. The figures they measure are printed at the end
and written to .kdsync-run/e2e-figures.json.
"""

from __future__ import annotations

import base64
import datetime
import itertools
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from kdsync_operator import children
from kdsync_operator.pki import operator_credentials
from kdsync_operator.spec import Group
from tests.e2e.conftest import (
    NAMESPACE,
    OPERATOR_NAMESPACE,
    RELEASE,
    REPO_ROOT,
    Cluster,
    dump_state,
    wait_for,
)

pytestmark = pytest.mark.e2e

EXAMPLE = REPO_ROOT / "examples" / "dev-group.yaml"
GROUP = "demo"
MEMBERS = ("one", "two", "witness")  # spec order
DATA_MEMBERS = {"one": "kafka-one:9092", "two": "kafka-two:9092"}
CHECK_MEMBERS = [arg for m, b in DATA_MEMBERS.items() for arg in ("--member", f"{m}={b}")]
# The live group at moments whose Argo CD health is known: <expected health>-<moment>.yaml.
SNAPSHOTS = REPO_ROOT / ".kdsync-run" / "e2e-kdsyncgroups"


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _pod_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _ready_since(pod: dict[str, Any]) -> datetime.datetime | None:
    for condition in pod.get("status", {}).get("conditions", []):
        if condition["type"] == "Ready" and condition["status"] == "True":
            return _time(condition["lastTransitionTime"])
    return None


def _sidecar_pods(cluster: Cluster) -> dict[str, dict[str, Any]]:
    selector = f"kdsync.io/group={GROUP},app.kubernetes.io/component=sidecar"
    pods = cluster.items("pods", selector=selector)
    return {p["metadata"]["labels"]["kdsync.io/member"]: p for p in pods}


def _restart_steps(
    cluster: Cluster, member: str, deleted_at: datetime.datetime
) -> dict[str, float]:
    """Where a sidecar pod's restart went, from the deletion: the new pod's creation (the
    old one had terminated: a StatefulSet waits for it), its container's start, the
    sidecar's first log line, its "running" line (Kafka opened, ordering log recovered,
    peer listener up) and its first line following or leading, and the pod's Ready
    condition (the readiness probe; the pod's log is kept in .kdsync-run/e2e-pod-logs).
    Kubernetes' own times are whole seconds; the log's are exact."""
    pod = _sidecar_pods(cluster)[member]
    name = pod["metadata"]["name"]
    steps: dict[str, datetime.datetime | None] = {
        "new pod created": _time(pod["metadata"]["creationTimestamp"]),
        "container started": None,
        "sidecar first log line": None,
        "sidecar running": None,
        "sidecar follows or leads": None,
        "pod Ready": _ready_since(pod),
    }
    for status in pod.get("status", {}).get("containerStatuses", []):
        started = status.get("state", {}).get("running", {}).get("startedAt")
        if status.get("name") == "kdsync" and started:
            steps["container started"] = _time(started)
    logs = cluster.kubectl("logs", name, "-c", "kdsync", "-n", NAMESPACE, "--timestamps")
    for line in logs.stdout.splitlines():
        stamp, _, text = line.partition(" ")
        at = _time(stamp[:26] + "Z" if len(stamp) > 27 else stamp)
        steps["sidecar first log line"] = steps["sidecar first log line"] or at
        if steps["sidecar running"] is None and re.search(r"member \S+ of group \S+ running", text):
            steps["sidecar running"] = at
        if steps["sidecar follows or leads"] is None and re.search(
            r"term \d+: (follower|leader): ", text
        ):
            steps["sidecar follows or leads"] = at
    return {
        step: round((at - deleted_at).total_seconds(), 1)
        for step, at in steps.items()
        if at is not None
    }


def _group_ready(cluster: Cluster) -> bool:
    group = cluster.get("kdg", GROUP) or {}
    ready = cluster.condition("kdg", GROUP, "Ready")
    generation = group.get("metadata", {}).get("generation")
    return ready.get("status") == "True" and ready.get("observedGeneration") == generation


def _snapshot(cluster: Cluster, label: str) -> None:
    """Keeps the live group as it is now (for hack/argocd-health, which evaluates Argo CD's
    health check on it with Argo CD's own code)."""
    SNAPSHOTS.mkdir(parents=True, exist_ok=True)
    text = cluster.kubectl("get", "kdg", GROUP, "-n", NAMESPACE, "-o", "yaml").stdout
    (SNAPSHOTS / f"{label}.yaml").write_text(text)


def _progressing(cluster: Cluster) -> bool:
    return cluster.condition("kdg", GROUP, "Progressing").get("status") == "True"


def _bad_group(name: str) -> dict[str, Any]:
    """Valid for the CRD's schema and CEL rules; only the webhook's code can refuse it (an
    include pattern that is not a regular expression)."""
    return {
        "apiVersion": "kdsync.io/v1alpha1",
        "kind": "KdsyncGroup",
        "metadata": {"name": name},
        "spec": {
            "members": [
                {"name": "a", "kafka": {"bootstrapServers": "kafka-one:9092"}},
                {"name": "b", "kafka": {"bootstrapServers": "kafka-two:9092"}},
            ],
            "topics": {"include": ["(["]},
        },
    }


def _webhook_refuses_a_bad_group(cluster: Cluster) -> None:
    result = cluster.kubectl(
        "apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(_bad_group("bad")), check=False
    )
    assert result.returncode != 0
    assert 'admission webhook "validate-kdsyncgroup.kdsync.io" denied' in result.stderr
    assert "spec.topics.include[0]" in result.stderr
    assert cluster.get("kdg", "bad") is None


@pytest.fixture(scope="package")
def group(
    cluster: Cluster, release: str, kafka: dict[str, str], figures: dict[str, float]
) -> Iterator[str]:
    """examples/dev-group.yaml applied with kubectl, waited for with kubectl wait."""
    began = time.monotonic()
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", str(EXAMPLE))
    result = cluster.kubectl(
        "wait",
        "--for=condition=Ready",
        f"kdsyncgroup/{GROUP}",
        "-n",
        NAMESPACE,
        "--timeout=600s",
        check=False,
        timeout=620,
    )
    if result.returncode != 0:
        pytest.fail(f"{result.stderr}\n{dump_state(cluster)}", pytrace=False)
    figures["kubectl apply -> kubectl wait Ready"] = round(time.monotonic() - began, 1)
    _snapshot(cluster, "Healthy-ready")
    yield GROUP


@pytest.fixture(scope="package")
def traffic() -> dict[str, int]:
    """Events produced so far, per origin (the tests add to it)."""
    return dict.fromkeys(DATA_MEMBERS, 0)


def _produce(cluster: Cluster, traffic: dict[str, int], events: int, rate: float = 0) -> list[str]:
    pods = []
    for origin, bootstrap in DATA_MEMBERS.items():
        pods.append(
            cluster.tool_pod(
                "produce",
                "--bootstrap",
                bootstrap,
                "--origin",
                origin,
                "--topic",
                "events",
                "--events",
                str(events),
                "--rate",
                str(rate),
                "--first",
                str(traffic[origin]),
            )
        )
        traffic[origin] += events
    return pods


def _watch_delivery(cluster: Cluster, events: int) -> str:
    """A tool pod reading member one's T-global from its end until ``events`` more have
    arrived (``kafka_tool.py watch``); returns once it is positioned, so that traffic
    started after this is all seen."""
    pod = cluster.tool_pod(
        "watch", "--bootstrap", DATA_MEMBERS["one"], "--topic", "events-global",
        "--expect", str(events), "--timeout", "1500",
    )  # fmt: skip

    def positioned() -> bool:
        logs = cluster.kubectl("logs", "-n", NAMESPACE, pod, check=False).stdout
        return '{"watching"' in logs

    wait_for("the delivery watch to be positioned", positioned, timeout=300, interval=0.5)
    return pod


def _longest_pause(cluster: Cluster, watch: str, timeline: str) -> float:
    """The longest time member one delivered nothing while the watched traffic ran; the
    watch fails the test if it did not see every event. Where the pause fell among the
    namespace's events (pods killed, created, started, the operator's membership
    changes) goes to .kdsync-run/e2e-timeline-<timeline>.json."""
    result = cluster.tool_result(watch, timeout=600)
    print(f"delivery at member one during the edit: {json.dumps(result)}")
    longest = float(result["longest_gap_s"])
    began = _time(str(result["gap_began_at"]))
    rows = [
        (began.isoformat(), f"delivery pause at one begins ({longest} s)"),
        ((began + datetime.timedelta(seconds=longest)).isoformat(), "delivery pause ends"),
    ]
    for event in cluster.items("events"):
        involved = event.get("involvedObject") or {}
        if involved.get("kind") in ("Pod", "StatefulSet", "KdsyncGroup"):
            with_time = event.get("eventTime") or event.get("lastTimestamp")
            if with_time:
                what = f"{involved.get('name')}: {event.get('reason')}: {event.get('message')}"
                rows.append((_time(str(with_time)).isoformat(), what[:200]))
    first = began - datetime.timedelta(seconds=120)
    last = began + datetime.timedelta(seconds=longest + 30)
    shown = sorted(r for r in rows if first <= _time(r[0]) <= last)
    path = REPO_ROOT / ".kdsync-run" / f"e2e-timeline-{timeline}.json"
    path.write_text(json.dumps(shown, indent=1))
    return longest


def _check(
    cluster: Cluster, traffic: dict[str, int], also: dict[str, str] | None = None
) -> dict[str, Any]:
    """Every event once, in one order, in the T-global of every data member (and of the
    members in ``also``: name -> bootstrap)."""
    total = sum(traffic.values())
    extra = [arg for m, b in (also or {}).items() for arg in ("--member", f"{m}={b}")]
    result = cluster.tool(
        "check",
        *CHECK_MEMBERS,
        *extra,
        "--topic",
        "events",
        "--expect",
        str(total),
        "--timeout",
        "300",
        timeout=400,
    )
    assert result["problems"] == [], result
    assert result["ok"] and result["events"] == total, result
    return result


# --- install --------------------------------------------------------------------------------


def test_helm_install_runs_the_operator_in_a_pod_that_serves_the_webhook(
    cluster: Cluster, release: str
) -> None:
    pods = cluster.items("pods", OPERATOR_NAMESPACE, "app.kubernetes.io/name=kdsync-operator")
    assert len(pods) == 1 and _pod_ready(pods[0]), pods
    operator = pods[0]
    assert operator["spec"]["containers"][0]["image"] == "kdsync-operator:dev"
    security = operator["spec"]["containers"][0]["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert operator["spec"]["securityContext"]["runAsNonRoot"] is True
    # The webhook Service leads to that pod, and nowhere else: no operator runs on the host.
    slices = cluster.items(
        "endpointslices", OPERATOR_NAMESPACE, f"kubernetes.io/service-name={release}-webhook"
    )
    addresses = [a for s in slices for e in s.get("endpoints") or [] for a in e["addresses"]]
    assert addresses == [operator["status"]["podIP"]]
    _webhook_refuses_a_bad_group(cluster)


def test_example_group_becomes_ready_with_one_nonroot_readonly_pod_per_member(
    cluster: Cluster, group: str
) -> None:
    pods = _sidecar_pods(cluster)
    assert sorted(pods) == sorted(MEMBERS)
    for member, pod in pods.items():
        assert _pod_ready(pod), member
        container = pod["spec"]["containers"][0]
        assert container["image"] == "kdsync-sidecar:dev"
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    status = (cluster.get("kdg", GROUP) or {})["status"]
    assert status["readyMembers"] == "3/3", status
    # The operator read each member's metrics from its pod over the pod network (its lag;
    # deliveredSeq appears with the first delivery).
    members = {m["name"]: m for m in status["members"]}
    assert all("lag" in members[m] for m in MEMBERS), members
    # At a resync it read the quiet group's configuration over the admin listeners
    # (mutual TLS) and found the spec's members there.
    match = wait_for(
        "the operator to compare the group's members with the spec's",
        lambda: (
            (c := cluster.condition("kdg", GROUP, "MembersMatchSpec"))
            and c.get("reason") != "NotCompared"
            and c
        ),
        timeout=90,
    )
    assert (match["status"], match["reason"]) == ("True", "MatchSpec"), match
    assert all(m in match["message"] for m in MEMBERS), match


# --- traffic --------------------------------------------------------------------------------


def test_traffic_from_both_regions_lands_once_and_in_one_order_everywhere(
    cluster: Cluster, group: str, traffic: dict[str, int]
) -> None:
    for pod in _produce(cluster, traffic, 1500):
        assert cluster.tool_result(pod)["produced"] == 1500
    _check(cluster, traffic)


def test_a_sidecar_pod_killed_under_traffic_is_recreated_and_exactly_once_holds(
    cluster: Cluster, group: str, traffic: dict[str, int], figures: dict[str, float]
) -> None:
    producers = _produce(cluster, traffic, 3000, rate=150)  # about 20 s of traffic
    wait_for(
        "producers running",
        lambda: all(
            (cluster.get("pod", p) or {}).get("status", {}).get("phase") == "Running"
            for p in producers
        ),
        timeout=120,
    )
    old = _sidecar_pods(cluster)["one"]["metadata"]["uid"]
    began = time.monotonic()
    deleted_at = datetime.datetime.now(datetime.UTC)
    cluster.kubectl("delete", "pod", f"{GROUP}-one-0", "-n", NAMESPACE, "--wait=false")

    def replaced_and_ready() -> bool:
        pod = _sidecar_pods(cluster).get("one")
        return pod is not None and pod["metadata"]["uid"] != old and _pod_ready(pod)

    wait_for("the recreated sidecar pod to be Ready", replaced_and_ready, timeout=300, interval=0.5)
    figures["sidecar pod deleted -> new pod Ready"] = round(time.monotonic() - began, 1)
    for step, seconds in _restart_steps(cluster, "one", deleted_at).items():
        figures[f"sidecar pod deleted -> {step}"] = seconds
    wait_for(
        "the group to be Ready again", lambda: _group_ready(cluster), timeout=300, interval=0.5
    )
    figures["sidecar pod deleted -> group Ready"] = round(time.monotonic() - began, 1)
    for pod in producers:
        assert cluster.tool_result(pod)["produced"] == 3000
    _check(cluster, traffic)


# --- rollout --------------------------------------------------------------------------------


def test_a_spec_change_rolls_out_one_member_at_a_time_on_real_readiness(
    cluster: Cluster, group: str, traffic: dict[str, int], figures: dict[str, float]
) -> None:
    before = {m: p["metadata"]["uid"] for m, p in _sidecar_pods(cluster).items()}
    began = time.monotonic()
    patch = {"spec": {"sidecar": {"podAnnotations": {"e2e.kdsync.io/rollout": "1"}}}}
    cluster.kubectl("patch", "kdg", GROUP, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch))
    samples: list[dict[str, bool]] = []
    progressing_seen = False

    def rolled() -> bool:
        nonlocal progressing_seen
        pods = _sidecar_pods(cluster)
        samples.append({m: m in pods and _pod_ready(pods[m]) for m in MEMBERS})
        if not progressing_seen and _progressing(cluster):
            progressing_seen = True
            _snapshot(cluster, "Progressing-rolling")
        replaced = all(m in pods and pods[m]["metadata"]["uid"] != before[m] for m in MEMBERS)
        return replaced and all(samples[-1].values()) and _group_ready(cluster)

    wait_for("every member on the new spec", rolled, timeout=600, interval=0.5)
    figures["spec change -> all 3 members rolled, group Ready"] = round(time.monotonic() - began, 1)
    assert progressing_seen
    # Never two members down at once (sampled every half second)...
    assert all(sum(not ready for ready in sample.values()) <= 1 for sample in samples), samples
    # ... and, from the pods' own timestamps: each member's new pod was created only after
    # the previous member's new pod had become Ready (spec order).
    pods = _sidecar_pods(cluster)
    for previous, member in itertools.pairwise(MEMBERS):
        ready = _ready_since(pods[previous])
        created = _time(pods[member]["metadata"]["creationTimestamp"])
        assert ready is not None and created >= ready, (previous, member, ready, created)
    rollout = (cluster.get("kdg", GROUP) or {})["status"].get("rollout", {})
    assert not rollout.get("outdated"), rollout
    for pod in _produce(cluster, traffic, 500):
        cluster.tool_result(pod)
    _check(cluster, traffic)


def test_a_topics_change_restarts_every_member_together_and_the_group_comes_back(
    cluster: Cluster, group: str, traffic: dict[str, int], figures: dict[str, float]
) -> None:
    """Members with different topics settings refuse each other, so the operator restarts
    them all at once rather than one by one (docs/operations.md): the group must come
    back by itself, and what was produced before and after lands exactly once."""
    before = {m: p["metadata"]["uid"] for m, p in _sidecar_pods(cluster).items()}
    began = time.monotonic()
    patch = {"spec": {"topics": {"names": ["events", "events-later"]}}}
    cluster.kubectl("patch", "kdg", GROUP, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch))

    def replaced_and_ready() -> bool:
        pods = _sidecar_pods(cluster)
        replaced = all(m in pods and pods[m]["metadata"]["uid"] != before[m] for m in MEMBERS)
        return replaced and all(_pod_ready(pods[m]) for m in MEMBERS) and _group_ready(cluster)

    wait_for("every member restarted on the new topics", replaced_and_ready, timeout=600)
    figures["topics change -> all 3 members restarted, group Ready"] = round(
        time.monotonic() - began, 1
    )
    # (That the StatefulSets are updated all in one pass, without waiting for readiness,
    # is tested against the API server: tests/integration/operator/test_operator.py.)
    for pod in _produce(cluster, traffic, 500):
        cluster.tool_result(pod)
    _check(cluster, traffic)


def _membership_settled(cluster: Cluster, members: tuple[str, ...]) -> bool:
    """The group runs exactly ``members`` (pods and StatefulSets), is Ready on its
    generation, and reports nothing joining or leaving."""
    obj = cluster.get("kdg", GROUP) or {}
    progress = (obj.get("status") or {}).get("membership") or {}
    pods = _sidecar_pods(cluster)
    sets = {
        s["metadata"]["labels"]["kdsync.io/member"]
        for s in cluster.items("statefulsets", selector=f"kdsync.io/group={GROUP}")
    }
    return (
        not any(progress.values())
        and sets == set(members)
        and set(pods) == set(members)
        and all(_pod_ready(p) for p in pods.values())
        and _group_ready(cluster)
    )


def _membership_events(cluster: Cluster) -> list[str]:
    return [str(e.get("message", "")) for e in _membership_event_objects(cluster)]


def _membership_event_objects(cluster: Cluster) -> list[dict[str, Any]]:
    return [
        e
        for e in cluster.items("events")
        if e.get("reason") == "MembershipChange"
        and (e.get("involvedObject") or {}).get("name") == GROUP
    ]


def _event_time(event: dict[str, Any]) -> datetime.datetime:
    stamp = event.get("eventTime") or event.get("firstTimestamp") or event.get("lastTimestamp")
    assert isinstance(stamp, str), event
    return _time(stamp)


def test_editing_members_removes_the_witness_then_adds_another_at_runtime_under_traffic(
    cluster: Cluster, group: str, traffic: dict[str, int], figures: dict[str, float]
) -> None:
    """The two-region deployment loses its witness and gains another by `members` edits
    alone: the operator asks the group's leader over the sidecars' admin listeners
    (mutual TLS, its own certificate from the group CA), deletes the removed witness's
    StatefulSet only once the group no longer counts it, and creates the new one before
    asking. Traffic runs throughout and lands exactly once, in one order, everywhere."""
    watch = _watch_delivery(cluster, 4000 * len(DATA_MEMBERS))
    producers = _produce(cluster, traffic, 4000, rate=50)
    joining_seen: list[str] = []
    began = time.monotonic()
    cluster.kubectl(
        "patch", "kdg", GROUP, "-n", NAMESPACE, "--type=json",
        "-p", json.dumps([{"op": "remove", "path": "/spec/members/2"}]),
    )  # fmt: skip
    wait_for(
        "the witness out of the group and its StatefulSet gone",
        lambda: _membership_settled(cluster, ("one", "two")),
        timeout=600,
    )
    figures["members edit: witness removed, group Ready"] = round(time.monotonic() - began, 1)
    assert any("{'remove': 'witness'}: 200" in m for m in _membership_events(cluster))
    # Two changes at once would let two majorities decide apart: the webhook refuses them.
    three = {"name": "three", "kafka": {"bootstrapServers": "kafka-one:9092"}}
    two_at_once = [
        {"op": "add", "path": "/spec/members/-", "value": {"name": "w1", "witness": True}},
        {"op": "add", "path": "/spec/members/-", "value": three},
    ]
    refused = cluster.kubectl(
        "patch", "kdg", GROUP, "-n", NAMESPACE, "--type=json", "-p", json.dumps(two_at_once),
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "one member at a time" in refused.stderr, refused.stderr
    began = time.monotonic()
    add = [{"op": "add", "path": "/spec/members/-", "value": {"name": "arbiter", "witness": True}}]
    cluster.kubectl("patch", "kdg", GROUP, "-n", NAMESPACE, "--type=json", "-p", json.dumps(add))

    def joined() -> bool:
        joining = cluster.condition("kdg", GROUP, "Joining")
        if joining.get("status") == "True":
            joining_seen.append(str(joining.get("reason")))
        return _membership_settled(cluster, ("one", "two", "arbiter"))

    wait_for("the new witness in the group", joined, timeout=600, interval=0.5)
    figures["members edit: witness added, group Ready"] = round(time.monotonic() - began, 1)
    assert joining_seen, "the Joining condition was never True"
    added = [
        e
        for e in _membership_event_objects(cluster)
        if "'add': 'arbiter'" in e.get("message", "") and ": 200 appended" in e["message"]
    ]
    assert added, _membership_events(cluster)
    # The others rolled onto the new member list only after the group took the change
    # (before, the others would refuse them); the witness's pod was there before it.
    pods = _sidecar_pods(cluster)
    appended = min(_event_time(e) for e in added).replace(microsecond=0)  # whole seconds
    for member in ("one", "two"):
        assert _time(pods[member]["metadata"]["creationTimestamp"]) >= appended, member
    assert _time(pods["arbiter"]["metadata"]["creationTimestamp"]) <= appended
    for pod in producers:
        cluster.tool_result(pod, timeout=600)
    figures["members edits (witness out, witness in): longest delivery pause at one"] = (
        _longest_pause(cluster, watch, "witness-out-in")
    )
    _check(cluster, traffic)


def _third_kafka_cluster(cluster: Cluster) -> str:
    """kafka-three: examples/dev-kafka.yaml's kafka-one under another name, ready, with
    topic ``events``."""
    listing = yaml.safe_load((REPO_ROOT / "examples" / "dev-kafka.yaml").read_text())
    one = [item for item in listing["items"] if item["metadata"]["name"] == "kafka-one"]
    renamed = json.loads(json.dumps(one).replace("kafka-one", "kafka-three"))
    cluster.apply({"apiVersion": "v1", "kind": "List", "items": renamed})
    cluster.kubectl(
        "rollout", "status", "statefulset/kafka-three", "-n", NAMESPACE, "--timeout=300s",
        timeout=320,
    )  # fmt: skip
    cluster.tool("topic", "--bootstrap", "kafka-three:9092", "--topic", "events", timeout=180)
    return "kafka-three:9092"


def test_editing_members_adds_a_data_member_with_a_spark_backfill_then_removes_it(
    cluster: Cluster,
    group: str,
    spark_operator: None,
    traffic: dict[str, int],
    figures: dict[str, float],
) -> None:
    """A third region joins by a `members` edit under traffic: the leader adds it as a
    learner, a backfill SparkApplication seeds its cluster with a peer's T-global, only
    then is its sidecar started, and it ends with every event once in the same order as
    the others. The backfill's driver is killed once it runs: the group says the backfill
    failed and waits; the SparkApplication deleted, the operator runs it again and it
    completes. Then the member is removed by an edit (drained first), its backfill gone."""
    bootstrap = _third_kafka_cluster(cluster)
    # Traffic for about three minutes, so that it runs through the whole join.
    watch = _watch_delivery(cluster, 9000 * len(DATA_MEMBERS))
    producers = _produce(cluster, traffic, 9000, rate=50)
    backfilling_seen: list[str] = []
    began = time.monotonic()
    three = {"name": "three", "kafka": {"bootstrapServers": bootstrap}}
    cluster.kubectl(
        "patch", "kdg", GROUP, "-n", NAMESPACE, "--type=json",
        "-p", json.dumps([{"op": "add", "path": "/spec/members/-", "value": three}]),
    )  # fmt: skip

    app = f"{GROUP}-backfill-three"
    started_after: list[str] = []

    def joined() -> bool:
        backfilling = cluster.condition("kdg", GROUP, "Backfilling")
        if backfilling.get("status") == "True":
            backfilling_seen.append(str(backfilling.get("message")))
        if "three" in _sidecar_pods(cluster) and not started_after:
            # Its sidecar runs only on a seeded cluster: when its pod is first seen, its
            # backfill has COMPLETED (or is already cleaned up, once it voted). The
            # group's status may lag a round behind the pods, so it is not the judge.
            found = cluster.get("sparkapplication", app)
            state = ((found or {}).get("status") or {}).get("applicationState") or {}
            started_after.append(str(state.get("state")) if found else "deleted")
            assert started_after[0] in ("COMPLETED", "deleted"), started_after
        return _membership_settled(cluster, ("one", "two", "arbiter", "three"))

    def running_driver() -> str | None:
        found = cluster.get("sparkapplication", app) or {}
        pod = ((found.get("status") or {}).get("driverInfo") or {}).get("podName")
        phase = ((cluster.get("pod", pod) or {}).get("status") or {}).get("phase") if pod else None
        return str(pod) if phase == "Running" else None

    driver = wait_for("the backfill's driver running", running_driver, timeout=600)
    cluster.kubectl("delete", "pod", driver, "-n", NAMESPACE, "--grace-period=0", "--force")
    failed = wait_for(
        "the Backfilling condition to report the failure",
        lambda: (
            (c := cluster.condition("kdg", GROUP, "Backfilling")).get("reason") == "BackfillFailed"
            and c
        ),
        timeout=600,
    )
    assert "delete the SparkApplication" in failed["message"], failed
    assert "three" not in _sidecar_pods(cluster)  # not started on a half-seeded cluster
    cluster.kubectl("delete", "sparkapplication", app, "-n", NAMESPACE)

    wait_for("the new data member in the group", joined, timeout=1500, interval=1.0)
    figures["members edit: data member added (backfill), group Ready"] = round(
        time.monotonic() - began, 1
    )
    assert backfilling_seen, "the Backfilling condition was never True"
    assert started_after, "three's sidecar pod was never seen"
    added = [m for m in _membership_events(cluster) if "'add': 'three'" in m]
    assert any(": 200 appended" in m for m in added), added
    for pod in producers:
        cluster.tool_result(pod, timeout=600)
    figures["members edit: data member added (backfill): longest delivery pause at one"] = (
        _longest_pause(cluster, watch, "data-member-join")
    )
    _check(cluster, traffic, also={"three": bootstrap})
    began = time.monotonic()
    members = [m["name"] for m in (cluster.get("kdg", GROUP) or {})["spec"]["members"]]
    cluster.kubectl(
        "patch", "kdg", GROUP, "-n", NAMESPACE, "--type=json",
        "-p", json.dumps([{"op": "remove", "path": f"/spec/members/{members.index('three')}"}]),
    )  # fmt: skip
    wait_for(
        "the data member out of the group",
        lambda: _membership_settled(cluster, ("one", "two", "arbiter")),
        timeout=600,
    )
    figures["members edit: data member removed, group Ready"] = round(time.monotonic() - began, 1)
    assert any("{'remove': 'three'}: 200" in m for m in _membership_events(cluster))
    assert cluster.get("sparkapplication", f"{GROUP}-backfill-three") is None
    cluster.kubectl("delete", "-n", NAMESPACE, "statefulset/kafka-three", "service/kafka-three")
    for pod in _produce(cluster, traffic, 300):
        cluster.tool_result(pod)
    _check(cluster, traffic)


def _operator_credentials_b64(cluster: Cluster) -> tuple[str, str, str]:
    """The group CA and a fresh operator certificate and key, as base64 PEM, made from the
    group's CA Secret by the operator's own code: what anyone holding that Secret can make."""
    ca_secret = children.ca_secret_name(GROUP)
    pems = operator_credentials(
        Group.from_object(cluster.get("kdg", GROUP) or {}),
        {ca_secret: cluster.get("secret", ca_secret) or {}},
    )
    ca, cert, key = (base64.b64encode(pem).decode() for pem in pems)
    return ca, cert, key


def test_a_member_removed_by_hand_shows_as_drift_until_the_spec_says_so(
    cluster: Cluster, group: str, figures: dict[str, float]
) -> None:
    """GitOps drift: the witness is taken out of the running group without the operator
    (over the admin listeners, with an operator certificate from the group's CA). The
    operator reports it, MembersMatchSpec False with ChangedOutsideSpec naming the
    witness and a warning Event, and leaves the group as it is (the witness's StatefulSet
    and pod stay); once the spec says the same, the StatefulSet goes and the condition is
    True again. The tests after this one run with the two data members alone."""
    ca, cert, key = _operator_credentials_b64(cluster)
    members = [
        arg
        for m in ("one", "two", "arbiter")
        for arg in ("--member", f"{m}={GROUP}-{m}-0.{GROUP}-peers.{NAMESPACE}.svc:8443")
    ]
    taken = cluster.tool(
        "remove-by-hand", "--group", GROUP, *members, "--ca", ca, "--cert", cert, "--key", key,
        "--remove", "arbiter", timeout=300,
    )  # fmt: skip
    assert taken["taken"] is True, taken
    removed_at = time.monotonic()
    drift = wait_for(
        "MembersMatchSpec False for the witness removed by hand",
        lambda: (
            (c := cluster.condition("kdg", GROUP, "MembersMatchSpec"))
            and c.get("status") == "False"
            and c
        ),
        timeout=180,
    )
    figures["member removed by hand: drift reported after"] = round(
        time.monotonic() - removed_at, 1
    )
    assert drift["reason"] == "ChangedOutsideSpec", drift
    assert "arbiter is in the spec, not in the group" in drift["message"], drift
    warnings = [
        e
        for e in cluster.items("events")
        if e.get("reason") == "MembersMatchSpecFalse"
        and e.get("type") == "Warning"
        and (e.get("involvedObject") or {}).get("name") == GROUP
        and "arbiter" in str(e.get("message"))
    ]
    assert warnings, "no warning Event for the drift"
    # The operator does not undo it: the witness's StatefulSet and pod are still there,
    # not being deleted, when it reports the drift.
    kept = cluster.get("statefulset", f"{GROUP}-arbiter") or {}
    assert kept and not kept["metadata"].get("deletionTimestamp"), kept.get("metadata")
    pod = _sidecar_pods(cluster).get("arbiter") or {}
    assert pod and not pod["metadata"].get("deletionTimestamp"), pod.get("metadata")
    spec_members = [m["name"] for m in (cluster.get("kdg", GROUP) or {})["spec"]["members"]]
    drop = [{"op": "remove", "path": f"/spec/members/{spec_members.index('arbiter')}"}]
    cluster.kubectl(
        "patch", "kdg", GROUP, "-n", NAMESPACE, "--type=json", "-p", json.dumps(drop)
    )  # fmt: skip
    wait_for(
        "the spec's members in force and matched",
        lambda: (
            _membership_settled(cluster, ("one", "two"))
            and cluster.condition("kdg", GROUP, "MembersMatchSpec").get("status") == "True"
        ),
        timeout=600,
    )


# --- audits ---------------------------------------------------------------------------------


def _audit_phases(cluster: Cluster, app: dict[str, Any]) -> dict[str, float]:
    """The Spark phases' durations the driver logged (it runs with --verbose)."""
    driver = app["status"].get("driverInfo", {}).get("podName")
    if not driver:
        return {}
    logs = cluster.kubectl("logs", "-n", NAMESPACE, driver, check=False).stdout
    phases = {}
    for line in logs.splitlines():
        match = re.fullmatch(r"kdsync audit: (.+): ([0-9.]+)s", line.strip())
        if match:
            phases[f"audit phase: {match[1]}"] = float(match[2])
    return phases


def _audit_after(cluster: Cluster, since: datetime.datetime, status: str) -> dict[str, Any]:
    """Waits for Consistent=<status> from an audit run submitted after ``since``."""

    def verdict() -> dict[str, Any] | None:
        group = cluster.get("kdg", GROUP) or {}
        last = group.get("status", {}).get("lastAudit") or {}
        consistent = cluster.condition("kdg", GROUP, "Consistent")
        if consistent.get("status") != status or not last.get("application"):
            return None
        app = cluster.get("sparkapplication", last["application"]) or {}
        submitted = app.get("status", {}).get("lastSubmissionAttemptTime")
        if not submitted or _time(submitted) < since:
            return None
        return {"consistent": consistent, "lastAudit": last, "app": app}

    # Generous: on a busy 2-core machine one run took over ten minutes (Spark start-up and
    # task scheduling); on a quiet one about two and a half.
    return wait_for(f"an audit giving Consistent={status}", verdict, timeout=900, interval=2)  # type: ignore[no-any-return]


@pytest.mark.timeout(2100)  # two audit runs, each waited for up to 15 minutes
def test_scheduled_audit_on_the_spark_operator_passes_then_catches_an_injected_redelivery(
    cluster: Cluster, group: str, traffic: dict[str, int], figures: dict[str, float]
) -> None:
    since = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    schedule = {"spec": {"checks": {"schedule": "@every 20s"}}}
    cluster.kubectl(
        "patch", "kdg", GROUP, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(schedule)
    )
    try:
        passed = _audit_after(cluster, since, "True")
        app = passed["app"]
        assert passed["consistent"]["reason"] == "AuditPassed", passed
        # A scheduled audit is incremental: a run checks what came after the previous clean
        # run (its saved state), so one run may check only the newest events (an earlier
        # run of the group's audit may have checked the rest). What must cover all the
        # traffic is how far the group is verified.
        assert passed["lastAudit"]["toSeq"] + 1 >= sum(traffic.values()), passed
        # A real run: driver and executor pods of the sidecar image, through spark-submit.
        assert app["spec"]["image"] == "kdsync-sidecar:dev"
        assert app["status"]["applicationState"]["state"] == "COMPLETED"
        assert app["status"].get("executorState"), app["status"]
        driver = cluster.get("pod", app["status"]["driverInfo"]["podName"]) or {}
        driver_security = driver["spec"]["containers"][0]["securityContext"]
        assert driver_security["readOnlyRootFilesystem"] is True, driver_security
        assert driver["spec"]["securityContext"]["runAsNonRoot"] is True
        duration = _time(app["status"]["terminationTime"]) - _time(
            app["status"]["lastSubmissionAttemptTime"]
        )
        figures["audit SparkApplication (submitted -> completed)"] = duration.total_seconds()
        figures.update(_audit_phases(cluster, app))

        injected_at = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        injected = cluster.tool(
            "inject-redelivery", "--bootstrap", DATA_MEMBERS["one"], "--topic", "events-global"
        )
        assert injected["injected"] is not None
        failed = _audit_after(cluster, injected_at, "False")
        assert failed["consistent"]["reason"] == "ViolationsFound", failed
        assert failed["lastAudit"]["violationsTotal"] >= 1
        assert "duplicate" in failed["consistent"]["message"], failed
        _snapshot(cluster, "Degraded-violations")
    finally:
        quiet = {"spec": {"checks": {"schedule": "17 * * * *"}}}
        cluster.kubectl(
            "patch", "kdg", GROUP, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(quiet)
        )


# --- upgrade and uninstall ------------------------------------------------------------------


def test_helm_upgrade_replaces_the_operator_and_leaves_the_sidecars_running(
    cluster: Cluster, group: str
) -> None:
    sidecars = {m: p["metadata"]["uid"] for m, p in _sidecar_pods(cluster).items()}
    old = cluster.items("pods", OPERATOR_NAMESPACE, "app.kubernetes.io/name=kdsync-operator")
    cluster.helm(
        "upgrade",
        RELEASE,
        str(REPO_ROOT / "charts" / "kdsync-operator"),
        "--namespace",
        OPERATOR_NAMESPACE,
        "--reuse-values",
        "--set",
        "resyncSeconds=15",
        "--wait",
        "--timeout",
        "5m",
    )
    pods = cluster.items("pods", OPERATOR_NAMESPACE, "app.kubernetes.io/name=kdsync-operator")
    running = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    assert len(running) == 1 and _pod_ready(running[0])
    assert running[0]["metadata"]["uid"] != old[0]["metadata"]["uid"]
    env = {e["name"]: e.get("value") for e in running[0]["spec"]["containers"][0]["env"]}
    assert env["KDSYNC_RESYNC_SECONDS"] == "15"
    _webhook_refuses_a_bad_group(cluster)
    # The new operator takes the group over (resume) without restarting any sidecar.
    wait_for("the group Ready under the new operator", lambda: _group_ready(cluster), timeout=120)
    assert {m: p["metadata"]["uid"] for m, p in _sidecar_pods(cluster).items()} == sidecars


def test_helm_uninstall_leaves_the_kafka_data_untouched(
    cluster: Cluster, group: str, traffic: dict[str, int]
) -> None:
    def counts() -> dict[str, int]:
        pods = {  # all four at once: each is a pod start
            f"{member}/{topic}": cluster.tool_pod(
                "count", "--bootstrap", bootstrap, "--topic", topic
            )
            for member, bootstrap in DATA_MEMBERS.items()
            for topic in ("events", "events-global")
        }
        return {where: cluster.tool_result(pod)["count"] for where, pod in pods.items()}

    before = counts()
    assert before["one/events"] == traffic["one"], (before, traffic)
    # An operator shutting down on a loaded node can take a while: helm's own limit, said
    # out loud (its error names what it still waited for).
    cluster.helm(
        "uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE, "--wait", "--timeout", "5m"
    )  # fmt: skip
    wait_for(
        "the operator pod gone",
        lambda: (
            not cluster.items("pods", OPERATOR_NAMESPACE, "app.kubernetes.io/name=kdsync-operator")
        ),
        timeout=300,
    )
    webhooks = cluster.kubectl("get", "validatingwebhookconfigurations", "-o", "name").stdout
    assert "kdsync" not in webhooks
    after = counts()
    changed = {k: (before[k], after.get(k)) for k in before if after.get(k) != before[k]}
    assert not changed, f"records counted (before, after) the uninstall: {changed}"
    # Helm leaves the CRD and the groups (and so their sidecars): data and replication stay.
    assert cluster.get("kdg", GROUP) is not None
