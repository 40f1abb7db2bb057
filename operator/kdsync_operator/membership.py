"""Membership changes the operator drives: from the group's own configuration to the
``members`` of its spec, one member at a time.

The group's configuration lives in its ordering log, not in Kubernetes: the handler reads
every member's ``/status`` over its admin listener (mutual TLS, the operator's identity
from the group CA) and calls ``plan_membership``, which names at most one request to send
to the leader and what the rollout must leave alone meanwhile:

Only the leader's configuration decides (never older than a follower's; a new witness
reports its own startup list, which names it, but never leads); without a leader nothing
is asked and everything is held.

* **a witness added to the spec**: its StatefulSet is created at once (its sidecar waits,
  since the others refuse it until the change is in their logs); once it answers and
  every voter answers, the leader is asked to add it with its peer address;
* **a data member added to the spec**: once every voter answers, the leader is asked to
  add it as a learner (with its peer address); then its cluster is seeded by a backfill
  SparkApplication (``backfill.py``); only once that COMPLETED is its StatefulSet
  created, and it joins like a restarted member: the leader makes it a voter once it
  caught up. A failed backfill is left for the user to read and delete (it resumes when
  created again);
* **a member removed from the spec**: a data member is drained first (every record of its
  source topics ordered, so stop producing to them first; a learner or a member named in
  the skip-drain annotation is not), then the leader is asked to remove it (a leader
  asked to remove itself hands over first); its StatefulSet is deleted only once the
  removal is committed;
* meanwhile the other members keep their config: a member restarted onto the new member
  list before the change is in its log would be refused by the others (their lists are
  compared until the membership changed at runtime). They roll one at a time afterwards.

Pure: no Kubernetes client, no network.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kdsync.group_configuration import (
    describe_configuration,
    leader_of,
    reported_configurations,
)


@dataclass(frozen=True)
class GroupObservation:
    """What the operator learned from the members' admin listeners this round."""

    statuses: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # member -> /status
    unreachable: Mapping[str, str] = field(default_factory=dict)  # member -> why not
    # member -> records of its source topics not yet in its T-global (asked only of data
    # members leaving the group; None when it did not answer)
    backlog: Mapping[str, int | None] = field(default_factory=dict)
    # member -> state of its backfill SparkApplication ("" when there is none)
    backfills: Mapping[str, str] = field(default_factory=dict)


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
    backfill: str | None = None  # the member whose backfill SparkApplication must exist
    backfilling: bool = False  # that backfill runs (the Backfilling condition)
    # Members whose backfill SparkApplication may go: voters that run, or members neither
    # the spec nor the group names (decided only from a leader's configuration).
    drop_backfills: frozenset[str] = frozenset()
    join_index: int | None = None  # the configuration index a learner's backfill is for
    # The MembersMatchSpec condition (status, reason, message); None when the group was
    # not looked at this round (the last one stands).
    spec_match: tuple[str, str, str] | None = None

    @property
    def changing(self) -> bool:
        return self.joining is not None or self.leaving is not None or self.hold_updates

    @property
    def come_back_soon(self) -> bool:
        """In a step that ends by itself soon (else the periodic resync looks again)."""
        return self.reason in _QUICK_STEPS


def _members(config: Mapping[str, Any]) -> list[str]:
    return [*config.get("voters", []), *config.get("learners", [])]


def leader_configuration(
    statuses: Mapping[str, Mapping[str, Any]],
) -> tuple[str | None, Mapping[str, Any] | None]:
    """The leader among ``statuses`` and the configuration it reports (the one that
    decides; None without a leader or a configuration)."""
    leader = leader_of(statuses)
    config = statuses[leader].get("configuration") if leader else None
    return leader, config if isinstance(config, Mapping) else None


# spec_match's reason for a difference that no change of the operator's explains.
CHANGED_OUTSIDE_SPEC = "ChangedOutsideSpec"


