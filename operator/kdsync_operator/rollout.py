"""The rollout plan: which members' StatefulSets may be applied now.

A group of n members needs a majority (n // 2 + 1) up to keep ordering. A spec change
touches every member's config, so applying it everywhere at once would restart every
sidecar together and stop the group. The plan therefore:

* creates missing members at once (a member that does not exist holds no vote anyway);
* updates at most ONE existing, outdated member per step, and only when every OTHER
  member is ready: the updated one is the only member that can be down, so the group
  never loses more than one vote, and a second member is not touched until the first
  is ready again on its new revision;
* deletes StatefulSets of members removed from the spec only once the rest is
  up to date and ready.

One kind of change cannot go one member at a time: one of the topics settings, which
every member must share (``children.topics_agreement``). The sidecars compare them when
they connect and refuse a peer whose settings differ, so the first member updated could
never rejoin the others and never become ready, and the rollout would wait for it for
ever. Such a change updates every member at once: the group pauses ordering while they
restart (no events are lost; sources are read on from the ledger's positions), which is
what docs/operations.md tells users to expect. (StatefulSets of an older operator carry
only the agreement hash, which covers the member list too; theirs is compared instead.)

The member set itself changes at runtime, one member at a time (``membership.py``): while
the group's configuration differs from the spec, members in both keep their config
(``hold_updates``), a new data member is not created (``not_yet``) and a removed member's
StatefulSet stays until the group no longer counts it (``keep``).

"Ready" is read from the StatefulSet status: the controller has observed the current
generation, the update revision is the current revision, and the replica is ready.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kdsync_operator.children import agreement_hash, config_hash, members_hash, topics_hash


@dataclass(frozen=True)
class MemberObservation:
    name: str
    exists: bool
    ready: bool
    hash: str | None
    agreement: str | None = None  # None: not known (an older operator made the StatefulSet)
    topics: str | None = None  # None: not known (an operator before runtime membership)
    members: str | None = None  # member-set hash; None: not known (the same)


def statefulset_ready(sts: Mapping[str, Any] | None) -> bool:
    if not sts:
        return False
    generation = sts.get("metadata", {}).get("generation") or 0
    status = sts.get("status") or {}
    if (status.get("observedGeneration") or 0) < generation:
        return False
    current, update = status.get("currentRevision"), status.get("updateRevision")
    if current and update and current != update:
        return False
    return int(status.get("readyReplicas") or 0) >= 1


def observe(name: str, sts: Mapping[str, Any] | None) -> MemberObservation:
    return MemberObservation(
        name=name,
        exists=sts is not None,
        ready=statefulset_ready(sts),
        hash=config_hash(sts) if sts is not None else None,
        agreement=agreement_hash(sts) if sts is not None else None,
        topics=topics_hash(sts) if sts is not None else None,
        members=members_hash(sts) if sts is not None else None,
    )


@dataclass(frozen=True)
class RolloutPlan:
    apply: tuple[str, ...] = ()  # members whose config Secret + StatefulSet to apply now
    delete: tuple[str, ...] = ()  # removed members whose StatefulSet to delete
    outdated: tuple[str, ...] = ()  # members still on an older config (incl. apply)
    waiting_for: tuple[str, ...] = ()  # not-ready members holding the rollout back
    updating: str | None = None  # the member being updated in this step
    together: bool = False  # every outdated member is applied at once (shared settings)
    notes: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.outdated and not self.delete and not self.waiting_for


def _shared_settings_differ(
    seen: MemberObservation, agreement: str | None, topics: str | None, members: str | None
) -> bool:
    """Whether ``seen``'s member must restart together with the others: its topics
    settings differ, or its member list differs only in order (the same set; lists are
    compared in order until the membership changes at runtime). A different member set is
    a runtime change, after which lists are not compared: one at a time."""
    if agreement is None or seen.agreement in (None, agreement):
        return False
    if seen.topics is None or seen.members is None:
        return True  # an older operator's StatefulSet: the agreement is all there is
    return (topics is not None and seen.topics != topics) or seen.members == members


def plan_rollout(
    desired: Mapping[str, str],
    observed: Mapping[str, MemberObservation],
    extra: Sequence[str] = (),
    agreement: str | None = None,
    topics: str | None = None,
    members: str | None = None,
    *,
    hold_updates: bool = False,
    not_yet: Collection[str] = (),
    keep: Collection[str] = (),
) -> RolloutPlan:
    """``desired``: member -> desired config hash, in spec order. ``observed``: member ->
    what its StatefulSet shows. ``extra``: members that have a StatefulSet but are no
    longer in the spec. ``agreement``/``topics``/``members``: the desired agreement,
    topics and member-set hashes.
    ``hold_updates``, ``not_yet``, ``keep``: from the membership plan (module doc)."""
    order = list(desired)
    missing = [
        m
        for m in order
        if not observed.get(m, MemberObservation(m, False, False, None)).exists and m not in not_yet
    ]
    existing = [m for m in order if m not in missing and m not in not_yet]
    outdated = [m for m in existing if observed[m].hash != desired[m]]
    not_ready = [m for m in existing if not observed[m].ready]
    if hold_updates:
        return RolloutPlan(
            apply=tuple(missing),
            outdated=tuple(missing + outdated),
            notes=[
                "the group's members are changing: the others keep their config until "
                "the change is committed"
            ]
            if outdated
            else [],
        )
    if any(_shared_settings_differ(observed[m], agreement, topics, members) for m in outdated):
        return RolloutPlan(
            apply=tuple(missing + outdated),
            outdated=tuple(missing + outdated),
            together=True,
            notes=[
                "the topics settings changed: members with different settings "
                "refuse each other, so every member restarts at once"
            ],
        )
    apply = list(missing)
    updating: str | None = None
    for member in outdated:
        if all(other == member for other in not_ready):
            updating = member
            apply.append(member)
            break
    waiting = [] if updating is not None or not outdated else not_ready
    delete: list[str] = []
    if not outdated and not missing and not not_ready:
        delete = [m for m in extra if m not in keep]
    notes: list[str] = []
    if outdated and updating is None:
        notes.append(
            f"waiting for {', '.join(not_ready)} to be ready before updating {outdated[0]}"
        )
    return RolloutPlan(
        apply=tuple(apply),
        delete=tuple(delete),
        outdated=tuple(missing + outdated),
        waiting_for=tuple(waiting),
        updating=updating,
        notes=notes,
    )
