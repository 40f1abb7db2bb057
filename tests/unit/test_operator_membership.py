"""The operator's runtime membership changes: the plan from the group's reported
configuration to the spec, what the rollout leaves alone meanwhile, the webhook's
one-change-at-a-time rule, and the Joining/Leaving conditions."""

from __future__ import annotations

from typing import Any

import pytest

from kdsync.config import parse_config
from kdsync_operator import children, membership, membership_io, rollout, status, validation
from kdsync_operator.audit import AuditOutcome
from kdsync_operator.membership import GroupObservation, MembershipRequest, plan_membership
from kdsync_operator.spec import ADMIN_PORT, Group

SPEC = [("one", False), ("two", False), ("witness", True)]
NO_AUDIT = AuditOutcome("Unknown", "AuditDisabled", "off")


def peer(member: str) -> str:
    return f"{member}.peers:7070"


def doc(
    member: str,
    members: list[str],
    *,
    witnesses: tuple[str, ...] = ("witness",),
    role: str = "follower",
    index: int = 0,
    committed: bool = True,
    witness: bool = False,
) -> dict[str, Any]:
    return {
        "member": member,
        "role": role,
        "term": 3,
        "witness": witness,
        "peer": f"{member}.peers:7070",
        "allDurable": 10,
        "configuration": {
            "voters": members,
            "witnesses": [w for w in witnesses if w in members],
            "index": index,
            "committed": committed,
        },
    }


def group_of(*names: str, **kw: Any) -> dict[str, dict[str, Any]]:
    members = list(names)
    return {
        m: doc(
            m,
            members,
            role="leader" if m == "one" else "follower",
            witness=m in ("witness", "arbiter"),
            **kw,
        )
        for m in members
    }


def test_a_witness_added_to_the_spec_is_created_then_added_by_the_leader() -> None:
    spec = [*SPEC, ("arbiter", True)]
    statuses = group_of("one", "two", "witness")
    # Its StatefulSet does not exist yet: created at once, the others keep their config.
    plan = plan_membership(spec, ["one", "two", "witness"], GroupObservation(statuses), peer)
    assert plan.request is None and plan.reason == "WaitingForSidecar"
    assert plan.joining == "arbiter" and plan.hold_updates and plan.changing
    assert "arbiter" not in plan.not_yet
    # Its sidecar answers, reporting its own startup list (which names it, at index 0,
    # committed, like everyone's): the leader's configuration decides, not its.
    own = doc("arbiter", ["arbiter", "one", "two", "witness"], witness=True)
    statuses = {"arbiter": own, **statuses}
    existing = ["arbiter", "one", "two", "witness"]
    plan = plan_membership(spec, existing, GroupObservation(statuses), peer)
    assert plan.request == MembershipRequest(
        "one", {"add": "arbiter", "witness": True, "peer": "arbiter.peers:7070"}
    )
    # Appended, not committed: nothing more is asked, the others still wait.
    after = group_of("one", "two", "witness", "arbiter", index=5, committed=False)
    plan = plan_membership(spec, existing, GroupObservation(after), peer)
    assert plan.request is None and plan.reason == "Committing" and plan.hold_updates
    # Committed: the group's members are the spec's; the rollout may go on.
    done = group_of("one", "two", "witness", "arbiter", index=5)
    plan = plan_membership(spec, existing, GroupObservation(done), peer)
    assert plan.request is None and not plan.changing and plan.reason == "Stable"
    # A round in which nobody answers (a DNS blip): everything is held, the change is
    # still named (from the last status), nothing is asked.
    silent = GroupObservation(unreachable=dict.fromkeys(existing, "timed out"))
    plan = plan_membership(spec, existing, silent, peer, {"joining": "arbiter"})
    assert plan.hold_updates and plan.request is None and plan.joining == "arbiter"
    assert plan.reason == "GroupUnreachable"