def spec_match(
    spec_members: Sequence[tuple[str, bool]], statuses: Mapping[str, Mapping[str, Any]]
) -> tuple[str, str, str] | None:
    """The ``MembersMatchSpec`` condition (status, reason, message) of a group in which
    the operator is changing nothing: whether the leader's configuration has exactly the
    spec's members; None without a leader (the last comparison then stands: a leader
    restarting in a roll must not flip it). They differ only after a change made without
    the operator (``kdsync members`` by hand). The operator reports it and does not undo
    it on its own: a member taken out by hand may be one that had to go."""
    leader, config = leader_configuration(statuses)
    if config is None:
        return None
    spec = dict(spec_members)
    members = _members(config)
    witnesses = set(config.get("witnesses", []))
    described = describe_configuration(config)
    differences = [
        *(f"{m} is in the spec, not in the group" for m in spec if m not in members),
        *(f"{m} is in the group, not in the spec" for m in members if m not in spec),
        *(
            f"{m} is a {'witness' if m in witnesses else 'data member'} in the group, "
            f"not in the spec"
            for m in members
            if m in spec and spec[m] != (m in witnesses)
        ),
    ]
    if not differences:
        return ("True", "MatchSpec", f"the group's members are the spec's: {described}")
    return (
        "False",
        CHANGED_OUTSIDE_SPEC,
        f"leader {leader}'s configuration is {described}: {'; '.join(differences)}. A "
        "change made without the operator (kdsync members)? The operator does not undo "
        "it, but the next edit of spec.members makes the group the spec's again, one "
        "change at a time: first make the spec say what the group should be",
    )


def with_spec_match(
    plan: MembershipPlan,
    spec_members: Sequence[tuple[str, bool]],
    statuses: Mapping[str, Mapping[str, Any]],
) -> MembershipPlan:
    """``plan`` with its ``MembersMatchSpec`` condition: while it adds or removes a
    member, the group differs from the spec by the operator's own doing."""
    if plan.joining is not None or plan.leaving is not None:
        match: tuple[str, str, str] | None = (
            "False",
            "ChangeUnderWay",
            f"the operator is making the group's members the spec's ({plan.reason}: "
            f"{plan.message})",
        )
    else:
        match = spec_match(spec_members, statuses)
    return _with(plan, spec_match=match)


def _silent(observation: GroupObservation) -> str:
    return "; ".join(f"{m}: {why}" for m, why in sorted(observation.unreachable.items()))


# Steps that end by themselves soon: the reconcile comes back quickly while in one.
_QUICK_STEPS = frozenset(
    {"Adding", "AddingLearner", "Removing", "Committing", "WaitingForSidecar", "Backfilling",
     "Starting", "CatchingUp"}
)  # fmt: skip


