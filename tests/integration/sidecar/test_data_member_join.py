"""A fourth data member joins a running three-member group under traffic (issue #17):
``kdsync members add m4 --member-config`` adds it as a learner, seeds its cluster with a
peer's ``T-global`` and ledger (Spark), and waits until the started sidecar votes. The
backfill is SIGKILLed mid-copy and run again: it resumes. In the end all four members hold
the same complete ``T-global`` (independent checker and Spark audit), the new region's own
events included."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from kdsync import naming
from kdsync.audit.command import main as audit_main
from kdsync.local_group import LocalMember, LocalSidecarGroup
from kdsync.localkafka import KafkaDistribution, LocalKafkaFleet
from kdsync.verification.traffic import Traffic
from tests.integration.sidecar.harness import (
    PARTITIONS,
    brief_status,
    http_get,
    start_watched,
    verify_group,
    wait_for,
)
from tests.support.plain_kafka import create_topic

pytestmark = pytest.mark.kafka

RATE = 150  # events/s per origin, while m4 joins
HISTORY = 10_000  # events per origin ordered before m4 joins: what the backfill copies
GROWTH = 300


class _CommittedEnd:
    """The last stable offset of ``topic[0]`` (0 while it does not exist), asked often
    through one consumer: the copy must be caught between two of its transactions."""

    def __init__(self, servers: str, topic: str) -> None:
        self._topic = topic
        self._consumer = Consumer(
            {"bootstrap.servers": servers, "group.id": "probe", "isolation.level": "read_committed"}
        )

    def now(self) -> int:
        try:
            _, high = self._consumer.get_watermark_offsets(
                TopicPartition(self._topic, 0), timeout=5, cached=False
            )
        except KafkaException:  # the copy has not created the topic yet
            return 0
        return int(high)

    def __enter__(self) -> _CommittedEnd:
        return self

    def __exit__(self, *_: object) -> None:
        self._consumer.close()


def _low(servers: str, topic: str) -> int:
    """The low watermark of ``topic[0]``: above 0 once the log was trimmed."""
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "probe"})
    try:
        low, _ = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(low)
    finally:
        consumer.close()


def _members_add(urls: Sequence[str], new: LocalMember) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kdsync.cli",
            "members",
            "add",
            new.name,
            *urls,
            "--member-config",
            str(new.config_path),
            "--peer",
            new.peer,
            # A deadline, not a wait: Spark's start and the copy take minutes on a
            # loaded 2-core machine (CI runs three lanes at once).
            "--timeout",
            "900",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,  # its own process group: Spark's JVM and workers too
    )


class _Lines:
    """The command's output, read as it comes (a thread), to act on a line; each line
    with the seconds since the command started, so that a slow phase shows which."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._read_at: list[tuple[float, str]] = []  # (seconds since the start, line)
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self._read_at.append((time.monotonic() - self._start, line.rstrip()))

    @property
    def lines(self) -> list[str]:
        return [line for _, line in self._read_at]

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    @property
    def text(self) -> str:
        return "\n".join(f"[{at:6.1f}s] {line}" for at, line in self._read_at[-60:])


class _CatchUp:
    """Why m4 may not vote yet, rates first (CI's output keeps a failure's start): how
    fast m4 applied against the group since its sidecar started, the leader's read-backs
    of its ordering log (what a member that far behind is sent), and m4's log's end."""

    def __init__(self, group: LocalSidecarGroup, lines: _Lines) -> None:
        self._group = group
        self._lines = lines
        self._began = time.monotonic()
        self._start = _applied(self._statuses())

    def _statuses(self) -> dict[str, dict[str, Any]]:
        return {m: self._group.status(m) or {} for m in self._group.members}

    def rates(self, statuses: dict[str, dict[str, Any]] | None = None) -> str:
        """Entries applied per second by each member since m4 started, and the leader's
        read-backs."""
        statuses = self._statuses() if statuses is None else statuses
        seconds = max(time.monotonic() - self._began, 1e-3)
        now = _applied(statuses)
        rates = {m: round((now[m] - self._start.get(m, 0)) / seconds) for m in now}
        leader = next((m for m, s in statuses.items() if s.get("role") == "leader"), None)
        readback = _readback_figures(self._group.members[leader].http) if leader else "none"
        return (
            f"entries applied per second over {seconds:.0f}s: {json.dumps(rates)}; "
            f"leader {leader}'s read-backs: {readback}"
        )

    def describe(self) -> str:
        statuses = self._statuses()
        applied = {
            m: {k: s.get(k) for k in ("role", "appliedIndex", "knownCommit", "memberLag")}
            for m, s in statuses.items()
        }
        log = self._group.members["m4"].log_path.read_text().splitlines()[-15:]
        return (
            f"{self.rates(statuses)}\n{json.dumps(applied)}\n"
            f"{self._lines.text}\n--- m4's log:\n" + "\n".join(log)
        )


