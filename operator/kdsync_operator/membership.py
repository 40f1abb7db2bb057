"""Membership changes the operator drives: from the group's own configuration to the
``members`` of its spec, one member at a time.

The group's configuration lives in its ordering log, not in Kubernetes: the handler reads
every member's ``/status`` over its admin listener (mutual TLS, the operator's identity
from the group CA) and calls ``plan_membership``, which names at most one request to send
to the leader and what the rollout must leave alone meanwhile:

* **a witness added to the spec**: its StatefulSet is created at once (its sidecar waits,
  since the others refuse it until the change is in their logs); once it answers, the
  leader is asked to add it with its peer address, and the group counts it from then on;
* **a member removed from the spec**: a data member is drained first (every record of its
  source topics ordered, so stop producing to them first), then the leader is asked to
  remove it (a leader asked to remove itself hands over first); its StatefulSet is deleted
  only once the removal is committed;
* meanwhile the other members keep their config: a member restarted onto the new member
  list before the change is in its log would be refused by the others (their lists are
  compared until the membership changed at runtime). They roll one at a time afterwards.

Adding a data member needs a backfill of its ``T-global`` (``kdsync members add
--member-config``), which the operator does not run yet: its StatefulSet is not created
and the condition says what to do. Pure: no Kubernetes client, no network.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kdsync.group_configuration import describe_configuration, leader_of, newest_configuration


@dataclass(frozen=True)
class GroupObservation:
    """What the operator learned from the members' admin listeners this round."""

    statuses: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # member -> /status
    unreachable: Mapping[str, str] = field(default_factory=dict)  # member -> why not
    # member -> records of its source topics not yet in its T-global (asked only of data
    # members leaving the group; None when it did not answer)
    backlog: Mapping[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class MembershipRequest:
    """One ``POST /membership`` to send to ``to`` (the leader)."""

    to: str
    body: Mapping[str, Any]


@dataclass(frozen=True)
class MembershipPlan:
    """What to ask of the group now, and what the rollout must not touch meanwhile."""

    request: MembershipRequest | None = None
    hold_updates: bool = False  # members in both lists keep their config for now
    not_yet: frozenset[str] = frozenset()  # members of the spec not to create yet
    keep: frozenset[str] = frozenset()  # members gone from the spec, still in the group
    joining: str | None = None  # the member being added
    leaving: str | None = None  # the member being removed
    reason: str = "Stable"
    message: str = "the group's members are the spec's"
    leaving_data_member: str | None = None  # ask its source backlog next round

    @property
    def changing(self) -> bool:
        return self.joining is not None or self.leaving is not None or self.hold_updates


def _members(config: Mapping[str, Any]) -> list[str]:
    return [*config.get("voters", []), *config.get("learners", [])]


def _silent(observation: GroupObservation) -> str:
    return "; ".join(f"{m}: {why}" for m, why in sorted(observation.unreachable.items()))


def plan_membership(
    spec_members: Sequence[tuple[str, bool]],
    existing: Sequence[str],
    observation: GroupObservation,
    peer_address: Callable[[str], str],
) -> MembershipPlan:
    """``spec_members``: (name, witness) in spec order; ``existing``: members that have a
    StatefulSet; ``peer_address``: the address the others dial a member at."""
    spec = dict(spec_members)
    data_members_new = frozenset(
        m for m, witness in spec.items() if not witness and m not in existing
    )
    config = newest_configuration(observation.statuses.values())
    if config is None:
        if not existing or set(existing) == set(spec):
            # A new group, or one whose members all run the spec's list: nothing to change
            # (a group that is starting answers nothing yet).
            return MembershipPlan(not_yet=data_members_new if existing else frozenset())
        gone = [m for m in existing if m not in spec]
        new = [m for m in spec if m not in existing]
        return MembershipPlan(
            hold_updates=True,
            not_yet=data_members_new,
            keep=frozenset(gone),
            joining=new[0] if new else None,
            leaving=gone[0] if gone else None,
            reason="GroupUnreachable",
            message="the members in the spec differ from the running ones, and no member "
            f"reports the group's configuration ({_silent(observation) or 'none answered'})"
            ": the change waits until they answer on their admin port",
        )
    members = _members(config)
    in_group = set(members)
    described = describe_configuration(config)
    leaving = [m for m in members if m not in spec]
    joining = [m for m in spec if m not in in_group]
    keep = frozenset(leaving)
    leader = leader_of(observation.statuses)
    if not config.get("committed"):
        return MembershipPlan(
            hold_updates=True,
            not_yet=data_members_new,
            keep=keep,
            reason="Committing",
            message=f"a membership change is being committed: {described}",
            joining=joining[0] if joining else None,
            leaving=leaving[0] if leaving else None,
        )
    if leaving:
        return _leave(leaving[0], config, observation, leader, keep, data_members_new)
    if joining:
        return _join(joining[0], spec[joining[0]], observation, leader, peer_address, keep)
    return MembershipPlan(
        not_yet=data_members_new, message=f"the group's members are the spec's: {described}"
    )


def _leave(
    member: str,
    config: Mapping[str, Any],
    observation: GroupObservation,
    leader: str | None,
    keep: frozenset[str],
    not_yet: frozenset[str],
) -> MembershipPlan:
    base = MembershipPlan(hold_updates=True, keep=keep, not_yet=not_yet, leaving=member)
    if member not in config.get("witnesses", []):
        backlog = observation.backlog.get(member)
        if backlog is None or backlog > 0:
            state = (
                f"{backlog} records of its source topics are not ordered yet"
                if backlog is not None
                else f"it does not answer ({observation.unreachable.get(member, 'no answer')})"
            )
            return _with(
                base,
                reason="Draining",
                message=f"removing {member}: waiting until every record of its source topics "
                f"is ordered ({state}); stop producing to them, since what it reads after its "
                "removal never enters the order",
                leaving_data_member=member,
            )
    if leader is None:
        return _with(
            base,
            reason="NoLeader",
            message=f"removing {member}: no member reports a leader ({_silent(observation)})",
        )
    return _with(
        base,
        request=MembershipRequest(leader, {"remove": member}),
        reason="Removing",
        message=f"removing {member}: asked {leader}, which leads"
        + (" (it hands over first)" if leader == member else ""),
    )


def _join(
    member: str,
    witness: bool,
    observation: GroupObservation,
    leader: str | None,
    peer_address: Callable[[str], str],
    keep: frozenset[str],
) -> MembershipPlan:
    base = MembershipPlan(hold_updates=True, keep=keep, joining=member)
    if not witness:
        return _with(
            base,
            not_yet=frozenset({member}),
            reason="BackfillNotDriven",
            message=f"adding data member {member} needs a backfill of its T-global, which "
            "the operator does not run yet: take it out of the spec, or add it with "
            "`kdsync members add --member-config` (docs/operations.md)",
        )
    own = observation.statuses.get(member)
    if own is None:
        why = observation.unreachable.get(member, "its pod does not answer yet")
        return _with(
            base,
            reason="WaitingForSidecar",
            message=f"adding witness {member}: waiting for its sidecar ({why})",
        )
    if own.get("witness") is not True:
        return _with(
            base,
            reason="WrongRole",
            message=f"{member}'s sidecar runs as a data member, not a witness",
        )
    if leader is None:
        return _with(
            base,
            reason="NoLeader",
            message=f"adding witness {member}: no member reports a leader ({_silent(observation)})",
        )
    body = {"add": member, "witness": True, "peer": peer_address(member)}
    return _with(
        base,
        request=MembershipRequest(leader, body),
        reason="Adding",
        message=f"adding witness {member}: asked {leader}, which leads",
    )


def _with(plan: MembershipPlan, **changes: Any) -> MembershipPlan:
    return MembershipPlan(**{**plan.__dict__, **changes})


def conditions(plan: MembershipPlan) -> list[tuple[str, str, str, str]]:
    """(type, status, reason, message) of the ``Joining`` and ``Leaving`` conditions."""
    joining = (
        ("Joining", "True", plan.reason, plan.message)
        if plan.joining is not None
        else ("Joining", "False", "NoMemberJoining", "no member is being added")
    )
    leaving = (
        ("Leaving", "True", plan.reason, plan.message)
        if plan.leaving is not None
        else ("Leaving", "False", "NoMemberLeaving", "no member is being removed")
    )
    if plan.joining is None and plan.leaving is None and plan.hold_updates:
        # Which way is not known: the group is unreachable, or commits a change.
        joining = ("Joining", "Unknown", plan.reason, plan.message)
        leaving = ("Leaving", "Unknown", plan.reason, plan.message)
    return [joining, leaving]
