"""The I/O around the membership plan (``membership.plan_membership``, pure): each member's
``/status`` and ``/source-backlog`` read over its admin listener (mutual TLS, the
operator's own certificate from the group CA), the one request the plan names sent to the
leader, and the backfill SparkApplications created and deleted as the plan says."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kdsync.admin_client import AdminClient, AdminIdentityMismatch, AdminUnreachable
from kdsync_operator import audit, backfill, children, kube_api, membership, pki
from kdsync_operator.rollout import statefulset_ready
from kdsync_operator.spec import Group

Logger = logging.Logger | logging.LoggerAdapter[Any]

ADMIN_TIMEOUT_SECONDS = 5.0

# One client per group, CA and day: the operator's short-lived certificate is issued for
# it (pki.operator_credentials); keys are "<namespace>/<group>/<CA digest>/<day>".
_admin_clients: dict[str, AdminClient] = {}


def _admin_client(group: Group, pki_secrets: Mapping[str, Any]) -> AdminClient:
    ca_data = pki_secrets[children.ca_secret_name(group.name)]["data"]
    day = datetime.datetime.now(datetime.UTC).date().isoformat()
    prefix = f"{group.namespace}/{group.name}/"
    key = f"{prefix}{children.digest(ca_data)}/{day}"
    if key not in _admin_clients:
        for old in [k for k in _admin_clients if k.startswith(prefix)]:
            _admin_clients.pop(old).close()
        _admin_clients[key] = AdminClient(*pki.operator_credentials(group, pki_secrets), group.name)
    return _admin_clients[key]


def _ask(
    client: AdminClient, group: Group, member: str, path: str, body: Mapping[str, Any] | None
) -> tuple[int, dict[str, Any]] | str:
    """(HTTP status, answer) from ``member``'s admin listener, or why it did not answer."""
    address = children.admin_address(group, member)
    try:
        if body is None:
            return client.get_json(address, path, member, ADMIN_TIMEOUT_SECONDS)
        return client.post_json(address, path, member, dict(body), ADMIN_TIMEOUT_SECONDS)
    except (AdminUnreachable, AdminIdentityMismatch) as exc:
        return str(exc)


def membership_plan(
    obj: Mapping[str, Any],
    group: Group,
    pki_secrets: Mapping[str, Any],
    observed_sts: Mapping[str, Any],
    member_set: str,
    hashes: Mapping[str, str],
    logger: Logger,
    compare: bool = False,
) -> membership.MembershipPlan:
    """Reads the group's members over their admin listeners unless nothing can be
    changing (the StatefulSets are the spec's members, each made for the spec's member set,
    and the last status names no change under way) and ``compare`` is off. With it (the
    periodic resync), a group in which nothing is changing is read too, only to compare
    its configuration with the spec's (``membership.spec_match``); nothing is asked of it."""
    spec_members = [(m.name, m.witness) for m in group.spec.members]
    existing = sorted(observed_sts)
    progress = (obj.get("status") or {}).get("membership") or {}
    # A StatefulSet without the annotation was made by an operator before runtime
    # membership changes, whose webhook refused them: it runs the spec's member list.
    settled = {name for name, _ in spec_members} == set(existing) and all(
        children.members_hash(sts) in (member_set, None) for sts in observed_sts.values()
    )
    quiet = settled and not any(progress.values())
    if not existing or (quiet and not compare):
        return membership.MembershipPlan()
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    skip_drain = {
        m.strip()
        for m in str(annotations.get(membership.SKIP_DRAIN_ANNOTATION, "")).split(",")
        if m.strip()
    }
    # Only to compare: the members whose pods are ready, so that a member down does not
    # hold the reconcile for a timeout every resync (without the leader's answer, the
    # last comparison stands).
    asked = [m for m in existing if statefulset_ready(observed_sts[m])] if quiet else existing
    if not asked:
        return membership.MembershipPlan()
    client = _admin_client(group, pki_secrets)
    statuses: dict[str, Mapping[str, Any]] = {}
    unreachable: dict[str, str] = {}
    for member in asked:
        answer = _ask(client, group, member, "/status", None)
        if isinstance(answer, str):
            unreachable[member] = answer
        elif answer[0] == 200 and answer[1].get("member") == member:
            statuses[member] = answer[1]
        else:
            unreachable[member] = f"/status answered {answer[0]}"
    if quiet:
        return membership.MembershipPlan(spec_match=membership.spec_match(spec_members, statuses))
    states = _backfill_states(group, statuses, hashes, logger)
    observation = membership.GroupObservation(statuses, unreachable, backfills=states)

    def plan_for(seen: membership.GroupObservation) -> membership.MembershipPlan:
        return membership.plan_membership(
            spec_members,
            existing,
            seen,
            lambda m: children.peer_address(group, m),
            progress,
            skip_drain,
        )

    plan = plan_for(observation)
    leaving = plan.leaving_data_member
    if leaving is not None and leaving in statuses:
        answer = _ask(client, group, leaving, "/source-backlog", None)
        backlog = None
        if isinstance(answer, str):
            unreachable[leaving] = answer
        elif answer[0] == 200:
            backlog = int(sum((answer[1].get("backlog") or {}).values()))
        else:
            unreachable[leaving] = f"/source-backlog answered {answer[0]}: {answer[1]}"
        seen = membership.GroupObservation(statuses, unreachable, {leaving: backlog}, states)
        plan = plan_for(seen)
    return membership.with_spec_match(plan, spec_members, statuses)


