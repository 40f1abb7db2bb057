"""The consistency audit (issue #6) as Kubernetes objects, and its result as status.

With ``spec.checks.enabled`` the operator owns, for group ``g``:

* ``g-audit-config`` (Secret): the group's sidecar config, rendered for the first data
  member (configs differ only in ``member``), mounted at ``/etc/kdsync`` like in a sidecar;
* ``g-audit-report`` (ConfigMap): created empty; the Spark job writes ``report.json``;
* ``g-audit`` ServiceAccount, Role and RoleBinding: update rights on the report ConfigMap
  only; ``g-audit-driver`` RoleBinding: what a Spark driver needs to run its executors
  (pods, their services and config maps), from the ClusterRole the chart installs beside
  the operator's. The operator may only *bind* that ClusterRole, so it need not hold pod
  rights itself (RBAC forbids granting in a Role what the granter does not hold);
* ``g-audit``: a ``ScheduledSparkApplication`` when ``checks.schedule`` is set, else a
  one-off ``SparkApplication`` (sparkoperator.k8s.io/v1beta2).

``audit_outcome`` turns the application's state and the report into the ``Consistent``
condition and ``status.lastAudit``.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kdsync.audit.spark_conf import AUDIT_SPARK_CONF
from kdsync_operator import children
from kdsync_operator.children import Obj, SecretData
from kdsync_operator.spec import DEFAULT_SIDECAR_IMAGE, Group, SparkRoleSpec

SPARK_API = "sparkoperator.k8s.io/v1beta2"
REPORT_KEY = "report.json"
REPORT_VERSION = 1
TERMINAL_FAILED = frozenset({"FAILED", "SUBMISSION_FAILED", "FAILING", "UNKNOWN"})
# The chart's name for it with its default release name; the chart tells the operator
# the name it rendered (KDSYNC_AUDIT_DRIVER_CLUSTERROLE).
DEFAULT_DRIVER_CLUSTER_ROLE = "kdsync-operator-audit-driver"


def audit_config_secret_name(group: str) -> str:
    return f"{group}-audit-config"


def audit_service_account(group: Group) -> str:
    return group.spec.checks.service_account_name or children.audit_name(group.name)


def audit_arguments(group: Group) -> list[str]:
    report = f"{group.namespace}/{children.audit_report_configmap(group.name)}"
    # --verbose: the driver's log then says how long each Spark phase took.
    return ["--config", children.CONFIG_PATH, "--report-configmap", report, "--verbose"]


def _audit_member(group: Group) -> str:
    for member in group.spec.members:
        if not member.witness:
            return member.name
    return group.spec.members[0].name


def _shuffle_conf(executor: SparkRoleSpec) -> dict[str, str]:
    """Shuffle partitions for the executors there are: Spark's default of 200 costs one
    task each per shuffle, which dominates an incremental run (on one executor core an
    audit of 10k events took minutes, most of it task overhead). Twice the executor cores,
    at least 8 (what `kdsync audit` uses locally)."""
    partitions = max(8, 2 * executor.cores * executor.instances)
    return {"spark.sql.shuffle.partitions": str(partitions)}


def _pod_security() -> Obj:
    """The Spark pods meet the "restricted" Pod Security Standard, like the sidecar's."""
    return {
        "podSecurityContext": {
            "runAsNonRoot": True,
            "runAsUser": children.SIDECAR_UID,
            "runAsGroup": children.SIDECAR_UID,
            "fsGroup": children.SIDECAR_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def application_spec(group: Group) -> Obj:
    """The SparkApplication spec (also the ScheduledSparkApplication's template)."""
    checks = group.spec.checks
    image = checks.image or group.spec.sidecar.image or DEFAULT_SIDECAR_IMAGE
    mounts = [
        {"name": "config", "mountPath": children.CONFIG_DIR},
        {"name": "peer-tls", "mountPath": children.TLS_DIR},
    ]
    volumes: list[Obj] = [
        {
            "name": "config",
            "secret": {
                "secretName": audit_config_secret_name(group.name),
                "items": [{"key": "config.yaml", "path": "config.yaml"}],
            },
        },
        {
            "name": "peer-tls",
            "secret": {"secretName": children.tls_secret_name(group.name, _audit_member(group))},
        },
    ]
    for volume in children._kafka_ca_volumes(group):
        volumes.append(volume)
        member = volume["name"].removeprefix("kafka-ca-")
        mounts.append({"name": volume["name"], "mountPath": f"{children.KAFKA_CA_DIR}/{member}"})
    # The root filesystem is read-only, as the sidecar's: Spark's scratch space is the
    # local-dir volumes Spark mounts itself, and /tmp (java.io.tmpdir, the image's home) an
    # emptyDir of its own.
    volumes.append({"name": "tmp", "emptyDir": {}})
    mounts.append({"name": "tmp", "mountPath": "/tmp"})
    audit_labels = children.labels(group, "audit")
    spec: Obj = {
        "type": "Python",
        "pythonVersion": "3",
        "mode": "cluster",
        "image": image,
        "imagePullPolicy": group.spec.sidecar.image_pull_policy,
        "mainApplicationFile": children.AUDIT_MAIN,
        "arguments": audit_arguments(group),
        "sparkVersion": checks.spark_version,
        "restartPolicy": {"type": "Never"},
        # What `kdsync audit` sets in the sessions it starts itself: under spark-submit the
        # session exists before the audit runs (spark.redaction.regex also hides the
        # inline client-certificate key that kafka_options passes to Spark's Kafka client).
        "sparkConf": {**AUDIT_SPARK_CONF, **_shuffle_conf(checks.executor)},
        "volumes": volumes,
        "driver": {
            "cores": checks.driver.cores,
            "memory": checks.driver.memory,
            "serviceAccount": audit_service_account(group),
            "labels": audit_labels,
            "volumeMounts": mounts,
            **_pod_security(),
        },
        "executor": {
            "cores": checks.executor.cores,
            "memory": checks.executor.memory,
            "instances": checks.executor.instances,
            "labels": audit_labels,
            "volumeMounts": mounts,
            **_pod_security(),
        },
    }
    for role, settings in (("driver", checks.driver), ("executor", checks.executor)):
        if settings.core_request:
            spec[role]["coreRequest"] = settings.core_request
    if checks.packages:
        spec["deps"] = {"packages": list(checks.packages)}
    return spec


def spark_object(group: Group) -> Obj:
    checks = group.spec.checks
    meta = children._meta(group, children.audit_name(group.name), "audit")
    if checks.schedule:
        return {
            "apiVersion": SPARK_API,
            "kind": "ScheduledSparkApplication",
            "metadata": meta,
            "spec": {
                "schedule": checks.schedule,
                "concurrencyPolicy": checks.concurrency_policy,
                "successfulRunHistoryLimit": 3,
                "failedRunHistoryLimit": 3,
                "template": application_spec(group),
            },
        }
    return {
        "apiVersion": SPARK_API,
        "kind": "SparkApplication",
        "metadata": meta,
        "spec": application_spec(group),
    }


def driver_binding_name(group: str) -> str:
    return f"{children.audit_name(group)}-driver"


def rbac_objects(group: Group, driver_cluster_role: str) -> list[Obj]:
    """ServiceAccount (unless the user names their own), a Role for the report and a
    RoleBinding of ``driver_cluster_role`` (the Spark driver's executor rights) in the
    group's namespace only."""
    name = children.audit_name(group.name)
    subjects = [
        {
            "kind": "ServiceAccount",
            "name": audit_service_account(group),
            "namespace": group.namespace,
        }
    ]
    objects: list[Obj] = []
    if not group.spec.checks.service_account_name:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": children._meta(group, name, "audit"),
            }
        )
    objects.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": children._meta(group, name, "audit"),
            # The report: read and overwrite this one ConfigMap only.
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": [children.audit_report_configmap(group.name)],
                    "verbs": ["get", "update", "patch"],
                }
            ],
        }
    )
    objects.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": children._meta(group, name, "audit"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": subjects,
        }
    )
    objects.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": children._meta(group, driver_binding_name(group.name), "audit"),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": driver_cluster_role,
            },
            "subjects": subjects,
        }
    )
    return objects