def plan_membership(
    spec_members: Sequence[tuple[str, bool]],
    existing: Sequence[str],
    observation: GroupObservation,
    peer_address: Callable[[str], str],
    progress: Mapping[str, str | None] | None = None,
    skip_drain: Collection[str] = (),
) -> MembershipPlan:
    """``spec_members``: (name, witness) in spec order; ``existing``: members that have a
    StatefulSet; ``peer_address``: the address the others dial a member at; ``progress``:
    the change the last status named (``joining``/``leaving``), kept while the group cannot
    say; ``skip_drain``: data members to remove without draining (the user's word).

    Only the leader's configuration decides (it is never older than a follower's, and a
    new witness, which reports its own startup list, never leads): without a leader the
    plan holds everything."""
    spec = dict(spec_members)
    if not existing:
        return MembershipPlan()  # a new group: every member starts from the spec's list
    leader, config = leader_configuration(observation.statuses)
    before = progress or {}
    if config is None:
        reported = reported_configurations(observation.statuses.values())
        gone = [m for m in existing if m not in spec]
        new = [m for m in spec if m not in existing]
        return MembershipPlan(
            hold_updates=True,
            # A data member without a StatefulSet starts only when every member that
            # answered counts it as a voter (a group being created): a learner or a new
            # member must not start before its backfill.
            not_yet=frozenset(
                m
                for m in new
                if not spec[m]
                and not (reported and all(m in c.get("voters", []) for c in reported))
            ),
            keep=frozenset(gone),
            joining=before.get("joining") or (new[0] if new else None),
            leaving=before.get("leaving") or (gone[0] if gone else None),
            reason="NoLeader" if observation.statuses else "GroupUnreachable",
            message="no member reports that it leads ("
            + (_silent(observation) or "every member answered")
            + "): members keep their config and no change is asked until one does (a "
            "majority of the voters must run and reach each other; see each sidecar's log)",
        )
    assert leader is not None  # a configuration comes from the leader's status
    members = _members(config)
    in_group = set(members)
    described = describe_configuration(config)
    leaving = [m for m in members if m not in spec]
    joining = [m for m in spec if m not in in_group]
    keep = frozenset(leaving)
    voters = set(config.get("voters", []))
    # Data members of the spec the group does not count as voters and that do not run:
    # new, or learners; each starts only once its backfill COMPLETED (``_seed``).
    data_members_new = frozenset(
        m for m, witness in spec.items() if not witness and m not in existing and m not in voters
    )
    drop = frozenset(
        m
        for m in observation.backfills
        if (m in voters and m in existing) or (m not in spec and m not in in_group)
    )
    if not config.get("committed"):
        return MembershipPlan(
            hold_updates=True,
            not_yet=data_members_new,
            keep=keep,
            reason="Committing",
            message=f"a membership change is being committed: {described}",
            joining=joining[0] if joining else before.get("joining"),
            leaving=leaving[0] if leaving else before.get("leaving"),
        )
    if leaving:
        member = leaving[0]
        plan = _leave(
            member, config, observation, leader, keep, data_members_new, member in skip_drain
        )
    elif joining:
        member = joining[0]
        plan = _join(
            member, spec[member], config, observation, leader, peer_address, keep, existing
        )
        plan = _with(plan, not_yet=plan.not_yet | data_members_new)
    elif learners := [m for m in config.get("learners", []) if m in spec]:
        plan = _seed(learners[0], existing, observation, keep, data_members_new)
        plan = _with(plan, join_index=int(config.get("index", 0)))
    else:
        plan = MembershipPlan(
            not_yet=data_members_new, message=f"the group's members are the spec's: {described}"
        )
    return _with(plan, drop_backfills=drop)


def _leave(
    member: str,
    config: Mapping[str, Any],
    observation: GroupObservation,
    leader: str,
    keep: frozenset[str],
    not_yet: frozenset[str],
    skip_drain: bool,
) -> MembershipPlan:
    base = MembershipPlan(hold_updates=True, keep=keep, not_yet=not_yet, leaving=member)
    # A learner orders nothing of its own until it votes (a backfill being backed out):
    # nothing to drain.
    learner = member in config.get("learners", [])
    if member not in config.get("witnesses", []) and not learner and not skip_drain:
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
                "removal never enters the order (to remove it without a drain, annotate the "
                f"KdsyncGroup {SKIP_DRAIN_ANNOTATION}={member})",
                leaving_data_member=member,
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
    config: Mapping[str, Any],
    observation: GroupObservation,
    leader: str,
    peer_address: Callable[[str], str],
    keep: frozenset[str],
    existing: Sequence[str],
) -> MembershipPlan:
    base = MembershipPlan(hold_updates=True, keep=keep, joining=member)
    if not witness:
        base = _with(base, not_yet=frozenset({member}))
        if member in existing:
            # Removed from the group while its StatefulSet still runs (the spec named it
            # again before the operator deleted it): its logs may be trimmed past what it
            # holds, so it joins again only afresh, through a backfill.
            return _with(
                base,
                reason="RemovedMemberRunning",
                message=f"{member} was removed from the group and its StatefulSet still "
                f"runs: take {member} out of the spec until its StatefulSet is gone, then "
                "add it again (its cluster is then seeded afresh)",
            )
    else:
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
                message=f"{member}'s sidecar runs as a data member, not a witness: a data "
                f"member of that name still runs; take {member} out of the spec until its "
                "StatefulSet is gone, then add the witness under another name",
            )
    # As `kdsync members add` does: the group counts a witness from the moment it is
    # appended (and keeps its logs for a learner), so every voter must answer, on a
    # release that reads a change carrying an address and, for a learner, reports what it
    # has stored (allDurable, which the backfill's point is chosen from).
    voters = [v for v in config.get("voters", []) if v != member]
    silent = [v for v in voters if v not in observation.statuses]
    needed = "peer" if witness else "allDurable"
    older = [
        v for v in voters if v in observation.statuses and needed not in observation.statuses[v]
    ]
    if silent or older:
        problem = (
            f"{', '.join(silent)} did not answer ({_silent(observation)})"
            if silent
            else f"{', '.join(older)} run(s) an older release: upgrade every member first"
        )
        return _with(
            base,
            reason="VotersNotReady",
            message=f"adding {member}: every voter must answer first: {problem}",
        )
    body = {"add": member, "witness": witness, "peer": peer_address(member)}
    kind = "witness" if witness else "data member"
    return _with(
        base,
        request=MembershipRequest(leader, body),
        reason="Adding" if witness else "AddingLearner",
        message=f"adding {kind} {member}: asked {leader}, which leads"
        + ("" if witness else ", to add it as a learner (its backfill follows)"),
    )


