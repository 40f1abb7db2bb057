"""The campaign's bookkeeping: figures per kind, telling a deliberate stop from a crash, and
the Spark audit's verdict."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from kdsync.audit import command as audit_command
from kdsync.chaos.campaign import (
    Campaign,
    CampaignReport,
    CampaignSettings,
    FaultOutcome,
    stop_reason,
)
from kdsync.local_group import LocalSidecarGroup


def outcome(kind: str, recovery: float | None, rss: float) -> FaultOutcome:
    return FaultOutcome(f"#0 {kind}", kind, ["m1"], 3.0, 1.0, 10, recovery, {"m1": rss})


def test_recovery_and_memory_figures_per_kind() -> None:
    report = CampaignReport(1, [])
    report.outcomes = [
        outcome("kill-sidecar", 2.0, 80.0),
        outcome("kill-sidecar", 4.0, 95.5),
        outcome("one-way", None, 70.0),  # not recovered: no recovery figure
    ]
    assert report.recovery_figures == {"kill-sidecar": {"max": 4.0, "mean": 3.0, "n": 2}}
    assert report.peak_rss_mib == {"kill-sidecar": 95.5, "one-way": 70.0}
    assert report.to_json()["ok"] is True
    report.violations.append("something")
    assert report.to_json()["ok"] is False
    assert "VIOLATION: something" in report.summary()


def test_a_deliberate_stop_is_told_from_a_crash(tmp_path: Path) -> None:
    stopped = tmp_path / "stopped.log"
    stopped.write_text(
        "INFO all fine\n"
        "ERROR [m3] kdsync.runtime.sidecar: sidecar stopping: could not store the ordering log\n"
    )
    assert stop_reason(stopped) == "could not store the ordering log"
    crashed = tmp_path / "crashed.log"
    crashed.write_text("INFO all fine\nTraceback (most recent call last):\n  boom\n")
    assert stop_reason(crashed) is None
    assert stop_reason(tmp_path / "missing.log") is None


def test_only_the_last_run_of_an_appended_log_counts(tmp_path: Path) -> None:
    log = tmp_path / "m3.log"
    noise = "INFO [m3] kdsync.librdkafka: FAIL ... connection refused\n" * 500
    first_run = (
        "INFO [m3] kdsync.runtime.sidecar: member m3 of group g running (data member)\n"
        "ERROR [m3] kdsync.runtime.sidecar: sidecar stopping: broker away\n"
    )
    log.write_text(first_run + noise)
    assert stop_reason(log) == "broker away"  # however much noise follows the stop line
    log.write_text(first_run + noise + first_run.splitlines()[0] + "\n" + noise)
    assert stop_reason(log) is None  # the second run logged no stop of its own


def _campaign_after_its_run(tmp_path: Path) -> Campaign:
    campaign = Campaign(CampaignSettings(seed=1, faults=1, run_dir=tmp_path))
    member = SimpleNamespace(config_path=tmp_path / "m1.yaml")
    campaign._group = cast(LocalSidecarGroup, SimpleNamespace(members={"m1": member}))
    return campaign


@pytest.mark.parametrize(
    ("exit_code", "verdict", "violation"),
    [(0, "passed", None), (1, "violations", "violations found"), (2, "could not run", "exit 2")],
)
def test_the_spark_audit_verdict_counts_like_the_checkers(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    exit_code: int,
    verdict: str,
    violation: str | None,
) -> None:
    calls: list[list[str]] = []

    def audit_main(argv: list[str]) -> int:
        calls.append(argv)
        return exit_code

    monkeypatch.setattr(audit_command, "main", audit_main)
    campaign = _campaign_after_its_run(tmp_path)
    campaign._spark_audit(progress=lambda _: None)
    assert calls and calls[0][:2] == ["--config", str(tmp_path / "m1.yaml")]
    assert campaign.report.audit == verdict
    if violation is None:
        assert campaign.report.violations == []
    else:
        assert len(campaign.report.violations) == 1
        assert violation in campaign.report.violations[0]
    assert f"Spark audit: {verdict}" in campaign.report.summary()
