"""kopf handlers: fetch, call the pure functions, apply (API calls in ``kube_api``). The
only module importing kopf.

Run with ``kopf run --standalone --all-namespaces -m kdsync_operator.handlers``.

Every trigger (the group changed or resumed, a child StatefulSet or SparkApplication
changed, a periodic resync) runs the same idempotent ``reconcile``:

1. read the group, the Secrets it refers to and the existing PKI Secrets;
2. ``desired.build_children`` -> every desired object;
3. server-side apply the shared objects; ``rollout.plan_rollout`` decides which members'
   config Secret + StatefulSet may be applied now (one existing member at a time);
4. while the spec's members differ from the group's (or a change is under way),
   ``membership_io`` reads every member's ``/status`` over its admin listener and sends
   the one request ``membership.plan_membership`` names to the leader; the rollout leaves
   alone what that plan holds;
5. follow the audit (``audit.audit_outcome``), build the status (``status.build_status``),
   patch ``/status`` and post an Event for every condition transition. While members
   change, the reconcile runs again every ``KDSYNC_MEMBERSHIP_POLL_SECONDS`` (default 3).

Environment:

* ``KDSYNC_RESYNC_SECONDS`` (default 30): periodic reconcile interval;
* ``KDSYNC_WEBHOOK`` = ``on``/``off`` (default on): serve the validating webhook;
  ``KDSYNC_WEBHOOK_ADDR`` (0.0.0.0), ``KDSYNC_WEBHOOK_PORT`` (9443), ``KDSYNC_WEBHOOK_HOST``
  (the name the API server dials, for a kopf-managed configuration),
  ``KDSYNC_WEBHOOK_CERT``/``KDSYNC_WEBHOOK_KEY`` (PEM files; if unset a self-signed
  certificate is made), ``KDSYNC_WEBHOOK_MANAGED`` (if set, kopf creates/updates the
  ValidatingWebhookConfiguration of that name; the Helm chart renders its own instead);
* ``KDSYNC_AUDIT_DRIVER_CLUSTERROLE`` (default ``kdsync-operator-audit-driver``): the
  ClusterRole each group's audit driver is bound to in the group's namespace (the chart
  installs it and lets the operator bind only that one);
* ``KDSYNC_MEMBERSHIP_POLL_SECONDS`` (default 3): how soon a reconcile runs again while
  a member joins or leaves;
* ``KDSYNC_SCRAPE_METRICS`` = ``on`` to read ``kdsync_delivered_seq`` / ``kdsync_member_lag``
  from each sidecar's ``/metrics`` (pod IP, port 8080) for the per-member status.
"""

from __future__ import annotations

import base64
import datetime
import logging
import os
import tempfile
import threading
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import kopf
from kubernetes.client.exceptions import ApiException

from kdsync_operator import (
    audit,
    children,
    desired,
    kube_api,
    membership_io,
    pki,
    rollout,
    status,
    validation,
)
from kdsync_operator.spec import API_GROUP, API_VERSION, HTTP_PORT, PLURAL, Group

Logger = logging.Logger | logging.LoggerAdapter[Any]

RESYNC_SECONDS = float(os.environ.get("KDSYNC_RESYNC_SECONDS", "30"))
AUDIT_DRIVER_ROLE = os.environ.get(
    "KDSYNC_AUDIT_DRIVER_CLUSTERROLE", audit.DEFAULT_DRIVER_CLUSTER_ROLE
)
MANAGED_SELECTOR = {"app.kubernetes.io/managed-by": children.MANAGED_BY}
MEMBERSHIP_POLL_SECONDS = float(os.environ.get("KDSYNC_MEMBERSHIP_POLL_SECONDS", "3"))

_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(namespace: str, name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault((namespace, name), threading.Lock())


# --- startup: storage names under kdsync.io, the webhook server ------------------------


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, logger: Logger, **_: Any) -> None:
    settings.persistence.finalizer = f"{API_GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 300
    if os.environ.get("KDSYNC_WEBHOOK", "on") != "off":
        settings.admission.server = _webhook_server()
        managed = os.environ.get("KDSYNC_WEBHOOK_MANAGED")
        if managed:
            settings.admission.managed = managed
    kube_api.api_client()
    logger.info("kdsync operator configured (resync every %ss)", RESYNC_SECONDS)