def test_a_witness_is_added_only_while_every_voter_answers_on_a_release_that_can() -> None:
    spec = [*SPEC, ("arbiter", True)]
    statuses = group_of("one", "two", "witness")
    statuses["arbiter"] = doc("arbiter", ["arbiter", "one", "two", "witness"], witness=True)
    existing = ["arbiter", "one", "two", "witness"]
    down = {k: v for k, v in statuses.items() if k != "two"}
    plan = plan_membership(spec, existing, GroupObservation(down, {"two": "refused"}), peer)
    assert plan.request is None and plan.reason == "VotersNotReady" and "two" in plan.message
    del statuses["witness"]["peer"]
    plan = plan_membership(spec, existing, GroupObservation(statuses), peer)
    assert plan.request is None and "older release" in plan.message


def test_the_leaders_configuration_decides_even_if_a_member_lags() -> None:
    statuses = group_of("one", "two", "witness", "arbiter", index=5)
    statuses["two"] = doc("two", ["one", "two", "witness"], index=0)
    spec = [*SPEC, ("arbiter", True)]
    plan = plan_membership(spec, [*dict(spec)], GroupObservation(statuses), peer)
    assert plan.request is None and not plan.changing


def test_a_witness_removed_from_the_spec_is_removed_then_its_statefulset_deleted() -> None:
    statuses = group_of("one", "two", "witness")
    plan = plan_membership(SPEC[:2], ["one", "two", "witness"], GroupObservation(statuses), peer)
    assert plan.request == MembershipRequest("one", {"remove": "witness"})
    assert plan.leaving == "witness" and plan.keep == {"witness"} and plan.hold_updates
    gone = group_of("one", "two", index=4)
    plan = plan_membership(SPEC[:2], ["one", "two", "witness"], GroupObservation(gone), peer)
    assert not plan.changing and plan.keep == frozenset()


def test_a_data_member_is_drained_before_it_is_removed() -> None:
    spec = [("one", False), ("witness", True)]
    statuses = group_of("one", "two", "witness")
    existing = ["one", "two", "witness"]
    plan = plan_membership(spec, existing, GroupObservation(statuses), peer)
    assert plan.request is None and plan.reason == "Draining"
    assert plan.leaving_data_member == "two" and "does not answer" in plan.message
    plan = plan_membership(spec, existing, GroupObservation(statuses, backlog={"two": 12}), peer)
    assert plan.request is None and "12 records" in plan.message
    assert "stop producing" in plan.message
    plan = plan_membership(spec, existing, GroupObservation(statuses, backlog={"two": 0}), peer)
    assert plan.request == MembershipRequest("one", {"remove": "two"})


def test_removing_the_leader_asks_the_leader_which_hands_over_first() -> None:
    spec = [("two", False), ("witness", True)]
    statuses = group_of("one", "two", "witness")
    backlog = {"one": 0}
    plan = plan_membership(spec, list(statuses), GroupObservation(statuses, backlog=backlog), peer)
    assert plan.request == MembershipRequest("one", {"remove": "one"})
    assert "hands over first" in plan.message


def test_a_data_member_is_removed_without_a_drain_when_the_user_says_so() -> None:
    spec = [("one", False), ("witness", True)]
    statuses = group_of("one", "two", "witness")
    plan = plan_membership(spec, list(statuses), GroupObservation(statuses), peer, None, {"two"})
    assert plan.request == MembershipRequest("one", {"remove": "two"})


def test_without_a_leader_nothing_is_asked() -> None:
    statuses = {m: doc(m, ["one", "two", "witness"]) for m in ("one", "two")}
    plan = plan_membership(SPEC[:2], ["one", "two", "witness"], GroupObservation(statuses), peer)
    assert plan.request is None and plan.reason == "NoLeader" and plan.hold_updates
    assert plan.keep == {"witness"} and plan.leaving == "witness"


