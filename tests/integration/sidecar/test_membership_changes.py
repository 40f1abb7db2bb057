"""Changing a running group's members with ``kdsync members`` (issue #17). Removing:
the leader first, then the witness, under traffic, on real brokers. The members that
stay keep ordering and end with identical, complete ``T-global``s, the removed leader's
events included; a member restarted afterwards takes the new membership from its
ledger, not from its startup file, and the Spark audit checks the members in force.
Adding a witness: a two-region group gains one at
runtime, and keeps ordering with either region down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kdsync.audit.command import main as audit_main
from kdsync.local_group import LocalSidecarGroup
from tests.integration.sidecar.harness import (
    GlobalWatch,
    Traffic,
    brief_status,
    http_get,
    start_watched,
    verify_group,
    wait_for,
)

pytestmark = pytest.mark.kafka

RATE = 150  # events/s per origin
BURST = 3000  # events the member to remove has not read when its removal is asked
GROWTH = 300  # events each staying member must gain after a change: ordering goes on


def _members_cli(
    group: LocalSidecarGroup, action: str, *args: str, options: Sequence[str] = ()
) -> subprocess.Popen[str]:
    urls = [m.http for m in group.members.values()]
    return subprocess.Popen(
        [sys.executable, "-m", "kdsync.cli", "members", action, *args, *urls, *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


MEMBER_LABELS = ("member", "peer", "source", "target")


def _series_naming(group: LocalSidecarGroup, at: str, names: Iterable[str]) -> list[str]:
    """The series on ``at``'s /metrics labelled with any of ``names`` as a member."""
    wanted = set(names)
    _, text = http_get(group.members[at].http, "/metrics")
    return [
        f"{sample.name}{sample.labels}"
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if any(sample.labels.get(label) in wanted for label in MEMBER_LABELS)
    ]


def _configuration(group: LocalSidecarGroup, member: str) -> dict[str, object]:
    status = group.status(member) or {}
    config = status.get("configuration")
    assert isinstance(config, dict), brief_status(group)
    return config