def audit_objects(group: Group, secrets: SecretData, driver_cluster_role: str) -> list[Obj]:
    config, _ = children.sidecar_config(group, _audit_member(group), secrets)
    text = children.render_config(config)
    secret = children.config_secret(group, _audit_member(group), text)
    secret["metadata"] = children._meta(group, audit_config_secret_name(group.name), "audit")
    report = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": children._meta(group, children.audit_report_configmap(group.name), "audit"),
    }
    return [*rbac_objects(group, driver_cluster_role), secret, report, spark_object(group)]


def schedule_changed(existing: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """Whether applying ``desired`` changes an existing ScheduledSparkApplication's schedule.

    The spark-operator computes a schedule's next run once and keeps it in its status
    (``nextRun``) until that run starts, whatever the schedule says meanwhile: a group whose
    schedule goes from hourly to every minute would wait up to an hour. The operator clears
    ``status.nextRun`` after such a change, and the spark-operator computes it afresh.
    """
    if not existing or desired.get("kind") != "ScheduledSparkApplication":
        return False
    before = (existing.get("spec") or {}).get("schedule")
    return bool(before) and before != (desired.get("spec") or {}).get("schedule")


# --- following the audit -------------------------------------------------------------


@dataclass(frozen=True)
class AuditOutcome:
    """The Consistent condition and lastAudit derived from the audit's objects."""

    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str
    last_audit: Obj | None = None
    # A run is submitted or running: it proves nothing yet, so the verdict of the run
    # before it (if any) still stands (status.build_status keeps that condition).
    in_progress: bool = False


def application_state(app: Mapping[str, Any] | None) -> str:
    if not app:
        return ""
    state = app.get("status", {}).get("applicationState", {}).get("state", "")
    return state if isinstance(state, str) else ""


def last_run_name(scheduled: Mapping[str, Any] | None) -> str | None:
    """The SparkApplication a ScheduledSparkApplication started last."""
    if not scheduled:
        return None
    name = scheduled.get("status", {}).get("lastRunName")
    return name if isinstance(name, str) and name else None


def parse_report(configmap: Mapping[str, Any] | None) -> tuple[Obj | None, str]:
    """The report and, if it is unusable, why."""
    if not configmap:
        return None, "the report ConfigMap does not exist"
    raw = (configmap.get("data") or {}).get(REPORT_KEY)
    if not raw:
        return None, f"the report ConfigMap has no {REPORT_KEY}"
    try:
        report = json.loads(raw)
    except ValueError as exc:
        return None, f"{REPORT_KEY} is not JSON ({exc})"
    if not isinstance(report, dict):
        return None, f"{REPORT_KEY} is not a JSON object"
    if report.get("version") != REPORT_VERSION:
        return None, f"{REPORT_KEY} has version {report.get('version')!r}, expected 1"
    if not isinstance(report.get("passed"), bool):
        return None, f"{REPORT_KEY} has no boolean 'passed'"
    return report, ""


def _parse_time(text: object) -> datetime.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        value = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)


