"""The T-global config rule (kdsync.kafka.global_topic_rule) and the check that applies it."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kdsync.kafka import global_topic_check
from kdsync.kafka.global_topic_check import FIXED, GlobalTopicConfigCheck
from kdsync.kafka.global_topic_rule import (
    CLEANUP_POLICY,
    CONFIGS,
    CREATE_CONFIG,
    MAX_MESSAGE_BYTES,
    MIN_MAX_MESSAGE_BYTES,
    MIN_RETENTION_MS,
    PARTITIONS,
    RETENTION_BYTES,
    RETENTION_MS,
    Action,
    Finding,
    global_topics,
    judge_topic,
)
from kdsync.runtime.status_report import render


def _by_config(findings: list[Finding]) -> dict[str, Finding]:
    return {f.config: f for f in findings}


def test_what_kdsync_creates_follows_the_rule() -> None:
    findings = judge_topic("t-global", CREATE_CONFIG, 3, 3)
    assert [f.config for f in findings] == [*CONFIGS, PARTITIONS]
    assert all(f.action is Action.OK for f in findings), findings


def test_compaction_is_put_back_and_a_shorter_retention_only_reported() -> None:
    found = {**CREATE_CONFIG, CLEANUP_POLICY: "compact", RETENTION_MS: "60000"}
    by = _by_config(judge_topic("t-global", found, 1, 1))
    assert (by[CLEANUP_POLICY].action, by[CLEANUP_POLICY].set_to) == (Action.FIX, "delete")
    assert by[CLEANUP_POLICY].found == "compact" and by[CLEANUP_POLICY].why
    # An operator's shorter retention removes old records only: kept, and said so.
    assert (by[RETENTION_MS].action, by[RETENTION_MS].set_to) == (Action.REPORT, None)
    assert by[RETENTION_MS].found == "60000" and "failing over" in by[RETENTION_MS].why


def test_compact_and_delete_together_is_still_compaction() -> None:
    found = {**CREATE_CONFIG, CLEANUP_POLICY: "compact,delete"}
    assert _by_config(judge_topic("t", found, 1, 1))[CLEANUP_POLICY].action is Action.FIX


def test_a_size_limit_on_retention_is_put_back() -> None:
    found = {**CREATE_CONFIG, RETENTION_BYTES: "1073741824"}
    by = _by_config(judge_topic("t", found, 1, 1))
    assert (by[RETENTION_BYTES].action, by[RETENTION_BYTES].set_to) == (Action.FIX, "-1")


def test_a_smaller_message_limit_is_reported_not_changed() -> None:
    found = {**CREATE_CONFIG, MAX_MESSAGE_BYTES: "200000"}
    finding = _by_config(judge_topic("t", found, 1, 1))[MAX_MESSAGE_BYTES]
    assert finding.action is Action.REPORT and finding.set_to is None and finding.why


def test_another_partition_count_is_reported_only() -> None:
    finding = _by_config(judge_topic("t", CREATE_CONFIG, 4, 3))[PARTITIONS]
    assert (finding.action, finding.found, finding.wanted) == (Action.REPORT, "4", "3")
    assert finding.set_to is None and "operations.md" in finding.why


def test_the_heartbeat_topic_has_its_own_retention_floor() -> None:
    day = 24 * 3600 * 1000
    found = {**CREATE_CONFIG, RETENTION_MS: str(day)}
    assert _by_config(judge_topic("t", found, 1, 1, day))[RETENTION_MS].action is Action.OK
    assert _by_config(judge_topic("t", found, 1, 1))[RETENTION_MS].action is Action.REPORT


def test_a_config_the_brokers_did_not_report_is_not_guessed() -> None:
    by = _by_config(judge_topic("t", {}, 1, 1))
    assert all(by[c].action is Action.OK and by[c].found is None for c in CONFIGS)


@given(st.integers(min_value=-(2**40), max_value=2**50))
def test_retention_is_at_least_the_floor_or_forever(value: int) -> None:
    found = {**CREATE_CONFIG, RETENTION_MS: str(value)}
    finding = _by_config(judge_topic("t", found, 1, 1))[RETENTION_MS]
    follows = value >= MIN_RETENTION_MS or value == -1
    assert (finding.action is Action.OK) == follows
    assert finding.set_to is None  # never altered, whatever it is


@given(st.integers(min_value=0, max_value=2**40))
def test_a_larger_message_limit_is_kept(value: int) -> None:
    found = {**CREATE_CONFIG, MAX_MESSAGE_BYTES: str(value)}
    finding = _by_config(judge_topic("t", found, 1, 1))[MAX_MESSAGE_BYTES]
    assert (finding.action is Action.OK) == (value >= MIN_MAX_MESSAGE_BYTES)
    assert finding.action is not Action.FIX


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=12))
def test_any_value_is_judged_without_raising(value: str) -> None:
    findings = judge_topic("t", dict.fromkeys(CONFIGS, value), 1, 1)
    for f in findings:
        assert (f.action is Action.FIX) == (f.set_to is not None)


def test_global_topics_are_the_suffix_on_a_selected_source() -> None:
    names = ["a", "a-global", "b-global", "-global", "a-global-global", "__x"]
    assert global_topics(names, "-global", lambda t: t in {"a", "a-global", ""}) == [
        "a-global",
        "a-global-global",
    ]


# ---------------------------------------------------------------- the check, on a fake admin


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


class FakeAdmin:
    """Topics with configs and partition counts; records incremental alters."""

    def __init__(self, topics: dict[str, tuple[int, dict[str, str]]]) -> None:
        self.topics = topics
        self.altered: list[tuple[str, str, str]] = []
        self.down = False

    def list_topics(self, timeout: float) -> Any:
        if self.down:
            raise RuntimeError("brokers away")
        return SimpleNamespace(
            topics={
                name: SimpleNamespace(partitions=dict.fromkeys(range(count)), error=None)
                for name, (count, _) in self.topics.items()
            }
        )

    def describe_configs(self, resources: list[Any], request_timeout: float) -> Any:
        return {
            r: _done({k: SimpleNamespace(value=v) for k, v in self.topics[r.name][1].items()})
            for r in resources
        }

    def incremental_alter_configs(self, resources: list[Any]) -> Any:
        for r in resources:
            for entry in r.incremental_configs:
                self.topics[r.name][1][entry.name] = entry.value
                self.altered.append((r.name, entry.name, entry.value))
        return {r: _done(None) for r in resources}


class Seen:
    def __init__(self) -> None:
        self.drifting: dict[tuple[str, str], bool] = {}
        self.fixes: list[tuple[str, str]] = []
        self.failures = 0

    def drift(self, topic: str, config: str, drifting: bool) -> None:
        self.drifting[(topic, config)] = drifting

    def fixed(self, topic: str, config: str) -> None:
        self.fixes.append((topic, config))

    def failed(self) -> None:
        self.failures += 1


def _check(admin: FakeAdmin, seen: Seen) -> GlobalTopicConfigCheck:
    check = GlobalTopicConfigCheck({"bootstrap.servers": "x:1"}, "-global", "t".__eq__, 1, seen)
    check._admin = admin  # type: ignore[assignment]
    return check


def test_the_check_puts_back_what_it_may_and_reports_the_rest(caplog: Any) -> None:
    admin = FakeAdmin(
        {
            "t-global": (2, {**CREATE_CONFIG, CLEANUP_POLICY: "compact"}),
            "other-global": (1, {CLEANUP_POLICY: "compact"}),  # not ours: never touched
            "t": (3, {}),
        }
    )
    seen = Seen()
    check = _check(admin, seen)
    check.run_round()
    assert admin.altered == [("t-global", CLEANUP_POLICY, "delete")]
    assert seen.fixes == [("t-global", CLEANUP_POLICY)]
    assert seen.drifting[("t-global", PARTITIONS)] is True
    assert seen.drifting[("t-global", CLEANUP_POLICY)] is False
    status = check.status()
    assert status["topics"]["t-global"][CLEANUP_POLICY]["action"] == FIXED
    assert status["topics"]["t-global"][PARTITIONS]["action"] == "report-only"
    assert status["drift"] == ["t-global partitions=2 (report-only)"]
    assert status["fixes"] == {"t-global": {CLEANUP_POLICY: 1}}
    assert "other-global" not in status["topics"]

    # The next check finds it fixed; the partition drift is not warned about again.
    caplog.clear()
    check.run_round()
    assert check.status()["topics"]["t-global"][CLEANUP_POLICY]["action"] == "ok"
    assert len(admin.altered) == 1
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert check.checks == 2 and check.errors == 0


def test_a_failed_check_is_counted_and_never_raises() -> None:
    admin = FakeAdmin({"t-global": (1, dict(CREATE_CONFIG))})
    seen = Seen()
    check = _check(admin, seen)
    admin.down = True
    check.run_round()
    check.run_round()
    assert (check.errors, seen.failures, check.checks) == (2, 2, 0)
    assert check.status()["lastError"] == "brokers away"
    admin.down = False
    check.run_round()
    assert check.status()["lastError"] is None and check.checks == 1


def test_kdsync_status_shows_the_drift_left_as_it_is() -> None:
    status = {
        "member": "m2",
        "ready": True,
        "globalTopicConfig": {"drift": ["t-global partitions=2 (report-only)"]},
    }
    assert "T-GLOBAL CONFIG DRIFT: t-global partitions=2 (report-only)" in render([status])


def test_a_drift_cleared_by_hand_is_logged_once_and_its_gauge_drops(caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger=global_topic_check.__name__)
    admin = FakeAdmin({"t-global": (1, {**CREATE_CONFIG, MAX_MESSAGE_BYTES: "1000"})})
    seen = Seen()
    check = _check(admin, seen)
    check.run_round()
    check.run_round()
    warned = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and MAX_MESSAGE_BYTES in warned[0].getMessage()
    assert seen.drifting[("t-global", MAX_MESSAGE_BYTES)] is True
    assert admin.altered == []  # reported, never changed
    admin.topics["t-global"][1][MAX_MESSAGE_BYTES] = str(MIN_MAX_MESSAGE_BYTES)
    caplog.clear()
    check.run_round()
    assert seen.drifting[("t-global", MAX_MESSAGE_BYTES)] is False
    assert check.status()["drift"] == []
    assert [r.levelname for r in caplog.records] == ["INFO"]
