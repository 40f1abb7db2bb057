"""Smoke test for the test control plane (hack/fetch-k8s + tests/support/envtest.py).

Proves what the operator's integration tests rely on: a real kube-apiserver that accepts
our admin credentials, serves CustomResourceDefinitions with a status subresource and
enforces their CEL validation rules, plus a working helm binary.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from tests.support.envtest import LocalControlPlane, pinned_k8s_version

WIDGET_CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.kdsync.io
spec:
  group: example.kdsync.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
  versions:
    - name: v1alpha1
      served: true
      storage: true
      subresources: {status: {}}
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              required: [minReplicas, maxReplicas]
              properties:
                minReplicas: {type: integer, minimum: 0}
                maxReplicas: {type: integer, minimum: 0}
              x-kubernetes-validations:
                - rule: self.minReplicas <= self.maxReplicas
                  message: minReplicas must not exceed maxReplicas
            status:
              type: object
              properties:
                phase: {type: string}
"""


def widget(name: str, min_replicas: int, max_replicas: int) -> str:
    return json.dumps(
        {
            "apiVersion": "example.kdsync.io/v1alpha1",
            "kind": "Widget",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"minReplicas": min_replicas, "maxReplicas": max_replicas},
        }
    )


@pytest.fixture(scope="session")
def control_plane() -> Iterator[LocalControlPlane]:
    with LocalControlPlane() as cp:
        yield cp


def test_api_server_serves_the_pinned_version_to_the_admin(
    control_plane: LocalControlPlane,
) -> None:
    assert control_plane.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"

    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == pinned_k8s_version()
    assert version["clientVersion"]["gitVersion"] == pinned_k8s_version()

    whoami = json.loads(control_plane.kubectl("auth", "whoami", "-o", "json").stdout)
    assert whoami["status"]["userInfo"]["username"] == "kdsync-admin"
    assert "system:masters" in whoami["status"]["userInfo"]["groups"]


def test_crd_with_cel_rule_validates_objects(control_plane: LocalControlPlane) -> None:
    kubectl = control_plane.kubectl
    kubectl("apply", "-f", "-", input=WIDGET_CRD)
    kubectl(
        "wait",
        "--for=condition=Established",
        "crd/widgets.example.kdsync.io",
        "--timeout=60s",
    )

    kubectl("create", "-f", "-", input=widget("good", 1, 3))
    stored = json.loads(kubectl("get", "widget", "good", "-n", "default", "-o", "json").stdout)
    assert stored["spec"] == {"minReplicas": 1, "maxReplicas": 3}

    # The status subresource: status is written separately from spec.
    kubectl(
        "patch", "widget", "good", "-n", "default", "--subresource=status",
        "--type=merge", "-p", '{"status": {"phase": "Ready"}}',
    )  # fmt: skip
    stored = json.loads(kubectl("get", "widget", "good", "-n", "default", "-o", "json").stdout)
    assert stored["status"] == {"phase": "Ready"}

    rejected = kubectl("create", "-f", "-", input=widget("bad", 5, 2), check=False)
    assert rejected.returncode != 0
    assert "minReplicas must not exceed maxReplicas" in rejected.stderr
    missing = kubectl("get", "widget", "bad", "-n", "default", check=False)
    assert missing.returncode != 0
    assert "NotFound" in missing.stderr


def test_helm_runs_against_the_control_plane(control_plane: LocalControlPlane) -> None:
    short = control_plane.helm("version", "--short").stdout.strip()
    assert re.fullmatch(r"v3\.\d+\.\d+", short), short  # a release, not "v3.22-unreleased"

    releases = json.loads(control_plane.helm("list", "--all-namespaces", "-o", "json").stdout)
    assert releases == []
