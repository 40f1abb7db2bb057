"""The operator's calls to the Kubernetes API: one client per process, objects read,
server-side applied, deleted, listed by label, and status patched. The handlers and
``membership_io`` call these; the pure modules never do (``operator-thin-handlers``)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, cast

import kubernetes
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

FIELD_MANAGER = "kdsync-operator"

# Raised by every call below when the API server does not serve the kind at all (the
# spark-operator's CRDs are not installed): callers say what is missing.
KindNotServed = ResourceNotFoundError

_clients: dict[str, Any] = {}


def api_client() -> kubernetes.client.ApiClient:
    if "api" not in _clients:
        try:
            kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]
        _clients["api"] = kubernetes.client.ApiClient()
    return cast(kubernetes.client.ApiClient, _clients["api"])


def _dynamic() -> DynamicClient:
    if "dynamic" not in _clients:
        _clients["dynamic"] = DynamicClient(api_client())  # type: ignore[no-untyped-call]
    client: DynamicClient = _clients["dynamic"]
    return client


def _resource(api_version: str, kind: str) -> Any:
    return _dynamic().resources.get(api_version=api_version, kind=kind)


def get(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The object, or None when there is none of that name or the kind is not served."""
    try:
        obj = _resource(api_version, kind).get(name=name, namespace=namespace)
    except (NotFoundError, KindNotServed):
        return None
    result: dict[str, Any] = obj.to_dict()
    return result


def apply(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Server-side apply as the operator's field manager (taking over conflicting fields)."""
    resource = _resource(obj["apiVersion"], obj["kind"])
    applied = _dynamic().server_side_apply(  # type: ignore[no-untyped-call]
        resource, body=dict(obj), field_manager=FIELD_MANAGER, force_conflicts=True
    )
    result: dict[str, Any] = applied.to_dict()
    return result


def delete(api_version: str, kind: str, namespace: str, name: str) -> None:
    """Delete if there (gone already is fine)."""
    with contextlib.suppress(NotFoundError):
        _resource(api_version, kind).delete(name=name, namespace=namespace)


def list_labelled(
    api_version: str, kind: str, namespace: str, selector: str
) -> list[dict[str, Any]]:
    items = _resource(api_version, kind).get(namespace=namespace, label_selector=selector)
    found: list[dict[str, Any]] = items.to_dict().get("items", [])
    return found


def patch_status(
    api_version: str, kind: str, namespace: str, name: str, status: Mapping[str, Any]
) -> None:
    """A merge patch of ``/status`` (a null deletes that key)."""
    _resource(api_version, kind).status.patch(
        name=name,
        namespace=namespace,
        body={"status": dict(status)},
        content_type="application/merge-patch+json",
    )