def test_remove_the_leader_then_the_witness_under_traffic(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
    tmp_path: Path,
) -> None:
    group = sidecar_group("members", bootstrap, source_topic, witnesses=["w"])
    global_topic, watch = start_watched(group, bootstrap, source_topic)
    leaders = group.wait_until(
        "a data member to lead",
        lambda s: s.get("leader") in bootstrap,
        60,
        names=list(bootstrap),
    )
    leader = str(next(iter(leaders.values()))["leader"])
    staying = [m for m in bootstrap if m != leader]
    # The member that stays up throughout; its /metrics name the two to remove for now.
    observer = staying[-1]
    wait_for(
        f"{observer}'s metrics to name {leader} and w",
        lambda: all(_series_naming(group, observer, [name]) for name in (leader, "w")),
        30,
    )
    leaving_traffic = Traffic({leader: bootstrap[leader]}, source_topic, RATE).start()
    traffic = Traffic({m: bootstrap[m] for m in staying}, source_topic, RATE).start()
    pauses: dict[str, float] = {}
    try:
        _await_traffic(group, watch, bootstrap)
        # The region to retire stops producing first; the command waits until every
        # event its sidecar read is in the order, so none of them is left behind.
        leaving_traffic.stop()
        output, pauses[f"remove {leader} (the leader)"] = _run_measuring_pauses(
            group, staying, "remove", leader
        )
        assert f"{leader} is out of the group" in output, output
        group.stop(leader)
        _expect_growth(group, watch, staying)
        # The startup files still name it, but no one dials it any more.
        group.wait_until(
            f"the others to stop dialling {leader}",
            lambda s: (s.get("peers") or {}).get(leader, {}).get("link") == "retired",
            30,
            names=[*staying, "w"],
        )

        output, pauses["remove w (the witness)"] = _run_measuring_pauses(
            group, staying, "remove", "w"
        )
        assert "w is out of the group" in output, output
        group.stop("w")
        _expect_growth(group, watch, staying)

        # A member restarted now takes the membership from its ledger: its startup file
        # still names the two removed members, and it must not wait for them.
        restarted = staying[0]
        group.stop(restarted)
        group.start_member(restarted)
        group.wait_ready(timeout=90, names=staying)
        _expect_growth(group, watch, staying)
        group.wait_until(
            "the restarted member to dial only the members in force",
            lambda s: all(
                (s.get("peers") or {}).get(gone, {}).get("link") == "retired"
                for gone in (leader, "w")
            ),
            30,
            names=[restarted],
        )
        # Removed members leave /metrics too: a "link down" or "heartbeats stopped"
        # alert on a member that is gone would fire for good.
        wait_for(
            f"{observer}'s metrics to drop every series of {leader} and w",
            lambda: not _series_naming(group, observer, (leader, "w")),
            30,
            lambda: "\n".join(_series_naming(group, observer, (leader, "w"))),
        )
        assert _series_naming(group, observer, [restarted]), "the check would find none"
    finally:
        produced = {**leaving_traffic.stop(), **traffic.stop()}
    for member in staying:
        config = _configuration(group, member)
        assert config["voters"] == staying and config["witnesses"] == [], config
        assert config["committed"] is True, config
    # Every origin's events, the removed leader's included, are in both staying
    # members' T-global exactly once and in one order.
    verify_group(group, bootstrap, source_topic, global_topic, produced, replicas=staying)
    watch.close()
    # The Spark audit, from a staying member's file (which still names the removed
    # leader): it checks the two in force, from their ledgers, and the leader's events
    # against its source topic; it does not call the leader's T-global behind.
    report_path = tmp_path / "audit.json"
    config = str(group.members[staying[0]].config_path)
    status = audit_main(["--config", config, "--report", str(report_path)])
    report = json.loads(report_path.read_text())
    assert status == 0, report["violations"]
    assert report["membership"]["checked"] == staying, report["membership"]
    assert report["membership"]["departed"] == [leader], report["membership"]
    assert sorted(report["lag"]) == sorted(staying), report["lag"]
    assert report["counts"]["unverified"] == 0, report["counts"]
    assert report["checked"]["events"] >= sum(produced.values()), report["checked"]
    (tmp_path / "membership-pauses.json").write_text(json.dumps(pauses))
    print(f"longest gap in delivery at a staying member, by change: {json.dumps(pauses)}")


def _await_traffic(group: LocalSidecarGroup, watch: GlobalWatch, members: Iterable[str]) -> None:
    wait_for(
        "traffic to flow everywhere",
        lambda: all(watch.count(m) >= GROWTH for m in members),
        60,
        lambda: brief_status(group),
    )


def _expect_growth(group: LocalSidecarGroup, watch: GlobalWatch, staying: Sequence[str]) -> None:
    start = {m: watch.count(m) for m in staying}
    wait_for(
        f"{', '.join(staying)} to go on ordering",
        lambda: all(watch.count(m) >= start[m] + GROWTH for m in staying),
        60,
        lambda: brief_status(group),
    )


