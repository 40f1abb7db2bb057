"""The campaign's bookkeeping: figures per kind, and telling a deliberate stop from a crash."""

from __future__ import annotations

from pathlib import Path

from kdsync.chaos.campaign import CampaignReport, FaultOutcome, stop_reason


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
