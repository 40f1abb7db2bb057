"""Least privilege, judged by the real API server rather than by reading YAML.

- The operator's account (the chart's ClusterRole, bound for real): what it must be able to
  do, and, just as asserted, what it must not (touch nodes, grant itself more, create or
  delete users' groups, exec into pods, impersonate).
- A group's audit (Spark driver) account: only its own namespace, only what a Spark driver
  needs, and never the Secrets that hold the group's keys and Kafka credentials. The
  operator grants it by binding the chart's audit-driver ClusterRole, which it may bind
  and nothing else: it holds no pod rights of its own to hand out.
- Pods: the sidecar's and the operator's pod templates are admitted by Pod Security
  Admission at the "restricted" level (non-root, no privilege escalation, every capability
  dropped, RuntimeDefault seccomp), except that an RDMA sidecar adds IPC_LOCK, which only
  the "privileged" level admits: that is documented in docs/operations.md.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from kdsync_operator import audit, children, desired, pki
from kdsync_operator.spec import Group
from tests.integration.operator.conftest import (
    AUDIT_DRIVER_ROLE,
    OPERATOR_ROLE,
    RELEASE_NS,
    Kube,
    documents,
    render,
)

OPERATOR = f"system:serviceaccount:{RELEASE_NS}:{OPERATOR_ROLE}"


def _group(namespace: str, name: str, **spec: Any) -> Group:
    return Group.from_object(
        {
            "metadata": {"name": name, "namespace": namespace, "uid": "u", "generation": 1},
            "spec": {
                "members": [
                    {"name": "a", "kafka": {"bootstrapServers": "k:1"}},
                    {"name": "b", "kafka": {"bootstrapServers": "k:2"}},
                ],
                "topics": {"names": ["t"]},
                "checks": {"enabled": True},
                **spec,
            },
        }
    )


def _can(kube: Kube, user: str, verb: str, resource: str, namespace: str | None) -> bool:
    """``resource`` is kubectl's ``kind[/name]``, with ``:sub`` for a subresource (kubectl
    would read ``pods/exec`` as the pod named exec)."""
    scope = ["-n", namespace] if namespace else ["--all-namespaces"]
    resource, _, subresource = resource.partition(":")
    if subresource:
        scope.append(f"--subresource={subresource}")
    result = kube.run("auth", "can-i", verb, resource, f"--as={user}", *scope, check=False)
    answer: str = result.stdout.strip()
    assert answer in ("yes", "no"), result.stderr  # anything else is a broken question
    return answer == "yes"


@pytest.fixture(scope="module")
def operator_rbac(kube: Kube) -> None:
    if kube.get("namespace", RELEASE_NS, "default") is None:
        kube.run("create", "namespace", RELEASE_NS, check=False)
    rbac = [
        d
        for d in documents(render(kube.cp).stdout)
        if d["kind"] in ("ClusterRole", "ClusterRoleBinding", "ServiceAccount")
    ]
    kube.run("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in rbac))


# What the operator creates and updates in any namespace a group lives in.
OPERATOR_MAY = [
    ("patch", "kdsyncgroups.kdsync.io"),
    ("patch", "kdsyncgroups.kdsync.io:status"),
    ("create", "statefulsets.apps"),
    ("create", "secrets"),
    ("create", "roles.rbac.authorization.k8s.io"),
    ("create", "rolebindings.rbac.authorization.k8s.io"),
    ("bind", f"clusterroles.rbac.authorization.k8s.io/{AUDIT_DRIVER_ROLE}"),
    ("create", "services"),
    ("update", "configmaps"),
    ("create", "sparkapplications.sparkoperator.k8s.io"),
    ("create", "events"),
]

# What it must never be able to do, anywhere.
OPERATOR_MUST_NOT = [
    ("create", "kdsyncgroups.kdsync.io"),  # groups are the user's (GitOps) objects
    ("delete", "kdsyncgroups.kdsync.io"),
    ("update", "customresourcedefinitions.apiextensions.k8s.io"),
    ("delete", "nodes"),
    ("delete", "namespaces"),
    ("create", "clusterroles.rbac.authorization.k8s.io"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("escalate", "roles.rbac.authorization.k8s.io"),
    ("bind", "clusterroles.rbac.authorization.k8s.io"),  # any but the audit driver's
    ("bind", "clusterroles.rbac.authorization.k8s.io/cluster-admin"),
    ("bind", "clusterroles.rbac.authorization.k8s.io/admin"),
    # Pods are the Spark driver's business, granted through the binding above.
    ("create", "pods"),
    ("delete", "pods"),
    ("create", "persistentvolumeclaims"),
    ("create", "pods:exec"),
    ("impersonate", "serviceaccounts"),
    ("create", "deployments.apps"),
    ("patch", "validatingwebhookconfigurations.admissionregistration.k8s.io"),
]


@pytest.mark.usefixtures("operator_rbac")
def test_the_operator_may_do_its_work_and_nothing_beyond_it(kube: Kube) -> None:
    ns = kube.namespace()
    refused = [(v, r) for v, r in OPERATOR_MAY if not _can(kube, OPERATOR, v, r, ns)]
    assert not refused, f"the operator's ClusterRole lacks {refused}"
    allowed = [(v, r) for v, r in OPERATOR_MUST_NOT if _can(kube, OPERATOR, v, r, None)]
    assert not allowed, f"the operator's ClusterRole grants more than it needs: {allowed}"


@pytest.mark.usefixtures("operator_rbac")
def test_the_audit_driver_account_runs_executors_in_its_namespace_and_reads_no_secret(
    kube: Kube,
) -> None:
    ns, elsewhere = kube.namespace(), kube.namespace()
    group = _group(ns, "lp")
    as_operator = f"--as={OPERATOR}"
    for obj in audit.rbac_objects(group, AUDIT_DRIVER_ROLE):
        obj["metadata"].pop("ownerReferences", None)  # the owner does not exist here
        # Created as the operator: RBAC refuses a Role granting more than its creator holds
        # and a binding of a ClusterRole it may not bind.
        kube.run("create", as_operator, "-f", "-", input=json.dumps(obj))
    # The same binding of any other ClusterRole is refused: the operator cannot hand
    # out cluster-admin, or a role with rights it lacks, to an account it made. (Not the
    # aggregated admin/edit roles: this API server has no controller filling them in.)
    kube.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "lp-exec"},
            "rules": [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}],
        }
    )
    for role in ("cluster-admin", "lp-exec"):
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"lp-audit-{role}", "namespace": ns},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [
                {
                    "kind": "ServiceAccount",
                    "name": audit.audit_service_account(group),
                    "namespace": ns,
                }
            ],
        }
        refused = kube.run("create", as_operator, "-f", "-", input=json.dumps(binding), check=False)
        assert refused.returncode != 0 and "forbidden" in refused.stderr, (role, refused.stderr)
    driver = f"system:serviceaccount:{ns}:{audit.audit_service_account(group)}"
    report = children.audit_report_configmap(group.name)
    for verb, resource in [
        ("create", "pods"),
        ("delete", "pods"),
        ("create", "services"),
        ("create", "configmaps"),
        ("update", f"configmaps/{report}"),
    ]:
        assert _can(kube, driver, verb, resource, ns), (verb, resource)
    for verb, resource, where in [
        ("get", "secrets", ns),  # the group's peer keys, configs and Kafka credentials
        ("list", "secrets", ns),
        ("update", "configmaps/other", ns),  # only its report is overwritten
        ("patch", "statefulsets.apps", ns),
        ("patch", "kdsyncgroups.kdsync.io", ns),
        ("create", "pods:exec", ns),
        ("create", "roles.rbac.authorization.k8s.io", ns),
        ("create", "pods", elsewhere),
        ("get", "configmaps", elsewhere),
    ]:
        assert not _can(kube, driver, verb, resource, where), (verb, resource, where)


def _as_pod(template: dict[str, Any], name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": template["spec"],
    }


def _restricted_namespace(kube: Kube) -> str:
    ns = kube.namespace()
    kube.run("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    return ns


def test_sidecar_and_operator_pods_pass_the_restricted_pod_security_standard(kube: Kube) -> None:
    ns = _restricted_namespace(kube)
    group = _group(ns, "psa")
    bundle = desired.build_children(group, pki.desired_pki_secrets(group, {}), {})
    sets = [o for objs in bundle.members.values() for o in objs if o["kind"] == "StatefulSet"]
    assert sets, "no sidecar StatefulSet rendered"
    operator_deployment = next(
        d for d in documents(render(kube.cp).stdout) if d["kind"] == "Deployment"
    )
    pods = [_as_pod(s["spec"]["template"], f"sidecar-{i}", ns) for i, s in enumerate(sets)]
    pods.append(_as_pod(operator_deployment["spec"]["template"], "operator", ns))
    for pod in pods:
        result = kube.run(
            "create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
        )
        assert result.returncode == 0, (pod["metadata"]["name"], result.stderr)


def test_an_rdma_sidecar_adds_only_ipc_lock_which_restricted_refuses(kube: Kube) -> None:
    ns = _restricted_namespace(kube)
    group = _group(
        ns,
        "rdma",
        transport={
            "type": "rdma",
            "rdma": {"networkAttachment": "rdma-net", "resourceName": "rdma/hca"},
        },
    )
    bundle = desired.build_children(group, pki.desired_pki_secrets(group, {}), {})
    statefulset = next(
        o for objs in bundle.members.values() for o in objs if o["kind"] == "StatefulSet"
    )
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    pod = _as_pod(statefulset["spec"]["template"], "rdma-sidecar", ns)
    result = kube.run("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert result.returncode != 0 and "IPC_LOCK" in result.stderr, result.stderr