def _webhook_server() -> Any:
    addr = os.environ.get("KDSYNC_WEBHOOK_ADDR", "0.0.0.0")
    port = int(os.environ.get("KDSYNC_WEBHOOK_PORT", "9443"))
    host = os.environ.get("KDSYNC_WEBHOOK_HOST") or None
    certfile = os.environ.get("KDSYNC_WEBHOOK_CERT")
    keyfile = os.environ.get("KDSYNC_WEBHOOK_KEY")
    if not certfile or not keyfile:
        from kdsync_operator.webhook_certs import self_signed  # noqa: PLC0415

        folder = Path(tempfile.mkdtemp(prefix="kdsync-webhook-"))
        cert, key = self_signed([host or "localhost", addr if addr != "0.0.0.0" else "127.0.0.1"])
        (folder / "tls.crt").write_bytes(cert)
        (folder / "tls.key").write_bytes(key)
        (folder / "tls.key").chmod(0o600)
        certfile, keyfile = str(folder / "tls.crt"), str(folder / "tls.key")
    return kopf.WebhookServer(addr=addr, port=port, host=host, certfile=certfile, pkeyfile=keyfile)


# --- admission -----------------------------------------------------------------------


@kopf.on.validate(
    API_GROUP, API_VERSION, PLURAL, id="validate-kdsyncgroup", operations=["CREATE", "UPDATE"]
)
def validate(
    spec: Mapping[str, Any], name: str | None, namespace: str | None, **kwargs: Any
) -> None:
    problems = validation.spec_problems(name or "group", namespace or "default", dict(spec))
    old = kwargs.get("old")  # the object before an UPDATE (kopf passes it; not typed there)
    old_spec = old.get("spec") if isinstance(old, Mapping) else None
    if isinstance(old_spec, Mapping):  # an UPDATE
        old_status = old.get("status") if isinstance(old, Mapping) else None
        meta = old.get("metadata") if isinstance(old, Mapping) else None
        generation = meta.get("generation") if isinstance(meta, Mapping) else None
        problems += validation.membership_change_problems(
            old_spec,
            spec,
            old_status if isinstance(old_status, Mapping) else None,
            generation if isinstance(generation, int) else None,
        )
    if problems:
        raise kopf.AdmissionError("; ".join(str(p) for p in problems), code=422)


# --- reconcile triggers --------------------------------------------------------------


@kopf.on.resume(API_GROUP, API_VERSION, PLURAL)
@kopf.on.create(API_GROUP, API_VERSION, PLURAL)
@kopf.on.update(API_GROUP, API_VERSION, PLURAL, field="spec")
def group_changed(name: str | None, namespace: str | None, logger: Logger, **_: Any) -> None:
    _reconcile_or_retry(namespace, name, logger)


