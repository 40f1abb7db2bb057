"""The KdsyncGroup CRD file: well-formed, and the chart's copy identical to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kdsync.config.sections import OrderingConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD = REPO_ROOT / "crds" / "kdsync.io_kdsyncgroups.yaml"
CHART_CRD = REPO_ROOT / "charts" / "kdsync-operator" / "crds" / CRD.name


def schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    result: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return result


def test_chart_ships_an_identical_copy() -> None:
    # Helm installs CRDs only from the chart's crds/ folder; refresh the copy with
    # hack/operator-sync-crds after editing crds/.
    assert CHART_CRD.read_bytes() == CRD.read_bytes(), "run hack/operator-sync-crds"


def test_nothing_is_null_and_every_property_is_typed() -> None:
    nulls: list[str] = []

    def find_nulls(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if value is None:
                    nulls.append(f"{path}.{key} (a YAML flow-mapping comma?)")
                find_nulls(value, f"{path}.{key}")
        elif isinstance(node, list):
            for index, item in enumerate(node):
                find_nulls(item, f"{path}[{index}]")

    find_nulls(yaml.safe_load(CRD.read_text()), "")
    assert not nulls, nulls

    untyped: list[str] = []

    def check(node: dict[str, Any], path: str) -> None:
        if "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            untyped.append(path)
        for key, child in node.get("properties", {}).items():
            check(child, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            check(node["items"], f"{path}[]")

    check(schema(), "")
    assert not untyped, untyped


def test_printer_columns_and_status_subresource() -> None:
    version = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names == ["Ready", "Members", "Delivered", "Last Audit", "Age"]
    spec = schema()["properties"]["spec"]["properties"]
    assert spec["deletionPolicy"]["enum"] == ["Retain"]
    rules = str(schema())
    for text in ("exists_one", "witness owns no Kafka", "resourceName", "networkAttachment"):
        assert text in rules


def test_every_ordering_field_is_one_the_sidecar_accepts_with_the_same_bounds() -> None:
    """spec.ordering is passed through to each sidecar's ``ordering`` section: a field
    the sidecar does not know would stop every member at start-up, and a looser bound
    in the CRD would let an edit through that the sidecars then refuse."""
    ordering = schema()["properties"]["spec"]["properties"]["ordering"]["properties"]
    fields = {info.alias or name: info for name, info in OrderingConfig.model_fields.items()}
    for name, prop in ordering.items():
        assert name in fields, f"spec.ordering.{name} is not a sidecar ordering field"
        bounds = {type(m).__name__: m for m in fields[name].metadata}
        if "Ge" in bounds:
            assert prop.get("minimum") == bounds["Ge"].ge, name
        if "Le" in bounds:
            assert prop.get("maximum") == bounds["Le"].le, name