def test_a_data_member_joins_as_a_learner_then_is_backfilled_then_started() -> None:
    spec = [*SPEC, ("three", False)]
    existing = ["one", "two", "witness"]
    statuses = group_of("one", "two", "witness")
    plan = plan_membership(spec, existing, GroupObservation(statuses), peer)
    assert plan.request == MembershipRequest(
        "one", {"add": "three", "witness": False, "peer": "three.peers:7070"}
    )
    assert plan.not_yet == {"three"} and plan.hold_updates and plan.reason == "AddingLearner"
    # A learner: its backfill runs (created, then running); its sidecar must not start.
    learner = group_of("one", "two", "witness", index=6)
    for name in learner:
        learner[name]["configuration"]["learners"] = ["three"]
    for state in ("", "SUBMITTED", "RUNNING"):
        observed = GroupObservation(learner, backfills={"three": state} if state else {})
        plan = plan_membership(spec, existing, observed, peer)
        assert plan.request is None and plan.backfill == "three" and plan.backfilling
        assert plan.not_yet == {"three"} and plan.joining == "three"
    conditions = {c[0]: c for c in membership.conditions(plan)}
    assert conditions["Backfilling"][1] == "True" and conditions["Joining"][1] == "True"
    # Seeded: its StatefulSet may be created; the backfill stays until the member votes.
    plan = plan_membership(
        spec, existing, GroupObservation(learner, backfills={"three": "COMPLETED"}), peer
    )
    assert plan.not_yet == frozenset() and plan.backfill == "three" and not plan.backfilling
    assert plan.reason == "Starting" and plan.hold_updates
    # Started, catching up: nothing more to do but wait; the others keep their config.
    plan = plan_membership(spec, [*existing, "three"], GroupObservation(learner), peer)
    assert plan.reason == "CatchingUp" and plan.backfill is None and plan.hold_updates
    # A failed backfill is kept (its log) and said so; the member is not started.
    plan = plan_membership(
        spec, existing, GroupObservation(learner, backfills={"three": "FAILED"}), peer
    )
    assert plan.reason == "BackfillFailed" and plan.backfill is None
    assert plan.not_yet == {"three"} and "delete the SparkApplication" in plan.message
    assert {c[0]: c for c in membership.conditions(plan)}["Backfilling"][2] == "BackfillFailed"


def test_a_learner_taken_out_of_the_spec_is_removed_without_a_drain() -> None:
    learner = group_of("one", "two", "witness", index=6)
    for name in learner:
        learner[name]["configuration"]["learners"] = ["three"]
    plan = plan_membership(SPEC, ["one", "two", "witness"], GroupObservation(learner), peer)
    assert plan.request == MembershipRequest("one", {"remove": "three"})


def test_a_group_that_does_not_answer() -> None:
    silent = GroupObservation(unreachable={"one": "refused"})
    # New: every member starts from the spec's list.
    assert not plan_membership(SPEC, [], silent, peer).changing
    # Asked at all (the handler asks only when something may be changing): hold.
    assert plan_membership(SPEC, ["one", "two", "witness"], silent, peer).hold_updates
    # The spec's members differ: wait, hold everything back, say why.
    plan = plan_membership(SPEC[:2], ["one", "two", "witness"], silent, peer)
    assert plan.hold_updates and plan.keep == {"witness"} and plan.request is None
    assert plan.reason == "GroupUnreachable" and "one: refused" in plan.message
    assert plan.leaving == "witness" and plan.joining is None


def test_the_rollout_holds_what_the_membership_plan_says() -> None:
    desired = {"one": "new", "two": "new", "arbiter": "new"}
    observed = {
        "one": rollout.MemberObservation("one", True, True, "old"),
        "two": rollout.MemberObservation("two", True, True, "old"),
    }
    held = rollout.plan_rollout(desired, observed, ["witness"], hold_updates=True, keep=["witness"])
    assert held.apply == ("arbiter",) and held.delete == () and not held.done
    assert "keep their config" in held.notes[0]
    # A data member not yet created, a removed member still counted: left alone.
    fresh = {m: rollout.MemberObservation(m, True, True, "new") for m in ("one", "two")}
    plan = rollout.plan_rollout(desired, fresh, ["witness"], not_yet=["arbiter"], keep=["witness"])
    assert plan.apply == () and plan.delete == ()
    plan = rollout.plan_rollout(desired, fresh, ["witness"], not_yet=["arbiter"])
    assert plan.delete == ("witness",)