@kopf.timer(API_GROUP, API_VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def resync(name: str | None, namespace: str | None, logger: Logger, **_: Any) -> None:
    # Also compares the group's members with the spec's, however quiet the group.
    _reconcile_or_retry(namespace, name, logger, compare=True)


@kopf.on.delete(API_GROUP, API_VERSION, PLURAL, optional=True)
def group_deleted(body: kopf.Body, **_: Any) -> None:
    kopf.info(
        body,
        reason="Deleted",
        message="children are removed through owner references; Kafka topics (T-global, "
        "internal topics) are retained (deletionPolicy: Retain)",
    )


def _parent_changed(labels: Mapping[str, str], namespace: str | None, logger: Logger) -> None:
    group = labels.get(children.GROUP_LABEL)
    if group and namespace:
        _reconcile_or_retry(namespace, group, logger, come_back=False)


@kopf.on.event("apps", "v1", "statefulsets", labels=MANAGED_SELECTOR)
def statefulset_event(
    labels: Mapping[str, str], namespace: str | None, logger: Logger, **_: Any
) -> None:
    _parent_changed(labels, namespace, logger)


@kopf.on.event("sparkoperator.k8s.io", "v1beta2", "sparkapplications")
def spark_event(labels: Mapping[str, str], namespace: str | None, logger: Logger, **_: Any) -> None:
    # Runs of a ScheduledSparkApplication carry its labels (the spark-operator copies them).
    # The report ConfigMap is not watched (that would mean watching every ConfigMap): the
    # job writes it before its application ends, and the periodic resync covers the rest.
    _parent_changed(labels, namespace, logger)


def _reconcile_or_retry(
    namespace: str | None,
    name: str | None,
    logger: Logger,
    *,
    come_back: bool = True,
    compare: bool = False,
) -> None:
    """``come_back``: while members change, fail temporarily so kopf runs this handler
    again soon (event handlers are not retried: the group's own handlers do it);
    ``compare``: read the group's configuration even if nothing is changing."""
    if not namespace or not name:
        return
    try:
        changing = reconcile(namespace, name, logger, compare=compare)
    except ApiException as exc:
        raise kopf.TemporaryError(f"API error {exc.status}: {exc.reason}", delay=5) from exc
    if changing and come_back:
        # Not an error: kopf's retry is the way to come back soon, not in a resync period.
        raise kopf.TemporaryError("members are changing", delay=MEMBERSHIP_POLL_SECONDS)


# --- reconcile -----------------------------------------------------------------------


def _decoded(secret: Mapping[str, Any] | None) -> dict[str, str]:
    data = (secret or {}).get("data") or {}
    return {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in data.items()}


def _referenced_secrets(group: Group) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    for member in group.spec.members:
        ref = member.kafka.properties_secret_ref if member.kafka else None
        if ref is not None and ref.name not in found:
            secret = kube_api.get("v1", "Secret", group.namespace, ref.name)
            if secret is not None:
                found[ref.name] = _decoded(secret)
    return found


def _existing_pki(group: Group) -> dict[str, dict[str, str]]:
    names = [children.ca_secret_name(group.name)] + [
        children.tls_secret_name(group.name, m.name) for m in group.spec.members
    ]
    result: dict[str, dict[str, str]] = {}
    for name in names:
        secret = kube_api.get("v1", "Secret", group.namespace, name)
        if secret is not None:
            result[name] = dict(secret.get("data") or {})
    return result


def _statefulsets(group: Group) -> dict[str, dict[str, Any]]:
    selector = (
        f"{children.GROUP_LABEL}={group.name},app.kubernetes.io/managed-by={children.MANAGED_BY}"
    )
    found: dict[str, dict[str, Any]] = {}
    for item in kube_api.list_labelled("apps/v1", "StatefulSet", group.namespace, selector):
        member = (item["metadata"].get("labels") or {}).get(children.MEMBER_LABEL)
        if member:
            found[member] = item
    return found


def _audit_state(group: Group) -> audit.AuditOutcome:
    if not group.spec.checks.enabled:
        return audit.audit_outcome(group, None, None)
    name = children.audit_name(group.name)
    namespace = group.namespace
    if group.spec.checks.schedule:
        scheduled = kube_api.get(audit.SPARK_API, "ScheduledSparkApplication", namespace, name)
        run = audit.last_run_name(scheduled)
        app = kube_api.get(audit.SPARK_API, "SparkApplication", namespace, run) if run else None
    else:
        app = kube_api.get(audit.SPARK_API, "SparkApplication", namespace, name)
    report = kube_api.get("v1", "ConfigMap", namespace, children.audit_report_configmap(group.name))
    return audit.audit_outcome(group, app, report)


def _member_metrics(group: Group) -> dict[str, status.MemberMetrics]:
    """Hook for per-member deliveredSeq/lag: off unless KDSYNC_SCRAPE_METRICS=on."""
    if os.environ.get("KDSYNC_SCRAPE_METRICS") != "on":
        return {}
    found: dict[str, status.MemberMetrics] = {}
    for member in group.spec.members:
        pod = kube_api.get(
            "v1", "Pod", group.namespace, f"{children.statefulset_name(group.name, member.name)}-0"
        )
        ip = ((pod or {}).get("status") or {}).get("podIP")
        if not ip:
            continue
        try:
            with urllib.request.urlopen(f"http://{ip}:{HTTP_PORT}/metrics", timeout=2) as r:
                found[member.name] = status.parse_metrics(
                    r.read().decode("utf-8", "replace"), member.name
                )
        except OSError:
            continue
    return found


def reconcile(namespace: str, name: str, logger: Logger, *, compare: bool = False) -> bool:
    """One reconcile; True while a membership step that ends soon is under way.
    ``compare``: compare the group's members with the spec's even if nothing changes."""
    with _lock(namespace, name):
        obj = kube_api.get(f"{API_GROUP}/{API_VERSION}", "KdsyncGroup", namespace, name)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return False
        return _reconcile(obj, logger, compare)


def _reconcile(obj: dict[str, Any], logger: Logger, compare: bool = False) -> bool:
    group = Group.from_object(obj)
    secrets = _referenced_secrets(group)
    pki_secrets = pki.desired_pki_secrets(group, _existing_pki(group))
    wanted = desired.build_children(group, pki_secrets, secrets, AUDIT_DRIVER_ROLE)
    observed_sts = _statefulsets(group)
    in_spec = {m.name for m in group.spec.members}
    extra = sorted(m for m in observed_sts if m not in in_spec)
    previous = obj.get("status") or {}
    members_plan = membership_io.membership_plan(
        obj, group, pki_secrets, observed_sts, wanted.member_set, wanted.hashes, logger, compare
    )
    holds: dict[str, Any] = {
        "hold_updates": members_plan.hold_updates,
        "not_yet": members_plan.not_yet,
        "keep": members_plan.keep,
    }
    plan = rollout.plan_rollout(
        wanted.hashes,
        {m: rollout.observe(m, observed_sts.get(m)) for m in wanted.hashes},
        extra,
        wanted.agreement,
        wanted.topics,
        wanted.member_set,
        **holds,
    )
    if plan.together and not wanted.problems:
        logger.warning(
            "group %s: %s (%s)", group.name, "; ".join(plan.notes), ", ".join(plan.apply)
        )
    if not wanted.problems:
        for child in wanted.shared:
            kube_api.apply(child)
        for member in plan.apply:
            for child in wanted.members[member]:
                applied = kube_api.apply(child)
                if child["kind"] == "StatefulSet":
                    observed_sts[member] = applied
            logger.info("applied member %s of group %s", member, group.name)
        for member in plan.delete:
            for kind, child_name in (
                ("StatefulSet", children.statefulset_name(group.name, member)),
                ("Secret", children.config_secret_name(group.name, member)),
                ("Secret", children.tls_secret_name(group.name, member)),
            ):
                kube_api.delete(
                    "apps/v1" if kind == "StatefulSet" else "v1", kind, group.namespace, child_name
                )
            observed_sts.pop(member, None)
        for child in wanted.audit:
            try:
                _apply_audit_child(child, group, logger)
            except kube_api.KindNotServed:
                logger.warning("cannot create %s: is the spark-operator installed?", child["kind"])
    if members_plan.request is not None and not wanted.problems:
        outcome = membership_io.send(group, pki_secrets, members_plan.request, logger)
        if outcome is not None:
            post = kopf.info if outcome.taken else kopf.warn
            post(cast(kopf.Body, obj), reason="MembershipChange", message=outcome.message)
    if not wanted.problems:
        membership_io.follow_backfills(
            group, members_plan, secrets, wanted.hashes, AUDIT_DRIVER_ROLE, logger
        )
    observed = {m: rollout.observe(m, observed_sts.get(m)) for m in wanted.hashes}
    after = rollout.plan_rollout(
        wanted.hashes,
        observed,
        [m for m in extra if m not in plan.delete],
        wanted.agreement,
        wanted.topics,
        wanted.member_set,
        **holds,
    )
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    new_status = status.build_status(
        group,
        observed,
        after,
        _audit_state(group),
        previous,
        now,
        wanted.problems,
        _member_metrics(group),
        just_updated=plan.updating,
        membership=members_plan,
    )
    if _differs(previous, new_status):
        kube_api.patch_status(
            f"{API_GROUP}/{API_VERSION}", "KdsyncGroup", group.namespace, group.name, new_status
        )
    for change in status.transitions(previous, new_status):
        post = kopf.warn if change.warning else kopf.info
        post(
            cast(kopf.Body, obj),
            reason=f"{change.condition}{change.status}",
            message=f"{change.reason}: {change.message}",
        )
    if plan.updating is not None:
        kopf.info(
            cast(kopf.Body, obj),
            reason="MemberUpdated",
            message=f"updated member {plan.updating}; others wait for it to be ready",
        )
    return members_plan.come_back_soon


def _apply_audit_child(child: Mapping[str, Any], group: Group, logger: Logger) -> None:
    existing = None
    if child["kind"] == "ScheduledSparkApplication":
        existing = kube_api.get(
            child["apiVersion"], child["kind"], group.namespace, child["metadata"]["name"]
        )
    kube_api.apply(child)
    if audit.schedule_changed(existing, child):
        kube_api.patch_status(
            child["apiVersion"],
            child["kind"],
            group.namespace,
            child["metadata"]["name"],
            {"nextRun": None},
        )
        logger.info("audit schedule of %s changed: its next run is computed afresh", group.name)


def _without_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _differs(previous: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether the merge patch of ``new`` would change ``previous`` (nulls delete keys)."""
    stored = _without_nulls(previous)
    return any(stored.get(key) != _without_nulls(value) for key, value in new.items())
