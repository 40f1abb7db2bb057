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
