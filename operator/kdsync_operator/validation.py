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


def _in_progress(old_status: Mapping[str, Any] | None) -> dict[str, str]:
    """The membership change the operator reports under way: {"joining"|"leaving": name}."""
    progress = (old_status or {}).get("membership") or {}
    return {k: v for k, v in progress.items() if k in ("joining", "leaving") and v}


def _busy(old_status: Mapping[str, Any] | None, old_generation: int | None) -> str | None:
    """Why the operator may not take a membership change now, judged from the object as
    it was: it has not acted on the last edit yet, or members are rolling onto a config."""
    if old_status is None or old_generation is None:
        return None
    if old_status.get("observedGeneration") != old_generation:
        return "the operator has not acted on the last edit yet"
    outdated = (old_status.get("rollout") or {}).get("outdated") or []
    if outdated:
        return f"members are rolling onto a new config ({', '.join(map(str, outdated))})"
    return None


def _not_ready(old_status: Mapping[str, Any] | None) -> set[str]:
    members = (old_status or {}).get("members") or []
    return {
        str(m.get("name")) for m in members if isinstance(m, Mapping) and m.get("ready") is False
    }


def membership_change_problems(
    old_spec: Mapping[str, Any],
    new_spec: Mapping[str, Any],
    old_status: Mapping[str, Any] | None = None,
    old_generation: int | None = None,
) -> list[SpecProblem]:
    """An update that adds or removes members, or turns one into a witness or back.

    The operator changes a running group's members one at a time (membership.py): the
    core commits one configuration change at a time, and a quorum of the old and the new
    configuration overlap only then. So an update may add or remove one member, and only
    while no other change is under way; removing the member being added (or adding back the member
    being removed) backs that change
    out. Reordering ``members`` or changing a member's Kafka settings or address is not a
    membership change."""
    old, new = _member_roles(old_spec), _member_roles(new_spec)
    if old == new:
        return []
    added = [m for m in new if m not in old]
    removed = [m for m in old if m not in new]
    switched = [m for m in new if m in old and old[m] != new[m]]
    problems: list[SpecProblem] = []
    for member in switched:
        problems.append(
            SpecProblem(
                f"spec.members[{member}]",
                f"this update makes {member} a {'witness' if new[member] else 'data member'}: "
                "a member cannot change its kind (a witness keeps no T-global, a data member "
                "counts on its own)",
                f"remove {member} in one update, then add a member of the other kind under "
                "a new name in another",
            )
        )
    progress = _in_progress(old_status)
    # Backing a change out: the member being added removed again, or the witness being
    # removed added back (a data member removed joins again only afresh, with a backfill,
    # once its StatefulSet is gone).
    leaving = progress.get("leaving")
    backs_out = (removed == [progress.get("joining")] and not added) or (
        added == [leaving] and not removed and bool(new.get(leaving or ""))
    )
    busy = _busy(old_status, old_generation)
    if busy is not None and removed and not added and set(removed) <= _not_ready(old_status):
        busy = None  # a member that holds a roll back may go: it is how a roll gets unstuck
    if progress and not backs_out:
        under_way = ", ".join(f"{k} {v}" for k, v in sorted(progress.items()))
        problems.append(
            SpecProblem(
                "spec.members",
                f"a membership change is under way ({under_way}): the group changes one "
                "member at a time",
                "wait until the Joining and Leaving conditions are False, then apply this "
                "change (removing the member being added, or adding back the member being "
                "removed, backs that change out)",
            )
        )
    elif busy is not None and not backs_out:
        problems.append(
            SpecProblem(
                "spec.members",
                f"{busy}: the group changes its members one at a time",
                "wait until the Progressing, Joining and Leaving conditions are False, then "
                "apply this change",
            )
        )
    elif len(added) + len(removed) > 1:
        changes = [f"adds {m}" for m in added] + [f"removes {m}" for m in removed]
        problems.append(
            SpecProblem(
                "spec.members",
                f"this update {', '.join(changes)}: a running group changes one member at a "
                "time (with two at once, a majority of the old members and one of the new "
                "could decide apart)",
                "apply one change, wait until the Joining and Leaving conditions are False, "
                "then apply the next",
            )
        )
    remaining_data = [m for m, witness in new.items() if not witness]
    if removed and not remaining_data:
        problems.append(
            SpecProblem(
                "spec.members",
                "this update removes the last data member: a group needs one to order into",
                "keep at least one data member",
            )
        )
    return problems
