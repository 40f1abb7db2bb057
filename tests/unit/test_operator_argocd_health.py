"""The Argo CD health check (deploy/argocd/kdsyncgroup-health.lua) run by a real Lua
interpreter (lupa) on sample KdsyncGroup objects, the way Argo CD runs it: the object in
the global ``obj``, the script returning ``{status=..., message=...}``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from lupa import LuaRuntime

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "deploy" / "argocd" / "kdsyncgroup-health.lua"
CM = REPO_ROOT / "deploy" / "argocd" / "argocd-cm-health.yaml"


def health(obj: dict[str, Any]) -> tuple[str, str]:
    lua = LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(SCRIPT.read_text())
    return str(result["status"]), str(result["message"])


def cond(kind: str, status: str, reason: str = "R", message: str = "m") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "observedGeneration": 2}  # fmt: skip


def group(*conditions: dict[str, Any], observed: int = 2) -> dict[str, Any]:
    return {
        "metadata": {"name": "orders", "generation": 2},
        "status": {"observedGeneration": observed, "conditions": list(conditions)},
    }


HEALTHY = [
    cond("Ready", "True", "AllMembersReady", "3/3 members ready"),
    cond("Progressing", "False"), cond("Degraded", "False"), cond("Consistent", "True"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "expected", "in_message"),
    [
        ({"metadata": {"generation": 1}}, "Progressing", "Waiting for the kdsync operator"),
        (group(*HEALTHY, observed=1), "Progressing", "generation 2"),
        (group(*HEALTHY), "Healthy", "3/3 members ready"),
        (
            group(
                cond("Ready", "True"),
                cond("Degraded", "False"),
                cond("Consistent", "Unknown", "NoAuditYet"),
            ),
            "Healthy",
            "",
        ),
        (
            group(
                cond("Ready", "False"),
                cond("Progressing", "True", "RollingUpdate", "updating a"),
                cond("Degraded", "False"),
            ),
            "Progressing",
            "RollingUpdate: updating a",
        ),
        (
            group(
                cond("Ready", "False"),
                cond("Progressing", "True"),
                cond("Degraded", "True", "MajorityLost", "only 1 of 3"),
            ),
            "Degraded",
            "MajorityLost: only 1 of 3",
        ),
        (
            group(
                cond("Ready", "True"),
                cond("Degraded", "False"),
                cond("Consistent", "False", "ViolationsFound", "2 violation(s)"),
            ),
            "Degraded",
            "ViolationsFound",
        ),
        (
            group(cond("Ready", "False", "MembersNotReady", "1/2"), cond("Progressing", "False")),
            "Degraded",
            "MembersNotReady",
        ),
    ],
)
def test_health(obj: dict[str, Any], expected: str, in_message: str) -> None:
    status, message = health(obj)
    assert status == expected, message
    assert in_message in message


def test_argocd_cm_snippet_embeds_the_script_verbatim() -> None:
    cm = yaml.safe_load(CM.read_text())
    embedded = cm["data"]["resource.customizations.health.kdsync.io_KdsyncGroup"]
    assert embedded.strip() == SCRIPT.read_text().strip()