def audit_outcome(
    group: Group, app: Mapping[str, Any] | None, report_cm: Mapping[str, Any] | None
) -> AuditOutcome:
    """Maps (SparkApplication state, report) to the Consistent condition.

    * no checks / no run submitted yet: Unknown (``ChecksDisabled`` / ``NoAuditYet``);
    * running: Unknown ``AuditRunning``;
    * a run that is running or not yet submitted is marked in progress: the status keeps
      the previous run's verdict and lastAudit while there is one (a scheduled audit would
      otherwise turn Consistent to Unknown at every run);
    * FAILED / SUBMISSION_FAILED: Unknown ``AuditJobFailed`` (nothing was proved either way),
      unless the run left a failing report (``finishedAt`` not before its submission): the
      driver exits 1 on violations, which ends the application FAILED: False
      ``ViolationsFound``;
    * COMPLETED with a passing report: True ``AuditPassed``;
    * COMPLETED with violations: False ``ViolationsFound``;
    * COMPLETED without a usable report (missing, malformed, other group, older than
      the run): Unknown ``ReportMissing``.
    """
    if not group.spec.checks.enabled:
        return AuditOutcome("Unknown", "ChecksDisabled", "spec.checks.enabled is false")
    state = application_state(app)
    name = (app or {}).get("metadata", {}).get("name", children.audit_name(group.name))
    if not app:
        return AuditOutcome("Unknown", "NoAuditYet", "no audit run has been submitted yet")
    if not state:  # an application the spark-operator has not submitted yet
        return AuditOutcome(
            "Unknown",
            "NoAuditYet",
            f"audit run {name} has not been submitted yet",
            in_progress=True,
        )
    submitted = _parse_time(app.get("status", {}).get("lastSubmissionAttemptTime"))
    if state in TERMINAL_FAILED:
        # The driver exits 1 when it found violations, which the spark-operator records as
        # FAILED: a failing report written by this very run is its verdict.
        report, _ = parse_report(report_cm)
        finished = _parse_time((report or {}).get("finishedAt"))
        if (
            report is not None
            and report.get("group") == group.name
            and report["passed"] is False
            and submitted is not None
            and finished is not None
            and finished >= submitted
        ):
            return _verdict(report, name)
        detail = app.get("status", {}).get("applicationState", {}).get("errorMessage", "")
        message = f"audit run {name} ended {state}" + (f": {detail}" if detail else "")
        return AuditOutcome("Unknown", "AuditJobFailed", message)
    if state != "COMPLETED":
        return AuditOutcome(
            "Unknown", "AuditRunning", f"audit run {name} is {state}", in_progress=True
        )
    report, why = parse_report(report_cm)
    if report is None:
        return AuditOutcome("Unknown", "ReportMissing", f"audit run {name} completed but {why}")
    if report.get("group") != group.name:
        return AuditOutcome(
            "Unknown",
            "ReportMissing",
            f"the report is for group {report.get('group')!r}, not {group.name!r}",
        )
    finished = _parse_time(report.get("finishedAt"))
    if submitted is not None and finished is not None and finished < submitted:
        return AuditOutcome(
            "Unknown", "ReportMissing", f"audit run {name} completed but left no new report"
        )
    return _verdict(report, name)


def _verdict(report: Obj, name: str) -> AuditOutcome:
    """Consistent and lastAudit from a usable report of run ``name``."""
    violations = int(report.get("violationsTotal") or 0)
    summary = str(report.get("summary") or "")
    last = {
        "time": str(report.get("finishedAt") or ""),
        "passed": bool(report["passed"]),
        "result": "Passed" if report["passed"] else "Failed",
        "summary": summary[:1000],
        "violationsTotal": violations,
        "application": name,
    }
    checked = report.get("checked")
    if isinstance(checked, dict):
        last["checkedEvents"] = int(checked.get("events") or 0)
        # The range as numbers, so tools need not parse the summary.
        for source, target in (("fromSeq", "fromSeq"), ("toSeq", "toSeq")):
            if isinstance(checked.get(source), int):
                last[target] = checked[source]
    if report["passed"]:
        return AuditOutcome("True", "AuditPassed", summary or "the last audit passed", last)
    return AuditOutcome(
        "False",
        "ViolationsFound",
        f"{violations} violation(s): {summary}" if summary else f"{violations} violation(s)",
        last,
    )
