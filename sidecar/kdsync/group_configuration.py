"""The group's configuration as its members report it in ``/status``: which is newest,
who leads, and a readable line. Pure: the CLI, the backfill and the operator read the
same documents (the operator over its admin connection)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def describe_configuration(config: Mapping[str, Any]) -> str:
    """``m1, m2, w (witness) (index 9, committed)`` from a /status configuration."""
    witnesses = set(config.get("witnesses", []))
    parts = [f"{m} (witness)" if m in witnesses else m for m in config.get("voters", [])]
    parts += [f"{m} (learner)" for m in config.get("learners", [])]
    state = "committed" if config.get("committed") else "not yet committed"
    return f"{', '.join(parts)} (index {config.get('index', 0)}, {state})"


def reported_configurations(statuses: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The configuration each member reports in its /status (members of older releases
    report none)."""
    return [s["configuration"] for s in statuses if "configuration" in s]


def newest_configuration(statuses: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest configuration the members report (a leader's is never older)."""
    configs = reported_configurations(statuses)
    if not configs:
        return None
    return max(configs, key=lambda c: (c.get("index", 0), bool(c.get("committed"))))


def leader_of(statuses: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The member that reports itself leader in the highest term, if any."""
    leaders = [
        (s.get("term", 0), name) for name, s in statuses.items() if s.get("role") == "leader"
    ]
    return max(leaders)[1] if leaders else None