def test_a_membership_change_rolls_members_one_at_a_time_but_a_topics_change_together() -> None:
    def seen(m: str, topics: str | None, members: str | None) -> rollout.MemberObservation:
        return rollout.MemberObservation(m, True, True, "old", "a1", topics, members)

    desired = {"one": "new", "two": "new"}
    runtime_change = {m: seen(m, "t1", "m1") for m in desired}
    plan = rollout.plan_rollout(desired, runtime_change, agreement="a2", topics="t1", members="m2")
    assert not plan.together and plan.apply == ("one",)
    topics = {m: seen(m, "t1", "m1") for m in desired}
    plan = rollout.plan_rollout(desired, topics, agreement="a2", topics="t2", members="m1")
    assert plan.together and plan.apply == ("one", "two")
    # The same members in another order: lists are compared in order until a runtime
    # change, so every member restarts at once, as before.
    reordered = {m: seen(m, "t1", "m1") for m in desired}
    plan = rollout.plan_rollout(desired, reordered, agreement="a2", topics="t1", members="m1")
    assert plan.together
    # A StatefulSet of an operator before this one: its agreement hash decides, as before.
    older = {m: seen(m, None, None) for m in desired}
    assert rollout.plan_rollout(desired, older, agreement="a2", topics="t1", members="m2").together


def make_group(members: list[dict[str, Any]]) -> Group:
    return Group.from_object(
        {
            "metadata": {"name": "g", "namespace": "ns", "uid": "u", "generation": 2},
            "spec": {"members": members, "topics": {"names": ["orders"]}},
        }
    )


MEMBERS = [
    {"name": "one", "kafka": {"bootstrapServers": "k1:9092"}},
    {"name": "two", "kafka": {"bootstrapServers": "k2:9092"}},
    {"name": "witness", "witness": True},
]


def test_the_topics_hash_ignores_the_member_list() -> None:
    def hashes(group: Group) -> tuple[str | None, str | None]:
        sts = children.statefulset(group, group.spec.members[0], "cfg", "tls")
        return children.topics_hash(sts), children.agreement_hash(sts)

    before, after = hashes(make_group(MEMBERS)), hashes(make_group(MEMBERS[:2]))
    assert before[0] == after[0] and before[1] != after[1]


