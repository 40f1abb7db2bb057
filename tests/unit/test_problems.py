"""One problem type for the sidecar config and the operator spec, and how it reads."""

from __future__ import annotations

import pytest

from kdsync.config import ConfigError, ConfigProblem, parse_config
from kdsync.problems import Problem
from kdsync_operator import validation
from kdsync_operator.spec import SpecProblem


def test_the_config_and_the_spec_report_the_same_type() -> None:
    assert ConfigProblem is Problem
    assert SpecProblem is Problem
    with pytest.raises(ConfigError) as caught:
        parse_config({"group": "orders"}, check_files=False)
    assert caught.value.problems
    assert all(type(p) is Problem for p in caught.value.problems)


def test_a_problem_reads_as_one_line_for_status_and_admission_answers() -> None:
    problem = Problem("spec.topics.include[0]", "'[' is not a valid regular expression", "fix it")
    assert str(problem) == (
        "spec.topics.include[0]: '[' is not a valid regular expression (fix: fix it)"
    )


def test_a_config_error_lists_every_problem_with_its_fix_indented_below() -> None:
    error = ConfigError(
        [Problem("group", "required but missing", "add `group:`"), Problem("tls", "x", "y")],
        "member.yaml",
    )
    assert str(error) == (
        "member.yaml: 2 problems\n"
        "  group: required but missing\n"
        "    fix: add `group:`\n"
        "  tls: x\n"
        "    fix: y"
    )


def test_webhook_and_config_problems_are_interchangeable() -> None:
    """The operator answers with the sidecar's own config problems (re-pathed to the
    spec): both are the one type, so they read alike."""
    spec = {
        "members": [
            {"name": "a", "kafka": {"bootstrapServers": "k:1"}},
            {"name": "b", "kafka": {"bootstrapServers": "not a host"}},
        ],
        "topics": {"names": ["orders"]},
    }
    problems = validation.spec_problems("g", "ns", spec)
    assert [p.path for p in problems] == ["spec.members[1].kafka.bootstrapServers"]
    assert all(isinstance(p, Problem) for p in problems)
    assert all(str(p) == f"{p.path}: {p.problem} (fix: {p.fix})" for p in problems)
