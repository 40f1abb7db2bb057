"""What a config check reports: ``ConfigProblem`` (where, what, fix) and ``ConfigError``.

``ConfigProblem`` is ``kdsync.problems.Problem``, the type the operator reports its spec
problems with too.

Validators raise ``Invalid`` (one or more problems at paths relative to the field being
validated); ``kdsync.config.pydantic_errors`` turns those, and pydantic's own errors,
into ``ConfigProblem`` at full YAML paths written by ``format_path``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from kdsync.problems import Problem

Loc = tuple[str | int, ...]


# The sidecar config's problems are kdsync's one problem type, shared with the operator.
ConfigProblem = Problem


class ConfigError(Exception):
    """A config that cannot be used; ``str()`` lists every problem, one per paragraph."""

    def __init__(self, problems: Sequence[ConfigProblem], source: str = "config") -> None:
        self.problems = tuple(problems)
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        count = len(self.problems)
        noun = "problem" if count == 1 else "problems"
        lines = [f"{self.source}: {count} {noun}"]
        lines.extend(f"  {problem.paragraph()}" for problem in self.problems)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self._render()


class Invalid(ValueError):
    """Raised inside validators: one or more problems, at paths relative to the validator."""

    def __init__(self, *items: tuple[Loc, str, str]) -> None:
        self.items = items
        super().__init__("; ".join(f"{problem} ({fix})" for _, problem, fix in items))


def invalid(problem: str, fix: str, at: Loc = ()) -> Invalid:
    return Invalid((at, problem, fix))


def format_path(loc: Iterable[str | int]) -> str:
    """``("members", 1, "kafka", "bootstrapServers")`` -> ``members[1].kafka.bootstrapServers``."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", part):
            text += f".{part}" if text else part
        else:
            text += f'["{part}"]'
    return text or "(top level)"