def _backfill_applications(group: Group) -> dict[str, dict[str, Any]]:
    """The group's backfill SparkApplications by member ({} without the spark-operator)."""
    selector = (
        f"{children.GROUP_LABEL}={group.name},{children.COMPONENT_LABEL}={backfill.COMPONENT}"
    )
    try:
        items = kube_api.list_labelled(
            audit.SPARK_API, "SparkApplication", group.namespace, selector
        )
    except kube_api.KindNotServed:
        return {}
    found: dict[str, dict[str, Any]] = {}
    for item in items:
        member = backfill.backfill_member(item)
        if member:
            found[member] = item
    return found


def _delete_backfill(group: Group, member: str) -> None:
    name = backfill.backfill_name(group.name, member)
    kube_api.delete(audit.SPARK_API, "SparkApplication", group.namespace, name)
    kube_api.delete("v1", "Secret", group.namespace, name)


def _backfill_states(
    group: Group,
    statuses: Mapping[str, Mapping[str, Any]],
    hashes: Mapping[str, str],
    logger: Logger,
) -> dict[str, str]:
    """Each backfill's state; DELETING for one being deleted, or made for another join of
    its member (a learner now: deleted here, so that it runs afresh)."""
    _, config = membership.leader_configuration(statuses)
    learners = config.get("learners", []) if config is not None else []
    states: dict[str, str] = {}
    for member, app in _backfill_applications(group).items():
        if (app.get("metadata") or {}).get("deletionTimestamp"):
            states[member] = membership.DELETING
            continue
        if member in learners and member in hashes:
            assert config is not None
            expected = backfill.join_stamp(int(config.get("index", 0)), hashes[member])
            if backfill.backfill_stamp(app) != expected:
                _delete_backfill(group, member)
                logger.info(
                    "group %s: deleted a backfill of %s made for another join", group.name, member
                )
                states[member] = membership.DELETING
                continue
        states[member] = audit.application_state(app)
    return states


def follow_backfills(
    group: Group,
    plan: membership.MembershipPlan,
    secrets: Mapping[str, Any],
    hashes: Mapping[str, str],
    driver_role: str,
    logger: Logger,
) -> None:
    """Creates the backfill the plan needs; deletes those the plan says are done with (a
    failed one of the member joining stays, for its log, until the user deletes it)."""
    if plan.backfill is not None and plan.join_index is not None:
        stamp = backfill.join_stamp(plan.join_index, hashes[plan.backfill])
        try:
            for child in backfill.backfill_objects(
                group, plan.backfill, secrets, driver_role, stamp
            ):
                kube_api.apply(child)
        except kube_api.KindNotServed:
            logger.warning(
                "group %s: cannot create the backfill of %s: is the spark-operator installed?",
                group.name,
                plan.backfill,
            )
    for member in plan.drop_backfills:
        _delete_backfill(group, member)
        logger.info("group %s: deleted the finished backfill of %s", group.name, member)


@dataclass(frozen=True)
class RequestOutcome:
    """What the leader said to a membership request, for an Event on the group."""

    message: str
    taken: bool  # 200: the leader took it (else it refused it: a warning)


def send(
    group: Group,
    pki_secrets: Mapping[str, Any],
    request: membership.MembershipRequest,
    logger: Logger,
) -> RequestOutcome | None:
    """Sends the plan's request to the leader; None when there is nothing to tell the
    user: it was not sent, or the answer was "ask again" (409: a leader change, a change
    settling), which the next round does."""
    client = _admin_client(group, pki_secrets)
    answer = _ask(client, group, request.to, "/membership", request.body)
    if isinstance(answer, str):
        logger.warning("group %s: membership request not sent: %s", group.name, answer)
        return None
    code, body = answer
    text = f"asked {request.to} {dict(request.body)}: {code} {body.get('outcome')}"
    if body.get("reason"):
        text += f" ({body['reason']})"
    logger.info("group %s: %s", group.name, text)
    if code == 409:
        return None
    return RequestOutcome(text[:1000], taken=code == 200)