def test_events_a_member_has_not_ordered_yet_are_drained_before_its_removal(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    """The member to remove is frozen (SIGSTOP) with a burst of events in its source
    topic that it has not read. The command must wait for them: the member is thawed
    only once the command says it waits, and every event must end in the others'
    T-global. Without the drain the removal commits while it is frozen, and its events
    are lost to the group."""
    group = sidecar_group("members-drain", bootstrap, source_topic)
    global_topic, watch = start_watched(group, bootstrap, source_topic)
    leaders = group.wait_until("a leader", lambda s: s.get("leader") in bootstrap, 60)
    leader = str(next(iter(leaders.values()))["leader"])
    victim = next(m for m in bootstrap if m != leader)
    staying = [m for m in bootstrap if m != victim]
    group.pause(victim)
    try:
        produced = Traffic({victim: bootstrap[victim]}, source_topic, count_per_origin=BURST)
        produced.start().join()
        cli = _members_cli(group, "remove", victim, options=["--timeout", "120"])
        assert cli.stdout is not None
        lines = []
        for line in cli.stdout:  # ends when the command exits (it has a deadline)
            lines.append(line)
            if f"waiting for {victim}" in line:
                group.resume(victim)
        cli.wait(timeout=30)
    finally:
        group.resume(victim)
    output = "".join(lines)
    assert cli.returncode == 0, output
    group.stop(victim)
    counts = {m: 0 for m in bootstrap} | produced.acked
    verify_group(
        group, bootstrap, source_topic, global_topic, counts, replicas=staying, watch=watch
    )
    watch.close()


def test_members_remove_refuses_what_would_break_the_group(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    data = {m: bootstrap[m] for m in ("m1", "m2")}
    group = sidecar_group("members-refuse", data, source_topic, witnesses=["w"])
    group.start()
    group.wait_ready(timeout=90)
    cases = {
        # Two data members and a witness: removing a data member leaves as many
        # witnesses as data voters, which could lose committed entries.
        "m1": "more voting data members than witnesses",
        "nobody": "nobody is not in the group's configuration",
    }
    for member, expected in cases.items():
        cli = _members_cli(group, "remove", member, options=["--no-drain", "--timeout", "30"])
        output, _ = cli.communicate(timeout=60)
        assert cli.returncode == 1, output
        assert expected in output, output
    show = _members_cli(group, "show")
    output, _ = show.communicate(timeout=60)
    assert show.returncode == 0, output
    assert "m1, m2, w (witness)" in output, output


def _run_measuring_pauses(
    group: LocalSidecarGroup,
    staying: Sequence[str],
    action: str,
    member: str,
    *options: str,
) -> tuple[str, float]:
    """Run ``kdsync members action member`` while following what the staying members
    deliver (``eventsOut`` in their /status, cheap to ask, unlike reading their
    T-globals, which falls seconds behind when the reader has a backlog); returns the
    command's output and the longest time any staying member delivered nothing."""

    def delivered(m: str) -> int:
        return int((group.status(m) or {}).get("eventsOut", 0))

    last_growth = {m: (time.monotonic(), delivered(m)) for m in staying}
    # Options after the addresses: argparse takes positionals in one go.
    cli = _members_cli(group, action, member, options=[*options, "--timeout", "120"])
    longest = 0.0
    done = False
    while not done:  # asks until the command returns (it has a deadline)
        done = cli.poll() is not None
        for m in staying:
            now, count = time.monotonic(), delivered(m)
            at, before = last_growth[m]
            longest = max(longest, now - at)
            if count > before:
                last_growth[m] = (now, count)
        time.sleep(0.05)  # the sampling interval, not a wait for a condition
    output = cli.stdout.read() if cli.stdout else ""
    assert cli.returncode == 0, output
    return output, longest


def test_two_regions_gain_a_witness_that_keeps_one_ordering_while_the_other_is_down(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
    tmp_path: Path,
) -> None:
    """Two data members and no witness: either one down stops the group. A witness is
    added at runtime (its sidecar started first, then ``kdsync members add w
    --witness``), and then one region frozen leaves the other ordering its own events.
    A member restarted afterwards reaches the witness, which its startup file does not
    name, at the address the change recorded. Then the witness is removed again, and
    both regions end with the same complete T-global."""
    data = {m: bootstrap[m] for m in ("m1", "m2")}
    group = sidecar_group("members-witness", data, source_topic)
    global_topic, watch = start_watched(group, data, source_topic)
    regions = list(data)
    traffic = Traffic(data, source_topic, RATE).start()
    pauses: dict[str, float] = {}
    try:
        _await_traffic(group, watch, regions)
        group.add_witness("w")
        group.start_member("w")
        output, pauses["add w (a witness)"] = _run_measuring_pauses(
            group, regions, "add", "w", "--witness"
        )
        assert "w is in the group" in output and "w follows the group" in output, output
        for member in regions:
            config = _configuration(group, member)
            assert config["voters"] == [*regions, "w"] and config["witnesses"] == ["w"], config
            assert config["committed"] is True, config
        _expect_growth(group, watch, regions)

        # The witness's vote counts: with m2 frozen, m1 and w are a majority.
        group.pause("m2")
        try:
            _expect_growth(group, watch, ["m1"])
        finally:
            group.resume("m2")
        _expect_growth(group, watch, regions)

        # m1's startup file does not name w: restarted, it dials w at the address the
        # change recorded in its ledger.
        group.stop("m1")
        group.start_member("m1")
        group.wait_ready(timeout=90, names=["m1"])
        group.wait_until(
            "the restarted m1 to reach w",
            lambda s: (s.get("peers") or {}).get("w", {}).get("link") == "connected",
            30,
            names=["m1"],
        )
        _expect_growth(group, watch, regions)

        output, pauses["remove w (the witness)"] = _run_measuring_pauses(
            group, regions, "remove", "w"
        )
        assert "w is out of the group" in output, output
        group.stop("w")
        _expect_growth(group, watch, regions)
    finally:
        produced = traffic.stop()
    for member in regions:
        config = _configuration(group, member)
        assert config["voters"] == regions and config["witnesses"] == [], config
    verify_group(group, data, source_topic, global_topic, produced, replicas=regions)
    watch.close()
    (tmp_path / "witness-pauses.json").write_text(json.dumps(pauses))
    print(f"longest gap in delivery at a region, by change: {json.dumps(pauses)}")


def test_a_witness_killed_while_it_joins_comes_back_and_the_group_never_stops(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    """Three data members and a witness x gain a second witness w under traffic. w is
    SIGKILLed as soon as the change is in the members' logs, while ``kdsync members add``
    still waits for it: the group goes on ordering meanwhile, w restarted from nothing
    recovers from the others and follows, and the command completes. Then x, whose
    startup file predates w, restarts: it must reach w (named only by the others'
    answers, with its address) to recover. Every event ends once, in one order, in all
    three T-globals."""
    group = sidecar_group("members-join-kill", bootstrap, source_topic, witnesses=["x"])
    global_topic, watch = start_watched(group, bootstrap, source_topic)
    members = list(bootstrap)
    traffic = Traffic(bootstrap, source_topic, RATE).start()
    try:
        _await_traffic(group, watch, members)
        group.add_witness("w")
        group.start_member("w")
        cli = _members_cli(group, "add", "w", options=["--witness", "--timeout", "180"])
        try:
            group.wait_until(
                "the change to be in the members' logs",
                lambda s: "w" in (s.get("configuration") or {}).get("voters", []),
                60,
                names=members,
            )
            group.kill("w")
            _expect_growth(group, watch, members)  # 4 of 5 voters up
            group.start_member("w")
            output, _ = cli.communicate(timeout=240)  # the command has its own deadline
        finally:
            if cli.poll() is None:
                cli.kill()
        assert cli.returncode == 0, output
        assert "w follows the group" in output, output
        _expect_growth(group, watch, members)

        group.stop("x")
        group.start_member("x")
        group.wait_until(
            "the restarted x to recover, w included, and follow",
            lambda s: (
                s.get("role") == "follower"
                and "w" in (s.get("configuration") or {}).get("voters", [])
            ),
            60,
            names=["x"],
        )
        _expect_growth(group, watch, members)
    finally:
        produced = traffic.stop()
    for member in members:
        config = _configuration(group, member)
        assert config["voters"] == [*members, "x", "w"], config
        assert config["committed"] is True, config
    verify_group(group, bootstrap, source_topic, global_topic, produced, replicas=members)
    watch.close()
