"""The Helm chart: lint, template against values.schema.json, and the rendered manifests
applied to the real API server with a server-side dry run.

Also checks least privilege the way the API server does: with the chart's ClusterRole
bound (for real) to the operator's ServiceAccount, acting as that ServiceAccount may
create every kind of child the operator makes, including a group's audit Role (RBAC
refuses to let anyone grant permissions they do not hold).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kdsync_operator import desired, pki
from kdsync_operator.spec import Group
from tests.integration.operator.conftest import (
    AUDIT_DRIVER_ROLE,
    CHART,
    OPERATOR_ROLE,
    RELEASE_NS,
    Kube,
    documents,
    render,
)
from tests.support.envtest import LocalControlPlane


def test_helm_lint_passes(control_plane: LocalControlPlane) -> None:
    result = control_plane.helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in result.stdout


def test_values_schema_rejects_bad_values(control_plane: LocalControlPlane) -> None:
    for bad in ("webhook.failurePolicy=Maybe", "resyncSeconds=0", "unknownKey=1"):
        result = render(control_plane, bad, check=False)
        assert result.returncode != 0, bad
        assert "schema" in result.stderr.lower(), result.stderr


def test_template_renders_every_optional_part(control_plane: LocalControlPlane) -> None:
    docs = documents(
        render(
            control_plane, "metrics.serviceMonitor.enabled=true", "grafanaDashboard.enabled=true"
        ).stdout
    )
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("ServiceMonitor", "kd-kdsync-operator-sidecars") in kinds
    dashboard = next(d for d in docs if d["kind"] == "ConfigMap")
    assert json.loads(dashboard["data"]["kdsync.json"])["uid"] == "kdsync-overview"
    webhook = next(d for d in docs if d["kind"] == "ValidatingWebhookConfiguration")
    client = webhook["webhooks"][0]["clientConfig"]
    assert client["service"]["path"] == "/validate-kdsyncgroup"  # the kopf handler id
    assert client["caBundle"]
    plain = {d["kind"] for d in documents(render(control_plane).stdout)}
    assert "ServiceMonitor" not in plain and "ConfigMap" not in plain


def test_chart_crds_are_the_repository_crds(control_plane: LocalControlPlane) -> None:
    text = render(control_plane, "webhook.enabled=false").stdout
    assert "CustomResourceDefinition" not in text  # crds/ are not templates
    with_crds = control_plane.helm(
        "template", "kd", str(CHART), "--namespace", RELEASE_NS, "--include-crds"
    ).stdout
    crds = [d for d in documents(with_crds) if d["kind"] == "CustomResourceDefinition"]
    repo = yaml.safe_load((CHART.parents[1] / "crds" / "kdsync.io_kdsyncgroups.yaml").read_text())
    assert crds == [repo]


def test_rendered_manifests_pass_a_server_side_dry_run(kube: Kube) -> None:
    cp = kube.cp
    if kube.get("namespace", RELEASE_NS, "default") is None:
        cp.kubectl("create", "namespace", RELEASE_NS, check=False)
    text = render(cp, "grafanaDashboard.enabled=true").stdout
    result = cp.kubectl("apply", "--dry-run=server", "-f", "-", input=text)
    for kind in ("deployment.apps", "clusterrole", "validatingwebhookconfiguration", "secret"):
        assert kind in result.stdout, result.stdout


def test_operator_role_covers_everything_the_operator_creates(kube: Kube) -> None:
    cp = kube.cp
    if kube.get("namespace", RELEASE_NS, "default") is None:
        cp.kubectl("create", "namespace", RELEASE_NS, check=False)
    docs = documents(render(cp).stdout)
    rbac = [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding", "ServiceAccount")]
    cp.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in rbac))
    ns = kube.namespace()
    group = Group.from_object(
        {
            "metadata": {"name": "rbac", "namespace": ns, "uid": "u", "generation": 1},
            "spec": {
                "members": [
                    {"name": "a", "kafka": {"bootstrapServers": "k:1"}},
                    {"name": "b", "kafka": {"bootstrapServers": "k:2"}},
                ],
                "topics": {"names": ["t"]},
                "checks": {"enabled": True},
            },
        }
    )
    bundle = desired.build_children(
        group, pki.desired_pki_secrets(group, {}), {}, AUDIT_DRIVER_ROLE
    )
    objects = bundle.shared + [o for objs in bundle.members.values() for o in objs] + bundle.audit
    for obj in objects:
        obj["metadata"].pop("ownerReferences")  # the owner does not exist here
    as_operator = f"--as=system:serviceaccount:{RELEASE_NS}:{OPERATOR_ROLE}"
    # Roles and bindings for real (RBAC's escalation check is what matters), the rest dry-run.
    for obj in objects:
        dry = [] if obj["kind"] in ("Role", "RoleBinding") else ["--dry-run=server"]
        result = cp.kubectl(
            "create", *dry, as_operator, "-f", "-", input=json.dumps(obj), check=False
        )
        assert result.returncode == 0, (obj["kind"], result.stderr)
    denied = cp.kubectl("auth", "can-i", "delete", "nodes", as_operator, check=False)
    assert denied.stdout.strip() == "no"


@pytest.mark.parametrize("path", sorted((CHART.parents[1] / "examples").glob("*.yaml")))
def test_examples_are_accepted_by_the_api_server(kube: Kube, path: Path) -> None:
    result = kube.cp.kubectl("apply", "--dry-run=server", "-f", str(path), check=False)
    assert result.returncode == 0, result.stderr
