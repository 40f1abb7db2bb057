"""Exact consumer failover with ``kdsync failover`` against real brokers (issue #15).

Consumer groups read part of ``T-global`` in member A (m1) and commit, traffic goes on,
a sidecar is SIGKILLed, and ``kdsync failover apply`` moves each group to member B (m2),
where it reads on. What it reads in A followed by what it reads in B must be every event
exactly once, in order: the global order with ``globalPartitions`` 1, each partition's
order with 3. The consumers here are plain confluent-kafka consumers, as a user's are.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from kdsync.local_group import LocalSidecarGroup
from kdsync.verification.replica_check import TopicFollower, global_order
from tests.integration.sidecar.harness import Traffic, start_watched, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

FIRST_EVENTS = 150  # per origin, before the groups read in A
MORE_EVENTS = 100  # per origin, while the groups fail over

Read = tuple[int, int]  # (T-global partition, kdsync.seq)


def _seq(headers: Sequence[tuple[str, bytes | None]] | None) -> int:
    # kdsync's headers are the last five; kdsync.seq is the first of them.
    name, value = list(headers or [])[-5]
    assert name == "kdsync.seq" and value is not None
    return int(value)


def _consumer(servers: str, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
        }
    )


def read_and_commit(
    servers: str, topic: str, group: str, count: int, commit: bool = True
) -> list[Read]:
    """Read ``count`` records of ``topic`` as consumer group ``group``, commit, leave."""
    consumer = _consumer(servers, group)
    consumer.subscribe([topic])
    reads: list[Read] = []
    deadline = time.monotonic() + 90
    try:
        while len(reads) < count:
            assert time.monotonic() < deadline, f"{group} read {len(reads)} of {count}"
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            reads.append((message.partition() or 0, _seq(message.headers())))
        if commit and reads:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return reads


def failover(config: Path, *args: str) -> tuple[int, dict[str, Any] | None, str]:
    """Run ``kdsync failover ... --json``; (exit code, parsed output, stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "kdsync.cli", "failover", *args, "--config", str(config), "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    parsed = json.loads(done.stdout) if done.stdout.strip() else None
    return done.returncode, parsed, done.stderr


def committed_in(servers: str, group: str, topic: str, partitions: int) -> list[int]:
    consumer = _consumer(servers, group)
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 30)
        return [tp.offset for tp in found]
    finally:
        consumer.close()


def check_exactly_once(
    name: str, in_a: list[Read], in_b: list[Read], every: Mapping[int, list[int]], total: int
) -> None:
    """``in_a`` then ``in_b`` is each partition's sequence, whole, once, in order."""
    seqs = sorted(seq for _, seq in in_a + in_b)
    assert seqs == list(range(total)), (
        f"{name}: {len(in_a)} read in A + {len(in_b)} in B; duplicates "
        f"{sorted({s for s in seqs if seqs.count(s) > 1})[:10]}, missing "
        f"{sorted(set(range(total)) - set(seqs))[:10]}"
    )
    for partition, expected in every.items():
        got = [s for p, s in in_a if p == partition] + [s for p, s in in_b if p == partition]
        assert got == expected, f"{name}: partition {partition} out of order"
    if len(every) == 1:
        assert [s for _, s in in_a + in_b] == list(range(total)), f"{name}: global order"


def by_partition(servers: str, topic: str) -> dict[int, list[int]]:
    follower = TopicFollower(servers, topic)
    try:
        follower.read_to_end(60)
        rows = global_order(follower.records)
    finally:
        follower.close()
    out: dict[int, list[int]] = {}
    for row in rows:
        out.setdefault(row.partition, []).append(row.seq)
    return out


@pytest.mark.parametrize(("global_partitions", "killed"), [(1, "m1"), (3, "m2")])
def test_consumer_groups_fail_over_exactly(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
    global_partitions: int,
    killed: str,
) -> None:
    """Several groups at different positions (one at the very end) move from m1 to m2
    right after a sidecar is SIGKILLed (the source's with 1 partition, the target's with
    3) and read on: every event exactly once, in order."""
    group = sidecar_group("failover", bootstrap, source_topic, global_partitions=global_partitions)
    global_topic, watch = start_watched(group, bootstrap, source_topic)
    try:
        config = group.members["m1"].config_path
        a, b = bootstrap["m1"], bootstrap["m2"]
        first = Traffic(bootstrap, source_topic, count_per_origin=FIRST_EVENTS, rate_per_origin=300)
        first_total = sum(first.start().join().values())
        wait_for(
            f"{first_total} events in m1's {global_topic}",
            lambda: watch.count("m1") >= first_total,
            120,
        )

        positions = {"early": 17, "middle": first_total // 2, "end": first_total}
        groups = {name: f"consumers-{name}-{group.group}" for name in positions}
        in_a = {
            name: read_and_commit(a, global_topic, groups[name], count)
            for name, count in positions.items()
        }

        more = Traffic(bootstrap, source_topic, count_per_origin=MORE_EVENTS, rate_per_origin=60)
        more.start()
        figures: dict[str, Any] = {}
        try:
            wait_for("traffic to flow again", lambda: watch.count("m1") >= first_total + 30, 60)
            group.kill(killed)
            if killed == "m2":
                group.start_member("m2")  # B recovers while the tool waits for it

            if global_partitions == 1:
                # A consumer of the group is active in B: apply refuses and writes nothing.
                squatter = _consumer(b, groups["middle"])
                squatter.subscribe([global_topic])
                try:
                    wait_for(
                        "the squatter to join",
                        lambda: bool(squatter.poll(0.2) or squatter.assignment()),
                        60,
                    )
                    code, _, err = failover(
                        config, "apply", "--group", groups["middle"], "--from", "m1", "--to", "m2"
                    )
                    assert code == 1, err
                    assert "active member" in err and "nothing was written" in err, err
                finally:
                    squatter.close()
                assert committed_in(b, groups["middle"], global_topic, 1) == [-1001]

            for name in positions:
                started = time.monotonic()
                code, table, err = failover(
                    config,
                    "translate",
                    "--group",
                    groups[name],
                    "--from",
                    "m1",
                    "--to",
                    "m2",
                    "--wait",
                    "120",
                )
                figures[f"translate {name}"] = round(time.monotonic() - started, 2)
                assert code == 0, err
                assert table is not None
                # A partition the group never committed in A stays without an offset in B
                # too: the consumer's auto.offset.reset decides there, as it would in A.
                outcomes = [p["outcome"] for p in table["partitions"]]
                assert set(outcomes) <= {"exact", "no offset"} and "exact" in outcomes, table
                started = time.monotonic()
                code, applied, err = failover(
                    config,
                    "apply",
                    "--group",
                    groups[name],
                    "--from",
                    "m1",
                    "--to",
                    "m2",
                    "--wait",
                    "120",
                )
                figures[f"apply {name}"] = round(time.monotonic() - started, 2)
                assert code == 0, err
                assert applied is not None and applied["written"] >= 1, applied
        finally:
            produced = more.join()
        if not group.members[killed].running:
            group.start_member(killed)
        total = first_total + sum(produced.values())
        wait_for(f"{total} events in m2's {global_topic}", lambda: watch.count("m2") >= total, 180)
        every = by_partition(b, global_topic)
        for name in positions:
            in_b = read_and_commit(b, global_topic, groups[name], total - len(in_a[name]))
            check_exactly_once(name, in_a[name], in_b, every, total)
        print(f"\nfailover figures (P={global_partitions}, killed {killed}): {json.dumps(figures)}")
    finally:
        watch.close()
