"""The operator's runtime membership changes: the plan from the group's reported
configuration to the spec, what the rollout leaves alone meanwhile, the webhook's
one-change-at-a-time rule, and the Joining/Leaving conditions."""

from __future__ import annotations

from typing import Any

from kdsync.config import parse_config
from kdsync_operator import children, membership, rollout, status, validation
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
    # Its sidecar answers: the leader is asked, with the address the others dial.
    statuses["arbiter"] = doc("arbiter", ["one", "two", "witness"], witness=True)
    existing = ["one", "two", "witness", "arbiter"]
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


def test_the_newest_configuration_decides_even_if_a_member_lags() -> None:
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


def test_without_a_leader_nothing_is_asked() -> None:
    statuses = {m: doc(m, ["one", "two", "witness"]) for m in ("one", "two")}
    plan = plan_membership(SPEC[:2], ["one", "two", "witness"], GroupObservation(statuses), peer)
    assert plan.request is None and plan.reason == "NoLeader" and plan.hold_updates


def test_a_data_member_added_to_the_spec_is_not_created() -> None:
    spec = [*SPEC, ("three", False)]
    plan = plan_membership(
        spec, ["one", "two", "witness"], GroupObservation(group_of("one", "two", "witness")), peer
    )
    assert plan.request is None and plan.reason == "BackfillNotDriven"
    assert plan.not_yet == {"three"} and "kdsync members add" in plan.message


def test_a_group_that_does_not_answer() -> None:
    silent = GroupObservation(unreachable={"one": "refused"})
    # New, or running the spec's members: nothing to change.
    assert not plan_membership(SPEC, [], silent, peer).changing
    assert not plan_membership(SPEC, ["one", "two", "witness"], silent, peer).changing
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
    def seen(m: str, topics: str | None, agreement: str) -> rollout.MemberObservation:
        return rollout.MemberObservation(m, True, True, "old", agreement, topics)

    desired = {"one": "new", "two": "new"}
    members_only = {m: seen(m, "t1", "a1") for m in desired}
    plan = rollout.plan_rollout(desired, members_only, agreement="a2", topics="t1")
    assert not plan.together and plan.apply == ("one",)
    topics = {m: seen(m, "t1", "a1") for m in desired}
    plan = rollout.plan_rollout(desired, topics, agreement="a2", topics="t2")
    assert plan.together and plan.apply == ("one", "two")
    # A StatefulSet of an operator before this one: its agreement hash decides, as before.
    older = {m: seen(m, None, "a1") for m in desired}
    assert rollout.plan_rollout(desired, older, agreement="a2", topics="t1").together


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
    assert parsed.allow_membership_changes
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


def test_the_webhook_refuses_what_the_operator_cannot_do() -> None:
    (problem,) = problems_of(roles(("one", False), ("two", False), ("witness", True), ("c", False)))
    assert "backfill" in problem and "kdsync members add c --member-config" in problem
    (problem,) = problems_of(roles(("one", False), ("two", False), ("witness", False)))
    assert "makes witness a data member" in problem and "under a new name" in problem
    (problem,) = [
        str(p)
        for p in validation.membership_change_problems(
            roles(("one", False), ("witness", True)), roles(("witness", True))
        )
    ]
    assert "last data member" in problem


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
