"""The admission webhook's checks: what the CRD's schema and CEL rules cannot express.

Pure: no kopf, no Kubernetes client. ``spec_problems`` returns problems naming the field
and the fix; the kopf handler joins them into the admission response.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from kdsync_operator.children import config_problems
from kdsync_operator.spec import Group, KdsyncGroupSpec, SpecProblem


def _loc(loc: tuple[str | int, ...]) -> str:
    text = "spec"
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{to_camel(str(part))}"
    return text


def _regex_problems(field: str, patterns: object) -> list[SpecProblem]:
    problems: list[SpecProblem] = []
    if not isinstance(patterns, list):
        return problems
    for index, pattern in enumerate(patterns):
        if not isinstance(pattern, str):
            continue
        try:
            re.compile(pattern)
        except re.error as exc:
            problems.append(
                SpecProblem(
                    f"spec.topics.{field}[{index}]",
                    f"{pattern!r} is not a valid regular expression ({exc})",
                    "write a Python regular expression matching whole topic names, e.g. "
                    "'orders\\..*' (escape dots and brackets)",
                )
            )
    return problems


def spec_problems(name: str, namespace: str, spec: Mapping[str, Any]) -> list[SpecProblem]:
    """Everything wrong with a KdsyncGroup spec that the CRD's schema and CEL let through.

    Runs the operator's own model, then renders every member's sidecar config and checks
    it with the sidecar's validator (``kdsync.config.parse_config``), so an object the API
    server accepts is one the sidecars will start with.
    """
    problems: list[SpecProblem] = []
    raw_topics = spec.get("topics")
    topics: Mapping[str, Any] = raw_topics if isinstance(raw_topics, Mapping) else {}
    problems += _regex_problems("include", topics.get("include"))
    problems += _regex_problems("exclude", topics.get("exclude"))
    try:
        parsed = KdsyncGroupSpec.model_validate(dict(spec))
    except ValidationError as exc:
        for error in exc.errors():
            problems.append(
                SpecProblem(_loc(tuple(error["loc"])), error["msg"], "see docs/crd-reference.md")
            )
        return problems
    if problems:
        return problems
    group = Group(name=name, namespace=namespace, uid="", generation=0, spec=parsed)
    problems += config_problems(group)
    return problems


def _member_roles(spec: Mapping[str, Any]) -> dict[str, bool]:
    """name -> witness, as written (the CRD's schema has already checked the shape)."""
    roles: dict[str, bool] = {}
    members = spec.get("members")
    for item in members if isinstance(members, list) else []:
        if isinstance(item, Mapping) and isinstance(item.get("name"), str):
            roles[item["name"]] = bool(item.get("witness", False))
    return roles


def membership_change_problems(
    old_spec: Mapping[str, Any], new_spec: Mapping[str, Any]
) -> list[SpecProblem]:
    """An update that adds or removes members, or turns one into a witness or back.

    Membership is static for the operator: the core changes its voters one at a time
    and ``kdsync members remove|add`` drive that for sidecars run by hand, but the operator
    does not yet (issue #17), and restarting members onto a new list while others still
    run the old one could let two majorities order at once. Reordering ``members`` or
    changing a member's Kafka settings or address is not a membership change."""
    old, new = _member_roles(old_spec), _member_roles(new_spec)
    if old == new:
        return []
    changes = [f"adds {m}" for m in new if m not in old]
    changes += [f"removes {m}" for m in old if m not in new]
    changes += [
        f"makes {m} a {'witness' if new[m] else 'data member'}"
        for m in new
        if m in old and old[m] != new[m]
    ]
    return [
        SpecProblem(
            "spec.members",
            f"this update {', '.join(changes)}: a running group cannot change its members "
            "(the operator does not change a running group's membership yet)",
            "change members with the group stopped: delete the KdsyncGroup (its topics, "
            "ledger and consumer groups stay in Kafka), then apply it with the new member "
            "list (docs/operations.md, Failover)",
        )
    ]
