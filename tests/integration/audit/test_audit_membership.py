"""The audit after a membership change: it checks the data members in force (from the
ledgers, not the config file), and reads a member that left as an origin only, or not at
all once its cluster is gone, without calling its events foreign or its T-global behind."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from kdsync import naming
from kdsync.audit.command import main
from kdsync.audit.state import load_state_file
from kdsync.kafka.ledger_reader import HANDOVER_KEY, LEDGER_KEY
from kdsync.ordering import Configuration, LedgerState
from kdsync.ordering.events import DeliveredEvent
from kdsync.wire_format.records import encode_ledger_state
from tests.integration.audit.replicated_group import MEMBERS, ReplicatedGroup, write_config
from tests.support.plain_kafka import Record, create_topic, produce_transactionally

pytestmark = pytest.mark.kafka
STAYING = ("m1", "m2")
LEFT = "m3"


def run(config: Path, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    report = tmp_path / "report.json"
    report.unlink(missing_ok=True)
    status = main(["--config", str(config), "--report", str(report), *extra])
    return status, json.loads(report.read_text()) if report.exists() else {}


def write_ledger(group: ReplicatedGroup, member: str, ledger: LedgerState) -> None:
    topic = naming.ledger_topic(group.group)
    create_topic(group.bootstrap[member], topic)
    record = Record(key=LEDGER_KEY, value=encode_ledger_state(ledger), partition=0)
    produce_transactionally(group.bootstrap[member], topic, [record])


def ledger_of(group: ReplicatedGroup, config: Configuration | None) -> LedgerState:
    """A ledger that applied everything delivered so far, marking every origin's position."""
    marks: dict[tuple[str, str, int], int] = {}
    for delivered in group.delivered:
        where = (delivered.origin, group.topic, 0)
        marks[where] = max(marks.get(where, 0), delivered.event.offset + 1)
    last = 10 + len(group.delivered)
    return LedgerState(
        applied_index=last,
        applied_term=2,
        marks=marks,
        next_seq={group.topic: len(group.delivered)},
        config=config,
        config_index=0 if config is None else 10,
    )


def m3_leaves(group: ReplicatedGroup) -> list[DeliveredEvent]:
    """Twelve events of all three members reach everyone; then m3 is removed and m1 and
    m2 order eight more among themselves. m3's T-global stops at seq 11."""
    group.replicate(group.add_round(4, "a"))
    write_ledger(group, LEFT, ledger_of(group, None))
    later = {m: group.produce_origin(m, 4, "b") for m in STAYING}
    m1_events, m2_events = later["m1"], later["m2"]
    order = [
        (m, e) for a, b in zip(m1_events, m2_events, strict=True) for m, e in (("m1", a), ("m2", b))
    ]
    events = group.deliver(order)
    for member in STAYING:
        group.write_global(member, events)
        group.commit_source_offsets(member)
    after = ledger_of(group, Configuration(voters=STAYING))
    for member in STAYING:
        write_ledger(group, member, after)
    return events


def test_a_member_that_left_is_an_origin_not_a_lagging_replica(
    make_group: Callable[[], ReplicatedGroup], spark: SparkSession, tmp_path: Path
) -> None:
    group = make_group()
    m3_leaves(group)
    state_file = tmp_path / "state.json"

    status, report = run(group.config_path, tmp_path, "--state", str(state_file))

    assert status == 0, report["violations"]
    # Before, m3 was 8 behind for ever and the incremental state could not pass seq 11.
    assert report["lag"] == {"m1": 0, "m2": 0}
    assert report["checked"] == {"fromSeq": 0, "toSeq": 19, "events": 20}
    assert report["counts"]["unverified"] == 0  # m3's events checked against its topic
    assert report["membership"] == {
        "checked": ["m1", "m2"],
        "departed": ["m3"],
        "notRead": [],
        "configIndex": 10,
        "source": report["membership"]["source"],
        "seeded": {},
        "joining": [],
    }
    assert report["membership"]["source"] in STAYING
    assert "left the group: m3" in report["summary"]
    saved = load_state_file(state_file, group.group)
    assert saved is not None and saved.topics[group.topic].next_seq == 20