def test_every_sidecar_gets_an_admin_listener_the_operator_can_reach() -> None:
    group = make_group(MEMBERS)
    config, problems = children.sidecar_config(group, "one")
    assert problems == []
    parsed = parse_config(config, check_files=False)
    # Off: it would open the plain port's loopback path (a mesh proxy makes it remote).
    assert not parsed.allow_membership_changes
    assert parsed.admin is not None and parsed.admin.listen == f"0.0.0.0:{ADMIN_PORT}"
    sts = children.statefulset(group, group.spec.members[0], "cfg", "tls")
    ports = sts["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert {"name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP"} in ports
    service_ports = [p["port"] for p in children.peers_service(group)["spec"]["ports"]]
    assert ADMIN_PORT in service_ports
    assert children.admin_address(group, "one") == f"g-one-0.g-peers.ns.svc:{ADMIN_PORT}"


def roles(*members: tuple[str, bool]) -> dict[str, Any]:
    return {
        "members": [
            {"name": n, "witness": True} if w else {"name": n, "kafka": {"bootstrapServers": "k"}}
            for n, w in members
        ]
    }


OLD = roles(("one", False), ("two", False), ("witness", True))


def problems_of(new: dict[str, Any], old_status: dict[str, Any] | None = None) -> list[str]:
    return [str(p) for p in validation.membership_change_problems(OLD, new, old_status)]


def test_the_webhook_takes_one_witness_added_or_one_member_removed() -> None:
    assert problems_of(roles(("one", False), ("two", False), ("witness", True), ("w2", True))) == []
    assert problems_of(roles(("one", False), ("two", False))) == []
    assert problems_of(roles(("one", False), ("witness", True))) == []


def test_the_webhook_refuses_two_changes_at_once() -> None:
    (problem,) = problems_of(roles(("one", False)))
    assert "removes two, removes witness" in problem and "one member at a time" in problem
    (problem,) = problems_of(roles(("one", False), ("two", False), ("w2", True)))
    assert "adds w2, removes witness" in problem


def test_the_webhook_refuses_what_no_runtime_change_can_do() -> None:
    assert problems_of(roles(("one", False), ("two", False), ("witness", True), ("c", False))) == []
    (problem,) = problems_of(roles(("one", False), ("two", False), ("witness", False)))
    assert "makes witness a data member" in problem and "under a new name" in problem
    (problem,) = [
        str(p)
        for p in validation.membership_change_problems(
            roles(("one", False), ("witness", True)), roles(("witness", True))
        )
    ]
    assert "last data member" in problem


def test_the_webhook_waits_for_the_operator_and_for_a_roll_to_end() -> None:
    adds = roles(("one", False), ("two", False), ("witness", True), ("w2", True))
    seen = {"observedGeneration": 3, "rollout": {"outdated": []}}
    assert validation.membership_change_problems(OLD, adds, seen, 3) == []
    (lagging,) = validation.membership_change_problems(OLD, adds, seen, 4)
    assert "has not acted on the last edit" in str(lagging)
    rolling = {"observedGeneration": 3, "rollout": {"outdated": ["two"]}}
    (problem,) = validation.membership_change_problems(OLD, adds, rolling, 3)
    assert "rolling onto a new config (two)" in str(problem)


def test_the_webhook_refuses_a_change_while_one_is_under_way_but_lets_it_be_backed_out() -> None:
    joining = {"membership": {"joining": "w2", "leaving": None}}
    old = roles(("one", False), ("two", False), ("witness", True), ("w2", True))
    refused = validation.membership_change_problems(
        old, roles(("one", False), ("two", False), ("w2", True)), joining
    )
    assert len(refused) == 1 and "under way (joining w2)" in str(refused[0])
    backed_out = validation.membership_change_problems(old, OLD, joining)
    assert backed_out == []
    leaving = {"membership": {"joining": None, "leaving": "witness"}}
    refused = validation.membership_change_problems(
        roles(("one", False), ("two", False)),
        roles(("one", False), ("two", False), ("w2", True)),
        leaving,
    )
    assert len(refused) == 1 and "leaving witness" in str(refused[0])
    back = validation.membership_change_problems(
        roles(("one", False), ("two", False)), OLD, leaving
    )
    assert back == []


def test_the_status_shows_joining_and_leaving() -> None:
    group = make_group(MEMBERS)
    observed = {m: rollout.MemberObservation(m, True, True, "h") for m in ("one", "two", "witness")}
    plan = rollout.plan_rollout({m: "h" for m in observed}, observed)
    adding = membership.MembershipPlan(
        hold_updates=True, joining="w2", reason="WaitingForSidecar", message="adding w2"
    )
    st = status.build_status(group, observed, plan, NO_AUDIT, None, "2030-01-01T00:00:00Z",
                             membership=adding)  # fmt: skip
    found = {c["type"]: c for c in st["conditions"]}
    assert (
        found["Joining"]["status"] == "True" and found["Joining"]["reason"] == "WaitingForSidecar"
    )
    assert found["Leaving"]["status"] == "False"
    assert st["membership"] == {"joining": "w2", "leaving": None}
    stable = status.build_status(group, observed, plan, NO_AUDIT, st, "2030-01-01T00:01:00Z")
    found = {c["type"]: c for c in stable["conditions"]}
    assert found["Joining"]["status"] == "False" and stable["membership"]["joining"] is None
    changes = {(t.condition, t.status) for t in status.transitions(st, stable)}
    assert ("Joining", "False") in changes


def test_the_backfill_runs_the_new_members_own_config_against_every_other_member() -> None:
    import base64  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    from kdsync_operator import backfill  # noqa: PLC0415

    group = make_group([*MEMBERS, {"name": "three", "kafka": {"bootstrapServers": "k3:9092"}}])
    objects = backfill.backfill_objects(group, "three", {}, "driver-role", "6/abc")
    by_kind = {o["kind"]: o for o in objects}
    app = by_kind["SparkApplication"]
    assert app["metadata"]["name"] == "g-backfill-three"
    assert backfill.backfill_member(app) == "three"
    assert backfill.backfill_stamp(app) == "6/abc" == backfill.join_stamp(6, "abc")
    spec = app["spec"]
    assert spec["mainApplicationFile"] == "local:///opt/kdsync/backfill/spark_main.py"
    urls = [
        spec["arguments"][i + 1] for i, a in enumerate(spec["arguments"]) if a == "--status-url"
    ]
    assert urls == [
        "http://g-one-0.g-peers.ns.svc:8080",
        "http://g-two-0.g-peers.ns.svc:8080",
        "http://g-witness-0.g-peers.ns.svc:8080",
    ]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["config"]["secret"]["secretName"] == "g-backfill-three"
    assert volumes["peer-tls"]["secret"]["secretName"] == "g-three-tls"
    secret = next(o for o in objects if o["kind"] == "Secret")
    text = base64.b64decode(secret["data"]["config.yaml"]).decode()
    config = parse_config(yaml.safe_load(text), check_files=False)
    assert config.member == "three" and not config.is_witness
    assert {o["kind"] for o in objects} >= {"ServiceAccount", "RoleBinding"}
    assert spec["driver"]["labels"]["app.kubernetes.io/component"] == "backfill"


def learner_group(state: str | None = None) -> GroupObservation:
    statuses = group_of("one", "two", "witness", index=6)
    for name in statuses:
        statuses[name]["configuration"]["learners"] = ["three"]
    return GroupObservation(statuses, backfills={"three": state} if state is not None else {})


def test_a_learner_never_starts_before_its_backfill_whatever_else_happens() -> None:
    spec = [*SPEC, ("three", False)]
    existing = ["one", "two", "witness"]
    # The leader does not answer this round (an election, a timeout): the followers count
    # three as a learner; it must not start, and its running backfill must not go.
    seen = learner_group("RUNNING")
    followers = {m: d for m, d in seen.statuses.items() if m != "one"}
    for answer in followers.values():
        answer["role"] = "follower"
    quiet = GroupObservation(followers, {"one": "timed out"}, backfills={"three": "RUNNING"})
    plan = plan_membership(spec, existing, quiet, peer, {"joining": "three"})
    assert "three" in plan.not_yet and plan.drop_backfills == frozenset()
    # Another change in the same spec (the webhook off): still held.
    more = [*spec, ("w2", True)]
    plan = plan_membership(more, existing, learner_group("RUNNING"), peer)
    assert "three" in plan.not_yet
    plan = plan_membership(spec[1:], existing, learner_group("RUNNING"), peer)
    assert "three" in plan.not_yet and plan.leaving == "one"
    # Its backfill is kept while it joins, and the plan names the join it is for.
    plan = plan_membership(spec, existing, learner_group("RUNNING"), peer)
    assert plan.drop_backfills == frozenset() and plan.join_index == 6
    # An earlier backfill still being deleted: wait, create nothing.
    plan = plan_membership(spec, existing, learner_group(membership.DELETING), peer)
    assert plan.backfill is None and "three" in plan.not_yet


def test_a_finished_backfill_goes_once_its_member_votes_or_is_gone() -> None:
    spec = [*SPEC, ("three", False)]
    voting = group_of("one", "two", "witness", "three", index=7)
    observed = GroupObservation(voting, backfills={"three": "COMPLETED"})
    plan = plan_membership(spec, [*dict(spec)], observed, peer)
    assert plan.drop_backfills == {"three"}
    gone = GroupObservation(group_of("one", "two", "witness", index=8), backfills={"three": ""})
    assert plan_membership(SPEC, ["one", "two", "witness"], gone, peer).drop_backfills == {"three"}


def test_a_data_member_added_back_while_its_statefulset_runs_waits_for_it_to_go() -> None:
    spec = [*SPEC, ("three", False)]
    removed = group_of("one", "two", "witness", index=9)
    plan = plan_membership(
        spec, ["one", "two", "witness", "three"], GroupObservation(removed), peer
    )
    assert plan.request is None and plan.reason == "RemovedMemberRunning"
    assert "take three out of the spec" in plan.message


def test_the_webhook_backs_out_a_witness_removal_but_not_a_data_members() -> None:
    leaving = {"membership": {"joining": None, "leaving": "two"}}
    refused = validation.membership_change_problems(
        roles(("one", False), ("witness", True)), OLD, leaving
    )
    assert len(refused) == 1 and "under way (leaving two)" in str(refused[0])


def test_the_webhook_lets_a_member_that_holds_a_roll_back_be_removed() -> None:
    rolling = {
        "observedGeneration": 3,
        "rollout": {"outdated": ["one", "two"]},
        "members": [
            {"name": "one", "ready": True},
            {"name": "two", "ready": False},
            {"name": "witness", "ready": True},
        ],
    }
    assert (
        validation.membership_change_problems(
            OLD, roles(("one", False), ("witness", True)), rolling, 3
        )
        == []
    )
    (problem,) = validation.membership_change_problems(
        OLD, roles(("two", False), ("witness", True)), rolling, 3
    )
    assert "rolling onto a new config" in str(problem)


# --- a change made without the operator (MembersMatchSpec) ---------------------------------


def test_a_group_with_the_specs_members_matches_it() -> None:
    match = membership.spec_match(SPEC, group_of("one", "two", "witness"))
    assert match[:2] == ("True", "MatchSpec")
    assert "one, two, witness (witness)" in match[2]


def test_a_witness_removed_or_added_by_hand_is_reported_by_name() -> None:
    removed = membership.spec_match(SPEC, group_of("one", "two"))
    assert removed[:2] == ("False", membership.CHANGED_OUTSIDE_SPEC)
    assert "witness is in the spec, not in the group" in removed[2]
    assert "leader one's configuration is one, two (index 0" in removed[2]
    added = membership.spec_match(
        SPEC, group_of("one", "two", "witness", "arbiter", witnesses=("witness", "arbiter"))
    )
    assert added[:2] == ("False", membership.CHANGED_OUTSIDE_SPEC)
    assert "arbiter is in the group, not in the spec" in added[2]
    assert "witness is" not in added[2]
    # A learner counts as in the group: one added by hand, not yet a voter, is reported.
    statuses = group_of("one", "two", "witness")
    statuses["one"]["configuration"]["learners"] = ["three"]
    learner = membership.spec_match(SPEC, statuses)
    assert "three is in the group, not in the spec" in learner[2]


def test_a_member_whose_kind_differs_from_the_spec_is_reported() -> None:
    match = membership.spec_match([("one", False), ("two", True), ("witness", True)],
                                  group_of("one", "two", "witness"))  # fmt: skip
    assert match[:2] == ("False", membership.CHANGED_OUTSIDE_SPEC)
    assert "two is a data member in the group, not in the spec" in match[2]


def test_without_a_leader_the_members_are_not_compared() -> None:
    statuses = group_of("one", "two", "witness")
    statuses["one"]["role"] = "candidate"
    assert membership.spec_match(SPEC, statuses) is None
    assert membership.spec_match(SPEC, {}) is None
    # A change asked while no member leads (the leader restarting in a roll) keeps the
    # last comparison rather than flip it to a change under way and back.
    plan = plan_membership([*SPEC, ("w2", True)], ["one", "two", "witness"],
                           GroupObservation(statuses), peer)  # fmt: skip
    assert plan.hold_updates and plan.reason == "NoLeader"
    unled = membership.with_spec_match(
        membership.MembershipPlan(hold_updates=True, reason="NoLeader"), SPEC, statuses
    )
    assert unled.spec_match is None


def test_while_the_operator_changes_members_the_difference_is_its_own() -> None:
    statuses = group_of("one", "two", "witness")  # the spec gained w2: being added
    plan = plan_membership([*SPEC, ("w2", True)], ["one", "two", "witness"],
                           GroupObservation(statuses), peer)  # fmt: skip
    assert plan.joining == "w2"
    match = membership.with_spec_match(plan, [*SPEC, ("w2", True)], statuses).spec_match
    assert match is not None and match[:2] == ("False", "ChangeUnderWay")
    settled = plan_membership(SPEC, ["one", "two", "witness"], GroupObservation(statuses), peer)
    match = membership.with_spec_match(settled, SPEC, statuses).spec_match
    assert match is not None and match[0] == "True"


def _status_with(match: tuple[str, str, str] | None, previous: Any) -> dict[str, Any]:
    group = make_group(MEMBERS)
    observed = {m: rollout.MemberObservation(m, True, True, "h") for m in ("one", "two", "witness")}
    plan = rollout.plan_rollout({m: "h" for m in observed}, observed)
    return status.build_status(group, observed, plan, NO_AUDIT, previous, "2030-01-01T00:00:00Z",
                               membership=membership.MembershipPlan(spec_match=match))  # fmt: skip


def _matches(st: dict[str, Any]) -> dict[str, Any]:
    found = [c for c in st["conditions"] if c["type"] == "MembersMatchSpec"]
    assert len(found) == 1, st["conditions"]
    return found[0]


def test_the_condition_warns_once_when_the_group_leaves_the_spec_and_tells_when_it_is_back() -> (
    None
):
    first = _status_with(None, None)
    assert _matches(first)["status"] == "Unknown" and _matches(first)["reason"] == "NotCompared"
    matching = _status_with(("True", "MatchSpec", "same"), first)
    assert not [t for t in status.transitions(first, matching) if t.condition == "MembersMatchSpec"]
    drift = ("False", membership.CHANGED_OUTSIDE_SPEC, "witness is in the spec, not in the group")
    drifted = _status_with(drift, matching)
    events = [t for t in status.transitions(matching, drifted) if t.condition == "MembersMatchSpec"]
    assert [(t.status, t.reason, t.warning) for t in events] == [
        ("False", membership.CHANGED_OUTSIDE_SPEC, True)
    ]
    assert "witness is in the spec" in events[0].message
    # A reconcile that did not look keeps the last comparison, and says nothing again.
    unlooked = _status_with(None, drifted)
    assert _matches(unlooked) == _matches(drifted)
    assert not [
        t for t in status.transitions(drifted, unlooked) if t.condition == "MembersMatchSpec"
    ]
    back = _status_with(("True", "MatchSpec", "same"), unlooked)
    events = [t for t in status.transitions(unlooked, back) if t.condition == "MembersMatchSpec"]
    assert [(t.status, t.warning) for t in events] == [("True", False)]
    # The operator's own change is told by Joining and Leaving, not by this condition.
    changing = _status_with(("False", "ChangeUnderWay", "adding w2"), back)
    assert not [t for t in status.transitions(back, changing) if t.condition == "MembersMatchSpec"]


def test_the_periodic_resync_reads_a_quiet_group_and_asks_it_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = make_group(MEMBERS)
    statuses = group_of("one", "two")  # the witness was removed by hand
    asked: list[tuple[str, str, Any]] = []

    def ask(_client: Any, _group: Any, member: str, path: str, body: Any) -> Any:
        asked.append((member, path, body))
        return (200, statuses[member]) if member in statuses else "connection refused"

    monkeypatch.setattr(membership_io, "_admin_client", lambda *_: object())
    monkeypatch.setattr(membership_io, "_ask", ask)
    ready = {"status": {"readyReplicas": 1}}
    # The spec's StatefulSets (made before member-set hashes), the witness's pod down.
    sts = {"one": ready, "two": ready, "witness": {"status": {"readyReplicas": 0}}}
    quiet = membership_io.membership_plan({}, group, {}, sts, "set", {}, _Quiet())
    assert quiet == membership.MembershipPlan() and not asked
    looked = membership_io.membership_plan({}, group, {}, sts, "set", {}, _Quiet(), compare=True)
    # Not the witness, whose pod is not ready: it would hold the reconcile for a timeout.
    assert {(m, p) for m, p, _ in asked} == {("one", "/status"), ("two", "/status")}
    assert all(body is None for _, _, body in asked), "a comparison must ask nothing"
    assert looked.request is None and not looked.changing
    assert looked.spec_match is not None
    assert looked.spec_match[:2] == ("False", membership.CHANGED_OUTSIDE_SPEC)
    assert "witness is in the spec, not in the group" in looked.spec_match[2]
    # Without a leader among those that answer, the last comparison stands.
    statuses["one"]["role"] = "follower"
    unknown = membership_io.membership_plan({}, group, {}, sts, "set", {}, _Quiet(), compare=True)
    assert unknown.spec_match is None


class _Quiet:
    def __getattr__(self, _name: str) -> Any:
        return lambda *_a, **_k: None