def _applied(statuses: dict[str, dict[str, Any]]) -> dict[str, int]:
    return {m: int(s.get("appliedIndex") or 0) for m, s in statuses.items()}


def _readback_figures(http: str) -> str:
    """The read-back count, mean duration and entries on a member's /metrics."""
    try:
        _, text = http_get(http, "/metrics")
    except OSError as exc:
        return f"unreadable ({exc})"
    found = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    count = found.get("kdsync_log_readback_seconds_count", 0.0)
    mean = found.get("kdsync_log_readback_seconds_sum", 0.0) / count if count else 0.0
    entries = found.get("kdsync_log_readback_entries_total", 0.0)
    return f"{count:.0f} taking {mean:.2f}s on average, {entries:.0f} entries"


# Alone it takes about 5 minutes; CI runs three lanes on two cores, where Spark's starts
# and the copies take two to three times as long. Its own waits end first, with their reasons.
@pytest.mark.timeout(1800)
def test_a_fourth_member_joins_under_traffic_and_its_backfill_survives_sigkill(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
    kafka_distribution: KafkaDistribution,
    kafka_run_root: Path,
    tmp_path: Path,
) -> None:
    began = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        """Printed as it happens: pytest shows a failed test's output, and a run that
        fails or times out later still says how far it got and when."""
        phases[name] = round(time.monotonic() - began, 1)
        print(f"phase at {phases[name]} s: {name}", flush=True)

    with LocalKafkaFleet(
        ["kafka-4"], run_root=kafka_run_root, distribution=kafka_distribution
    ) as fleet:
        m4_servers = fleet["kafka-4"].bootstrap_servers
        create_topic(m4_servers, source_topic, PARTITIONS)
        # Few applied entries kept: the ordering logs are trimmed before m4 joins, so a
        # backfill point below what they still hold would leave m4 stuck for good.
        group = sidecar_group(
            "join", bootstrap, source_topic, ordering={"tickMs": 20, "retainedApplied": 25}
        )
        global_topic, watch = start_watched(group, bootstrap, source_topic)
        first_members = list(bootstrap)
        urls = [group.members[m].http for m in first_members]
        history = Traffic(bootstrap, source_topic, count_per_origin=HISTORY).start()
        produced = history.join()
        wait_for(
            "the history to be ordered everywhere",
            lambda: all(watch.count(m) >= len(bootstrap) * HISTORY for m in first_members),
            180,
            lambda: brief_status(group),
        )
        log_topic = naming.log_topic(group.group)
        wait_for(
            "every member to trim its ordering log",
            lambda: all(_low(bootstrap[m], log_topic) > 0 for m in first_members),
            90,
            lambda: brief_status(group),
        )
        phase("history ordered and logs trimmed")
        traffic = Traffic(bootstrap, source_topic, RATE).start()
        everyone = {**bootstrap, "m4": m4_servers}
        late: Traffic | None = None
        pauses: dict[str, float] = {}
        try:
            new = group.add_data_member("m4", m4_servers)
            pause_watch = _PauseWatch(group, first_members)
            # 1. Killed mid-copy: as soon as a first transaction of the copy committed
            # into m4's T-global (a transaction is 5,000 records; the history 30,000).
            first = _members_add(urls, new)
            first_lines = _Lines(first)
            with _CommittedEnd(m4_servers, global_topic) as committed:
                wait_for(
                    "the backfill to commit into m4's T-global",
                    lambda: committed.now() > 0 or first.poll() is not None,
                    600,
                    lambda: first_lines.text,
                    interval=0.02,
                )
                assert first.poll() is None, (
                    f"the backfill ended before it was cut:\n{first_lines.text}"
                )
                os.killpg(first.pid, signal.SIGKILL)
                first.wait(30)
                committed_at_kill = committed.now()
            phase("first backfill killed")
            assert first.returncode == -signal.SIGKILL, first_lines.text
            assert 0 < committed_at_kill < len(bootstrap) * HISTORY, "the copy was not cut"
            assert group.status("m4") is None, "m4's sidecar must not run before its backfill"
            # Started now, half copied, it refuses to run (the backfill's marker).
            group.start_member("m4")
            process = group.members["m4"].process
            assert process is not None
            wait_for("m4's sidecar to refuse", lambda: process.poll() is not None, 60)
            assert process.returncode == 2
            assert "being seeded by a backfill" in group.members["m4"].log_path.read_text()

            # 2. Run again: it resumes, seeds m4, and waits for its sidecar to vote.
            second = _members_add(urls, new)
            lines = _Lines(second)
            wait_for(
                "the backfill to finish",
                lambda: lines.has("Start m4's sidecar now") or second.poll() is not None,
                900,
                lambda: lines.text,
            )
            assert lines.has("Start m4's sidecar now"), lines.text
            phase("second backfill done")
            # It went on after what the killed run had committed (records, not offsets).
            found = [re.search(r"\((\d+) were there\)", line) for line in lines.lines]
            there = [int(m.group(1)) for m in found if m is not None]
            assert there and there[0] > 0, lines.text
            group.start_member("m4")
            catch_up = _CatchUp(group, lines)
            wait_for("m4 to vote", lambda: second.poll() is not None, 600, catch_up.describe)
            caught_up = catch_up.rates()
            phase("m4 votes")
            pauses["m4 joins (learner, backfill killed and resumed, voter)"] = pause_watch.stop()
            # The command gave up waiting: where each member stood says why.
            assert second.returncode == 0, catch_up.describe()
            assert lines.has("m4 votes now"), lines.text

            # The command returns once the leader committed the promotion; each member
            # (m4 too) holds it once the next Append reaches it.
            def configurations() -> dict[str, Any]:
                return {m: (group.status(m) or {}).get("configuration") for m in everyone}

            wait_for(
                "every member to count m4 as a voter",
                lambda: all(
                    sorted((c or {}).get("voters", [])) == sorted(everyone)
                    for c in configurations().values()
                ),
                60,
                lambda: json.dumps(configurations()),
            )

            # 3. The new region's own events reach everyone; everyone goes on ordering.
            late = Traffic({"m4": m4_servers}, source_topic, RATE).start()
            # Committed offsets, not records read: the checker below reads every record
            # anyway, and reading them all twice took minutes on a loaded machine. A
            # transaction holds a record or more and its marker one offset, so 2 * GROWTH
            # offsets hold GROWTH records or more.
            with contextlib.ExitStack() as stack:
                ends = {
                    m: stack.enter_context(_CommittedEnd(everyone[m], global_topic))
                    for m in everyone
                }
                start = {m: end.now() for m, end in ends.items()}
                wait_for(
                    "all four members to go on ordering",
                    lambda: all(ends[m].now() >= start[m] + 2 * GROWTH for m in everyone),
                    120,
                    lambda: brief_status(group),
                )
            phase("all four order")
        finally:
            running = traffic.stop()
            if late is not None:
                running["m4"] = late.stop()["m4"]
        watch.close()
        totals = {m: produced.get(m, 0) + running.get(m, 0) for m in everyone}
        verify_group(group, everyone, source_topic, global_topic, totals, replicas=list(everyone))
        phase("checked by the independent checker")

        report_path = tmp_path / "audit.json"
        status = audit_main(["--config", str(new.config_path), "--report", str(report_path)])
        report = json.loads(report_path.read_text())
        assert status == 0, report["violations"]
        assert sorted(report["membership"]["checked"]) == sorted(everyone), report["membership"]
        assert report["checked"]["events"] >= sum(totals.values()), report["checked"]
        phase("audited")
        print("\n--- killed run:\n" + first_lines.text + "\n--- second run:\n" + lines.text)
        print(f"test phases (s since the test began): {json.dumps(phases)}")
        print(f"m4's catch-up until it voted: {caught_up}")
        (tmp_path / "join-pauses.json").write_text(json.dumps(pauses))
        print(f"longest gap in delivery at the first three members: {json.dumps(pauses)}")


class _PauseWatch:
    """The longest time any of ``members`` delivered nothing into its T-global (its
    ``eventsOut``, sampled about every 0.05 s by a thread) between start and stop."""

    def __init__(self, group: LocalSidecarGroup, members: Sequence[str]) -> None:
        self._group = group
        self._members = members
        self._stop = threading.Event()
        self.longest = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _delivered(self, member: str) -> int:
        return int((self._group.status(member) or {}).get("eventsOut", 0))

    def _run(self) -> None:
        last = {m: (time.monotonic(), self._delivered(m)) for m in self._members}
        while not self._stop.wait(0.05):  # the sampling interval, not synchronisation
            for m in self._members:
                now, count = time.monotonic(), self._delivered(m)
                at, before = last[m]
                self.longest = max(self.longest, now - at)
                if count > before:
                    last[m] = (now, count)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(10)
        return self.longest
