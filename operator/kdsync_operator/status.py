"""The group's status: conditions, per-member status, and the Events worth emitting.

Conditions (each with observedGeneration, reason, message, lastTransitionTime):

* ``Ready``: every member exists, runs the current spec and is ready.
* ``Progressing``: a rollout is under way (members missing or on an older config).
* ``Degraded``: the config cannot be rendered, a member that is not being updated is
  not ready, or fewer than a majority of members are ready.
* ``Consistent``: the last audit's verdict (see ``kdsync_operator.audit``).
* ``Joining`` / ``Leaving``: a member is being added to / removed from the running group
  (``kdsync_operator.membership``: the reason names the step it waits for);
  ``Backfilling``: a new data member's backfill SparkApplication runs.
* ``MembersMatchSpec``: the group's own configuration (its leader's) has the spec's
  members; False with ``ChangedOutsideSpec`` after a change made without the operator
  (``kdsync members`` by hand), which it reports and does not undo. Compared at every
  resync, and whenever the operator reads the group for a change.

``lastTransitionTime`` only moves when a condition's status changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kdsync_operator.audit import AuditOutcome
from kdsync_operator.membership import CHANGED_OUTSIDE_SPEC, MembershipPlan
from kdsync_operator.membership import conditions as membership_conditions
from kdsync_operator.rollout import MemberObservation, RolloutPlan
from kdsync_operator.spec import Group, SpecProblem

# Whether the group's own configuration has the spec's members (membership.spec_match).
MEMBERS_MATCH_SPEC = "MembersMatchSpec"
CONDITION_TYPES = (
    "Ready", "Progressing", "Degraded", "Consistent", "Joining", "Backfilling", "Leaving",
    MEMBERS_MATCH_SPEC,
)  # fmt: skip
# Appended to the Consistent message while a new audit run is under way.
IN_PROGRESS_NOTE = " (meanwhile: "


@dataclass(frozen=True)
class MemberMetrics:
    """What a sidecar reports on /metrics (kdsync_delivered_seq, kdsync_member_lag,
    kdsync_global_topic_config_drift)."""

    delivered_seq: int | None = None
    lag: int | None = None
    # "<topic> <config>" of each T-global config off the rule and left so (sorted).
    config_drift: tuple[str, ...] = ()


def parse_metrics(text: str, member: str) -> MemberMetrics:
    """The two gauges from ``member``'s sidecar's Prometheus text exposition.

    ``kdsync_delivered_seq`` is per topic: the highest counts. ``kdsync_member_lag`` is per
    member, and a leader reports every member's: only ``member``'s own sample counts.
    """
    delivered: float | None = None
    lag: float | None = None
    drift: set[str] = set()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "kdsync_delivered_seq":
                    delivered = sample.value if delivered is None else max(delivered, sample.value)
                elif sample.name == "kdsync_member_lag" and sample.labels.get("member") == member:
                    lag = sample.value
                elif sample.name == "kdsync_global_topic_config_drift" and sample.value >= 1:
                    drift.add(f"{sample.labels.get('topic')} {sample.labels.get('config')}")
    except ValueError:
        return MemberMetrics()  # not Prometheus text: nothing is known
    return MemberMetrics(
        delivered_seq=None if delivered is None else int(delivered),
        lag=None if lag is None else int(lag),
        config_drift=tuple(sorted(drift)),
    )


def _rolling_member(
    previous: Mapping[str, Any],
    plan: RolloutPlan,
    observed: Mapping[str, MemberObservation],
    just_updated: str | None,
) -> str | None:
    """The member whose update is in flight: updated now, or earlier and not ready yet."""
    if just_updated is not None:
        return just_updated
    if plan.updating is not None:
        return plan.updating
    earlier = (previous.get("rollout") or {}).get("updating")
    seen = observed.get(earlier) if isinstance(earlier, str) else None
    if seen is not None and seen.exists and not seen.ready:
        return str(earlier)
    return None


NOT_COMPARED = (
    "Unknown",
    "NotCompared",
    "the group's members are compared with the spec's at the operator's next resync",
)


def _condition(
    group: Group, kind: str, status: str, reason: str, message: str,
    previous: Mapping[str, Mapping[str, Any]], now: str,
) -> dict[str, Any]:  # fmt: skip
    before = previous.get(kind, {})
    changed = before.get("status") != status
    return {
        "type": kind,
        "status": status,
        "observedGeneration": group.generation,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now
        if changed or not before.get("lastTransitionTime")
        else before["lastTransitionTime"],
    }


def build_status(
    group: Group,
    observed: Mapping[str, MemberObservation],
    plan: RolloutPlan,
    audit: AuditOutcome,
    previous: Mapping[str, Any] | None,
    now: str,
    problems: Sequence[SpecProblem] = (),
    metrics: Mapping[str, MemberMetrics] | None = None,
    just_updated: str | None = None,
    membership: MembershipPlan | None = None,
) -> dict[str, Any]:
    """The whole ``status`` (``plan`` is the rollout plan AFTER this round's applies;
    ``just_updated`` the member this round updated, if any; ``membership`` this round's
    membership plan, for the Joining, Backfilling and Leaving conditions)."""
    previous = previous or {}
    rolling = _rolling_member(previous, plan, observed, just_updated)
    old: dict[str, Mapping[str, Any]] = {
        str(c.get("type")): c for c in previous.get("conditions") or [] if isinstance(c, dict)
    }
    metrics = metrics or {}
    members = [m.name for m in group.spec.members]
    outdated = set(plan.outdated)
    ready = [m for m in members if observed.get(m) and observed[m].ready and m not in outdated]
    majority = len(members) // 2 + 1
    member_status = []
    for member in group.spec.members:
        seen = observed.get(member.name)
        entry: dict[str, Any] = {
            "name": member.name,
            "witness": member.witness,
            "ready": bool(seen and seen.ready),
            "updated": member.name not in outdated,
        }
        facts = metrics.get(member.name)
        if facts is not None and facts.delivered_seq is not None:
            entry["deliveredSeq"] = facts.delivered_seq
        if facts is not None and facts.lag is not None:
            entry["lag"] = facts.lag
        if facts is not None and facts.config_drift:
            entry["globalTopicConfigDrift"] = list(facts.config_drift)
        member_status.append(entry)

    def cond(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
        return _condition(group, kind, status, reason, message, old, now)

    if problems:
        text = "; ".join(str(p) for p in problems)[:2000]
        ready_c = cond("Ready", "False", "ConfigInvalid", text)
        progressing = cond("Progressing", "False", "ConfigInvalid", "nothing is rolled out")
        degraded = cond("Degraded", "True", "ConfigInvalid", text)
    else:
        all_ready = len(ready) == len(members) and plan.done
        if all_ready:
            ready_c = cond("Ready", "True", "AllMembersReady",
                           f"{len(ready)}/{len(members)} members ready on generation "
                           f"{group.generation}")  # fmt: skip
        else:
            waiting = [m for m in members if m not in ready]
            ready_c = cond("Ready", "False", "MembersNotReady",
                           f"{len(ready)}/{len(members)} members ready; waiting for "
                           f"{', '.join(waiting)}")  # fmt: skip
        if rolling is not None:
            progressing = cond("Progressing", "True", "RollingUpdate",
                               f"updating member {rolling}; the others wait until it "
                               "is ready again")  # fmt: skip
        elif outdated or plan.delete:
            detail = "; ".join(plan.notes) or f"members to roll: {', '.join(sorted(outdated))}"
            progressing = cond("Progressing", "True", "RolloutWaiting", detail)
        elif not all_ready:
            progressing = cond("Progressing", "True", "WaitingForMembers",
                               "members are starting")  # fmt: skip
        else:
            progressing = cond("Progressing", "False", "RolloutComplete",
                               "every member runs the current spec")  # fmt: skip
        up = [m for m in members if observed.get(m) and observed[m].ready]
        existing = all(observed.get(m) and observed[m].exists for m in members)
        stuck = [m for m in members if observed.get(m) and observed[m].exists
                 and not observed[m].ready and m != rolling and m not in outdated]  # fmt: skip
        if existing and len(up) < majority:
            degraded = cond("Degraded", "True", "MajorityLost",
                            f"only {len(up)} of {len(members)} members ready; ordering needs "
                            f"{majority}")  # fmt: skip
        elif existing and stuck and not all_ready and rolling is None and outdated:
            degraded = cond("Degraded", "True", "RolloutBlocked",
                            f"rollout blocked: {', '.join(stuck)} not ready")  # fmt: skip
        elif existing and stuck and not outdated:
            degraded = cond("Degraded", "True", "MemberNotReady",
                            f"{', '.join(stuck)} not ready; the group runs with "
                            f"{len(up)}/{len(members)}")  # fmt: skip
        else:
            degraded = cond("Degraded", "False", "AsExpected", "no member is failing")
    consistent = cond("Consistent", audit.status, audit.reason, audit.message)
    earlier: Mapping[str, Any] = next(
        (c for c in previous.get("conditions") or [] if c.get("type") == "Consistent"), {}
    )
    if audit.in_progress and earlier.get("status") in ("True", "False"):
        # A new run proves nothing until it ends: the last verdict stands meanwhile (same
        # status, reason and transition time), and its message says what is under way.
        verdict = str(earlier.get("message", "")).split(IN_PROGRESS_NOTE)[0]
        consistent = dict(
            earlier,
            observedGeneration=group.generation,
            message=f"{verdict}{IN_PROGRESS_NOTE}{audit.message})",
        )
    match = membership.spec_match if membership is not None else None
    # Not compared this round: the last comparison stands (any edit of spec.members makes
    # the operator read the group, so one carried over is never of an older member list).
    if match is None:
        last = old.get(MEMBERS_MATCH_SPEC)
        match = (
            (str(last.get("status")), str(last.get("reason")), str(last.get("message")))
            if last
            else NOT_COMPARED
        )
    delivered = [e["deliveredSeq"] for e in member_status if "deliveredSeq" in e]
    status: dict[str, Any] = {
        "observedGeneration": group.generation,
        "conditions": [
            ready_c,
            progressing,
            degraded,
            consistent,
            *(cond(*entry) for entry in membership_conditions(membership or MembershipPlan())),
            cond(MEMBERS_MATCH_SPEC, *match),
        ],
        "members": member_status,
        "readyMembers": f"{len(ready)}/{len(members)}",
        "deliveredSeq": min(delivered) if delivered else None,
        # What the webhook reads to allow one membership change at a time.
        "membership": {
            "joining": membership.joining if membership else None,
            "leaving": membership.leaving if membership else None,
        },
        "rollout": {
            "updating": rolling,
            "waitingFor": list(plan.waiting_for),
            "outdated": list(plan.outdated),
        },
    }
    if audit.last_audit is not None:
        status["lastAudit"] = audit.last_audit
    elif previous.get("lastAudit"):
        status["lastAudit"] = previous["lastAudit"]
    return status


@dataclass(frozen=True)
class Transition:
    condition: str
    status: str
    reason: str
    message: str
    warning: bool


def transitions(previous: Mapping[str, Any] | None, current: Mapping[str, Any]) -> list[Transition]:
    """Condition changes worth a Kubernetes Event (status or reason changed)."""
    old = {c.get("type"): c for c in (previous or {}).get("conditions") or []}
    found: list[Transition] = []
    for cond in current.get("conditions", []):
        before = old.get(cond["type"], {})
        if before.get("status") == cond["status"] and before.get("reason") == cond["reason"]:
            continue
        if (
            not before
            and cond["type"] in ("Joining", "Backfilling", "Leaving")
            and cond["status"] == "False"
        ):
            continue  # nothing joining or leaving is news only after something did
        if cond["type"] == MEMBERS_MATCH_SPEC and CHANGED_OUTSIDE_SPEC not in (
            cond["reason"],
            before.get("reason"),
        ):
            continue  # a change of the operator's own is told by Joining and Leaving
        warning = (
            (cond["type"] == "Degraded" and cond["status"] == "True")
            or (cond["type"] == "Consistent" and cond["status"] == "False")
            or cond["reason"] == CHANGED_OUTSIDE_SPEC
        )
        found.append(
            Transition(cond["type"], cond["status"], cond["reason"], cond["message"], warning)
        )
    return found
