"""The audit against real Kafka and local Spark: a clean group passes; each kind of damage
written into one member's T-global is found at the right seq and member; incremental runs
continue where the last clean run ended; a bad config or a dead broker exits 2."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from kdsync.audit.command import main
from kdsync.audit.positions import plan_audit
from kdsync.audit.state import load_state_file
from kdsync.config import load_config
from kdsync.ordering.events import DeliveredEvent
from tests.integration.audit.replicated_group import MEMBERS, ReplicatedGroup, write_config

pytestmark = pytest.mark.kafka
DAMAGED = "m2"


def run(config: Path, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    report = tmp_path / "report.json"
    report.unlink(missing_ok=True)
    status = main(["--config", str(config), "--report", str(report), *extra])
    return status, json.loads(report.read_text()) if report.exists() else {}


def found(report: dict[str, Any]) -> set[tuple[str, int | None, str]]:
    return {(v["kind"], v["seq"], v["member"]) for v in report["violations"]}


@pytest.fixture
def clean_group(make_group: Callable[[], ReplicatedGroup], spark: SparkSession) -> ReplicatedGroup:
    group = make_group()
    group.replicate(group.add_round(4, "a"))
    return group


def test_a_clean_group_passes(
    clean_group: ReplicatedGroup, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, report = run(clean_group.config_path, tmp_path)
    assert status == 0, report
    assert report["passed"] is True
    assert report["version"] == 1
    assert report["group"] == clean_group.group
    assert report["checked"] == {"fromSeq": 0, "toSeq": 11, "events": 12}
    assert report["violationsTotal"] == 0
    assert report["violations"] == []
    assert report["lag"] == dict.fromkeys(MEMBERS, 0)
    assert all(report["counts"][k] == 0 for k in report["counts"])
    assert report["startedAt"].endswith("Z") and report["finishedAt"] >= report["startedAt"]
    assert capsys.readouterr().out.startswith(f"PASS group {clean_group.group}: seqs 0..11")


def test_a_lagging_member_is_lag_not_a_violation(
    make_group: Callable[[], ReplicatedGroup], spark: SparkSession, tmp_path: Path
) -> None:
    group = make_group()
    events = group.add_round(4, "a")
    for member in MEMBERS:
        group.write_global(member, events if member != "m3" else events[:9])
    # m3's sidecar commits only the source offsets of what it wrote.
    for member in MEMBERS:
        group.commit_source_offsets(member, below_seq=9 if member == "m3" else None)
    status, report = run(group.config_path, tmp_path)
    assert status == 0, report["violations"]
    assert report["lag"] == {"m1": 0, "m2": 0, "m3": 3}


def _swap(events: list[DeliveredEvent], a: int, b: int) -> list[DeliveredEvent]:
    damaged = list(events)
    damaged[a] = events[b]._replace(seq=a)
    damaged[b] = events[a]._replace(seq=b)
    return damaged


def _alter(events: list[DeliveredEvent], at: int) -> list[DeliveredEvent]:
    damaged = list(events)
    damaged[at] = events[at]._replace(event=events[at].event._replace(value=b"tampered"))
    return damaged


def _foreign(events: list[DeliveredEvent]) -> list[DeliveredEvent]:
    stranger = DeliveredEvent(len(events), "stranger", events[0].topic, 0, events[0].event)
    return [*events, stranger]


def _duplicate(events: list[DeliveredEvent], at: int) -> list[DeliveredEvent]:
    return [*events, events[at]._replace(seq=len(events))]


# name -> (damage to m2's copy, violations that must be reported, all on m2)
INJECTIONS: dict[str, tuple[Callable[[list[DeliveredEvent]], list[DeliveredEvent]], set[Any]]] = {
    # The event at seq 5 delivered again, as seq 12.
    "duplicate": (lambda e: _duplicate(e, 5), {("duplicate", 12)}),
    # Seqs 3 and 4 hold two events of m1's T (offsets in order) in swapped places.
    "swapped-pair": (
        lambda e: _swap(e, 3, 4),
        {("disagreement", 3), ("disagreement", 4), ("order", 4)},
    ),
    # The event at seq 6 is not there.
    "missing": (lambda e: [x for x in e if x.seq != 6], {("gap", 6), ("missing", 6)}),
    # The value of the event at seq 7 changed.
    "altered-value": (lambda e: _alter(e, 7), {("fidelity", 7), ("disagreement", 7)}),
    # An event from a member that is not in the group, as seq 12.
    "extra": (_foreign, {("foreign", 12)}),
}


@pytest.mark.parametrize("injection", sorted(INJECTIONS))
def test_damage_in_one_member_is_found(
    make_group: Callable[[], ReplicatedGroup],
    spark: SparkSession,
    tmp_path: Path,
    injection: str,
) -> None:
    group = make_group()
    events = group.add_round(4, "a")
    assert [e.origin for e in events[3:5]] == ["m1", "m1"]
    damage, expected = INJECTIONS[injection]
    for member in MEMBERS:
        group.write_global(member, damage(events) if member == DAMAGED else events)
    for member in MEMBERS:
        group.commit_source_offsets(member)

    status, report = run(group.config_path, tmp_path)

    assert status == 1, report
    assert report["passed"] is False
    wanted = {(kind, seq, DAMAGED) for kind, seq in expected}
    assert wanted <= found(report), report["violations"]
    assert {v["member"] for v in report["violations"]} == {DAMAGED}, report["violations"]
    assert report["violationsTotal"] == len(report["violations"])
    for kind, _ in expected:
        assert report["counts"][kind] >= 1
    assert report["summary"].startswith(f"FAIL group {group.group}")


def test_violation_cap_keeps_the_totals(
    make_group: Callable[[], ReplicatedGroup], spark: SparkSession, tmp_path: Path
) -> None:
    group = make_group()
    events = group.add_round(4, "a")
    for member in MEMBERS:
        damaged = [e._replace(event=e.event._replace(value=b"x")) for e in events]
        group.write_global(member, damaged if member == DAMAGED else events)
    status, report = run(group.config_path, tmp_path, "--violation-cap", "5")
    assert status == 1
    assert len(report["violations"]) == 5
    assert report["counts"]["fidelity"] == 12
    assert report["violationsTotal"] == 24  # fidelity and disagreement at each of 12 seqs


def test_incremental_run_continues_from_the_last_clean_end(
    clean_group: ReplicatedGroup, tmp_path: Path
) -> None:
    state_file = tmp_path / "state.json"
    status, first = run(clean_group.config_path, tmp_path, "--state", str(state_file))
    assert status == 0, first
    saved = load_state_file(state_file, clean_group.group)
    assert saved is not None and saved.topics[clean_group.topic].next_seq == 12

    more = clean_group.add_round(2, "b")
    clean_group.replicate(more)
    # Only what came after the first run is planned: 6 new events (plus commit markers).
    plan = plan_audit(load_config(clean_group.config_path, check_files=False), saved)
    (topic_plan,) = plan.topics
    for rng in topic_plan.globals:
        assert rng.start[0] >= 12 and rng.records <= 8, rng  # 6 events, 2 commit markers
    for rng in topic_plan.origins:
        assert rng.start[0] >= 4 and rng.records <= 4, rng  # 2 events, 2 commit markers

    status, second = run(clean_group.config_path, tmp_path, "--state", str(state_file))
    assert status == 0, second
    assert second["checked"] == {"fromSeq": 12, "toSeq": 17, "events": 6}

    # Damage after the clean end is still found by the next incremental run.
    extra = clean_group.deliver([("m3", clean_group.produce_origin("m3", 1, "c")[0])])
    for member in MEMBERS:
        clean_group.write_global(member, _alter(extra, 0) if member == DAMAGED else extra)
    status, third = run(clean_group.config_path, tmp_path, "--state", str(state_file))
    assert status == 1
    assert ("fidelity", 18, DAMAGED) in found(third)
    assert third["checked"]["fromSeq"] == 18
    # A failed run does not move the state.
    after = load_state_file(state_file, clean_group.group)
    assert after is not None and after.topics[clean_group.topic].next_seq == 18


def test_a_redelivery_of_an_event_audited_earlier_is_a_duplicate(
    clean_group: ReplicatedGroup, tmp_path: Path
) -> None:
    state_file = tmp_path / "state.json"
    status, first = run(clean_group.config_path, tmp_path, "--state", str(state_file))
    assert status == 0, first
    # m2 delivers the event of seq 5 (checked by the first run) again, as seq 12; the
    # second run does not read seq 5 or its origin record, yet knows the event is old.
    again = clean_group.delivered[5]._replace(seq=12)
    clean_group.write_global(DAMAGED, [again])

    status, second = run(clean_group.config_path, tmp_path, "--state", str(state_file))

    assert status == 1, second
    assert second["checked"]["fromSeq"] == 12
    assert ("duplicate", 12, DAMAGED) in found(second), second["violations"]
    assert second["counts"]["unverified"] == 0
    assert "appears again" in second["violations"][0]["detail"]


def test_missing_config_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["--config", str(tmp_path / "nope.yaml")])
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kdsync audit: cannot run: bad config") and "does not exist" in err
    assert "\n" not in err


def test_unreachable_broker_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    bootstrap = {m: f"127.0.0.1:{port}" for m in MEMBERS}
    config = write_config(tmp_path / "dead.yaml", "dead", "orders", bootstrap, MEMBERS)
    status = main(["--config", str(config), "--kafka-timeout", "3"])
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kdsync audit: cannot run: member m1: cannot list topics")
    assert f"127.0.0.1:{port}" in err and "\n" not in err