def _seed(
    member: str,
    existing: Sequence[str],
    observation: GroupObservation,
    keep: frozenset[str],
    not_yet: frozenset[str],
) -> MembershipPlan:
    """A learner of the spec: backfill its cluster, then start it; it votes once caught up."""
    base = MembershipPlan(hold_updates=True, keep=keep, joining=member, not_yet=not_yet)
    if member in existing:
        return _with(
            base,
            reason="CatchingUp",
            message=f"adding data member {member}: its sidecar runs; the leader makes it a "
            "voter once it has caught up",
        )
    state = observation.backfills.get(member, "")
    held = not_yet | {member}
    if state == DELETING:
        return _with(
            base,
            not_yet=held,
            reason="Backfilling",
            backfilling=True,
            message=f"adding data member {member}: waiting until an earlier backfill of it "
            "(another join, or a config since changed) is deleted, to run it afresh",
        )
    if state == "COMPLETED":
        return _with(
            base,
            backfill=member,
            not_yet=not_yet - {member},
            reason="Starting",
            message=f"adding data member {member}: its cluster is seeded; starting its sidecar",
        )
    if state in FAILED_STATES:
        return _with(
            base,
            not_yet=held,
            reason="BackfillFailed",
            message=f"adding data member {member}: its backfill ended {state}; read its "
            "driver's log, then delete the SparkApplication to run it again (it resumes), "
            f"or remove {member} from the spec to give up",
        )
    return _with(
        base,
        not_yet=held,
        backfill=member,
        backfilling=True,
        reason="Backfilling",
        message=f"adding data member {member}: a SparkApplication copies a peer's T-global "
        "into its cluster ("
        + (
            state.lower()
            or "created, no state yet: if it stays so, is the spark-operator installed and "
            "watching this namespace?"
        )
        + ")",
    )


# The KdsyncGroup annotation naming data members to remove without a drain (comma-separated).
SKIP_DRAIN_ANNOTATION = "kdsync.io/skip-drain"
# The spark-operator's states of an application that will not complete (with restartPolicy
# Never; FAILING and UNKNOWN pass).
FAILED_STATES = frozenset({"FAILED", "SUBMISSION_FAILED"})
# The state the handler reports for a backfill being deleted (or found stale and deleted).
DELETING = "DELETING"


def _with(plan: MembershipPlan, **changes: Any) -> MembershipPlan:
    return MembershipPlan(**{**plan.__dict__, **changes})


def conditions(plan: MembershipPlan) -> list[tuple[str, str, str, str]]:
    """(type, status, reason, message) of the ``Joining``, ``Backfilling`` and ``Leaving``
    conditions."""
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
    if plan.backfilling:
        backfilling = ("Backfilling", "True", plan.reason, plan.message)
    elif plan.reason == "BackfillFailed":
        backfilling = ("Backfilling", "False", plan.reason, plan.message)
    else:
        backfilling = ("Backfilling", "False", "NoBackfill", "no backfill runs")
    return [joining, backfilling, leaving]
