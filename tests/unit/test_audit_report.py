"""The audit report: the JSON contract the operator reads, and the one-line summary."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from kdsync.audit.report import VIOLATION_KINDS, Checked, Violation, build_report

START = datetime(2026, 11, 22, 5, 0, 0, tzinfo=UTC)
END = datetime(2026, 11, 22, 5, 1, 2, 345000, tzinfo=UTC)


def test_a_clean_report_has_exactly_the_contract_keys() -> None:
    report = build_report(
        group="orders",
        checked=Checked(from_seq=0, to_seq=9, events=10),
        counts={},
        lag={"us": 0, "eu": 2},
        violations=[],
        members=2,
        started_at=START,
        finished_at=END,
    )
    data = json.loads(report.to_json())
    assert list(data) == [
        "version",
        "group",
        "passed",
        "checked",
        "counts",
        "lag",
        "violationsTotal",
        "violations",
        "summary",
        "startedAt",
        "finishedAt",
        "membership",  # added in version 1: which members were checked (docs/audit.md)
    ]
    assert data["membership"] is None  # built without one: no membership was planned
    assert data["version"] == 1 and data["passed"] is True
    assert data["checked"] == {"fromSeq": 0, "toSeq": 9, "events": 10}
    assert set(VIOLATION_KINDS) <= set(data["counts"])
    assert {"duplicate", "gap", "disagreement", "order", "missing", "fidelity", "foreign"} == set(
        VIOLATION_KINDS
    )
    assert data["startedAt"] == "2026-11-22T05:00:00.000Z"
    assert data["finishedAt"] == "2026-11-22T05:01:02.345Z"
    assert data["summary"] == (
        "PASS group orders: seqs 0..9 (10 events) consistent across 2 member(s); lag: eu 2 behind"
    )


def test_violations_fail_the_report_and_totals_count_beyond_the_cap() -> None:
    shown = [Violation(kind="gap", seq=4, member="eu", detail="t: seq 4 missing")]
    report = build_report(
        group="orders",
        checked=Checked(from_seq=0, to_seq=9, events=10),
        counts={"gap": 3, "fidelity": 2, "unverified": 5},
        lag={"us": 0, "eu": 0},
        violations=shown,
        members=2,
        started_at=START,
        finished_at=END,
    )
    assert report.passed is False
    assert report.violations_total == 5  # unverified is counted, but is not a violation
    assert report.counts["unverified"] == 5
    assert (
        report.summary
        == "FAIL group orders: 5 violation(s) (3 gap, 2 fidelity) in seqs 0..9 (10 events)"
    )
    data = json.loads(report.to_json())
    assert data["violations"] == [
        {"kind": "gap", "seq": 4, "member": "eu", "detail": "t: seq 4 missing"}
    ]


def test_an_empty_incremental_range_says_so() -> None:
    report = build_report(
        group="g",
        checked=Checked(from_seq=12, to_seq=11, events=0),
        counts={},
        lag={},
        violations=[],
        members=3,
        started_at=START,
        finished_at=END,
    )
    assert (
        report.summary == "PASS group g: no new events after seq 11 consistent across 3 member(s)"
    )