def test_a_member_that_left_is_still_checked_as_an_origin(
    make_group: Callable[[], ReplicatedGroup], spark: SparkSession, tmp_path: Path
) -> None:
    group = make_group()
    m3_leaves(group)
    # m2 holds, at seq 20, an m3 event that m3 never wrote: not from any origin.
    stranger = group.delivered[2]._replace(seq=20)
    stranger = stranger._replace(event=stranger.event._replace(offset=999))
    group.write_global("m2", [stranger])

    status, report = run(group.config_path, tmp_path)

    assert status == 1
    kinds = {(v["kind"], v["seq"], v["member"]) for v in report["violations"]}
    assert ("foreign", 20, "m2") in kinds, report["violations"]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("how", ["cluster-gone", "dropped-from-file"])
def test_the_audit_runs_once_a_departed_members_cluster_is_gone(
    make_group: Callable[[], ReplicatedGroup], spark: SparkSession, tmp_path: Path, how: str
) -> None:
    group = make_group()
    m3_leaves(group)
    bootstrap = dict(group.bootstrap)
    if how == "cluster-gone":
        bootstrap[LEFT] = f"127.0.0.1:{_closed_port()}"
        members: tuple[str, ...] = MEMBERS
    else:
        members = STAYING
    config = write_config(tmp_path / "after.yaml", group.group, group.topic, bootstrap, members)

    status, report = run(config, tmp_path, "--kafka-timeout", "3")

    assert status == 0, report.get("violations")
    assert report["lag"] == {"m1": 0, "m2": 0}
    # m3's four events of round a, in each staying member: held, but not verifiable.
    assert report["counts"]["unverified"] == 8
    assert report["counts"]["foreign"] == 0
    assert report["membership"]["notRead"] == ["m3"]
    assert "left the group: m3 (not read)" in report["summary"]


def test_a_member_in_force_that_is_down_still_stops_the_audit(
    make_group: Callable[[], ReplicatedGroup],
    spark: SparkSession,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    group = make_group()
    m3_leaves(group)
    bootstrap = dict(group.bootstrap) | {"m2": f"127.0.0.1:{_closed_port()}"}
    config = write_config(tmp_path / "down.yaml", group.group, group.topic, bootstrap, MEMBERS)

    status = main(["--config", str(config), "--kafka-timeout", "3"])

    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("kdsync audit: cannot run: member m2: cannot list topics"), err


@pytest.mark.parametrize("hole", [None, 8])
def test_a_member_seeded_from_a_trimmed_donor_is_checked_from_its_first_seq(
    make_group: Callable[[], ReplicatedGroup], spark: SparkSession, tmp_path: Path, hole: int | None
) -> None:
    """m3 joined late: a backfill from a donor whose T-global retention had trimmed below
    seq 6 gave it seqs 6.. only, and its hand-over record says so. The audit checks m1 and
    m2 from seq 0 and m3 from seq 6, rather than report seqs 0..5 missing in m3."""
    group = make_group()
    events = group.add_round(4, "a")
    first = 6
    for member in STAYING:
        group.write_global(member, events)
    group.write_global(LEFT, [e for e in events[first:] if e.seq != hole])
    for member in MEMBERS:
        group.commit_source_offsets(member)
    topic = naming.ledger_topic(group.group)
    create_topic(group.bootstrap[LEFT], topic)
    handover = {
        "donor": "m2",
        "appliedIndex": 30,
        "nextSeq": {group.topic: first},
        "firstSeq": {group.topic: first},
    }
    produce_transactionally(
        group.bootstrap[LEFT],
        topic,
        [
            Record(key=HANDOVER_KEY, value=json.dumps(handover).encode(), partition=0),
            Record(
                key=LEDGER_KEY,
                value=encode_ledger_state(ledger_of(group, None)),
                partition=0,
            ),
        ],
    )

    status, report = run(group.config_path, tmp_path)

    if hole is not None:  # a seq m3 lacks above its start is found, and only that one
        assert status == 1
        found = {(v["kind"], v["seq"], v["member"]) for v in report["violations"]}
        assert found == {("gap", hole, "m3"), ("missing", hole, "m3")}, report["violations"]
        return
    assert status == 0, report["violations"]
    assert report["checked"] == {"fromSeq": 0, "toSeq": 11, "events": 12}
    assert report["lag"] == {"m1": 0, "m2": 0, "m3": 0}
    assert report["membership"]["seeded"]["m3"]["firstSeq"] == {group.topic: first}
