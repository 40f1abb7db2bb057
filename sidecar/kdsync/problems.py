"""A problem found in what a user wrote: where, what is wrong, and how to fix it.

One type for every check at kdsync's edges: the sidecar's YAML config
(``kdsync.config``, where ``path`` reads like ``members[1].kafka.bootstrapServers``)
and the operator's ``KdsyncGroup`` spec (``kdsync_operator``, where it reads like
``spec.topics.include[0]``). It imports nothing, so the operator can use it without
loading any of the sidecar.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong: where (a path into the document), what, and how to fix it."""

    path: str
    problem: str
    fix: str

    def __str__(self) -> str:
        """One line, for status conditions, admission answers and log lines."""
        return f"{self.path}: {self.problem} (fix: {self.fix})"

    def paragraph(self) -> str:
        """Two lines, the fix indented under the problem, for a list of several."""
        return f"{self.path}: {self.problem}\n    fix: {self.fix}"
