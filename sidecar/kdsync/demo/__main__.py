"""``hack/demo``: kdsync's main job on this machine, start to finish.

Starts three local Kafka clusters and a sidecar for each, writes concurrent traffic into
all three origins, waits until every ``T-global`` has it, then checks with an
independent reader that the three ``T-global`` topics hold the same events in the same
order, each exactly once, in origin order and unchanged — and prints throughput and
replication latency. Finally the Spark audit runs over the same topics. Ctrl-C stops
everything and cleans up.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kdsync.audit.in_process import AuditUnavailable, audit_to_report
from kdsync.config import OrderingConfig
from kdsync.local_group import LocalSidecarGroup
from kdsync.localkafka import LocalKafkaFleet
from kdsync.verification.replica_check import (
    GlobalRecord,
    SourceRecord,
    TopicFollower,
    check_group,
    global_order,
)

MEMBERS = ("us-east", "eu-west", "ap-south")
TOPIC = "orders"
STALL_SECONDS = 180  # no new deliveries for this long: the group is stuck
DEFAULT_TICK_MS: int = OrderingConfig.model_fields["tick_ms"].default


def say(text: str) -> None:
    print(text, flush=True)


def create_source_topic(bootstrap: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(TOPIC, num_partitions=partitions)])
    futures[TOPIC].result(timeout=30)


def make_event(origin: str, i: int, rng: random.Random) -> dict[str, Any]:
    """A mix of what real topics hold: keyed, unkeyed, tombstones, headers, binary."""
    kind = i % 10
    key: bytes | None = f"{origin}-customer-{rng.randrange(1000)}".encode()
    value: bytes | None = (
        f'{{"order":{i},"origin":"{origin}","amount":{rng.random():.4f}}}'.encode()
    )
    headers: list[tuple[str, bytes | None]] = [("trace-id", rng.randbytes(8))]
    if kind == 3:
        key = None
    elif kind == 5:
        value = None  # a tombstone
    elif kind == 7:
        value = rng.randbytes(rng.randrange(1, 4096))
        headers.append(("content-type", b"application/octet-stream"))
        headers.append(("empty", None))
    return {"key": key, "value": value, "headers": headers, "partition": i % 3}


def produce(bootstrap: str, origin: str, count: int, rate: float, done: list[int]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    rng = random.Random(origin)
    started = time.monotonic()
    for i in range(count):
        event = make_event(origin, i, rng)
        while True:
            try:
                producer.produce(TOPIC, **event)
                break
            except BufferError:
                producer.poll(0.05)
        done[0] = i + 1
        if rate > 0:
            ahead = (i + 1) / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)  # pacing the traffic, not synchronisation
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(60)


def wait_for(
    what: str,
    condition: Callable[[], bool],
    timeout: float,
    progress: Callable[[], str],
    moving: Callable[[], object] | None = None,
) -> None:
    """Wait until ``condition``; fail after ``timeout`` seconds, or, given ``moving``,
    after ``timeout`` seconds in which its value did not change: a slow machine still
    finishes, a stuck group still fails."""
    deadline = time.monotonic() + timeout
    last_line = 0.0
    seen = moving() if moving is not None else None
    while not condition():
        now = time.monotonic()
        if moving is not None and (current := moving()) != seen:
            seen = current
            deadline = now + timeout
        if now > deadline:
            if moving is not None:
                raise TimeoutError(f"no progress for {timeout:.0f}s while waiting for {what}")
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        if now - last_line >= 1.0:
            say(f"  {progress()}")
            last_line = now
        time.sleep(0.1)  # polling interval of a condition with a deadline


def delivered_counts(group: LocalSidecarGroup) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in group.members:
        status = group.status(name)
        counts[name] = int(status.get("eventsOut", 0)) if status else -1
    return counts


def read_all(
    servers: Mapping[str, str],
) -> tuple[dict[str, list[GlobalRecord]], dict[str, dict[tuple[int, int], SourceRecord]]]:
    globals_by_member: dict[str, list[GlobalRecord]] = {}
    origins: dict[str, dict[tuple[int, int], SourceRecord]] = {}
    for name, bootstrap in servers.items():
        follower = TopicFollower(bootstrap, f"{TOPIC}-global")
        follower.read_to_end(120)
        follower.close()
        globals_by_member[name] = global_order(follower.records)
        source = TopicFollower(bootstrap, TOPIC)
        source.read_to_end(120)
        source.close()
        origins[name] = {(p, o): r for p, o, r in source.records}
    return globals_by_member, origins


def run_audit(config: Path, run_dir: Path) -> bool | None:
    report = run_dir / "audit-report.json"
    try:
        code = audit_to_report(config, report)
    except AuditUnavailable:
        say("  (the Spark audit is not available in this build)")
        return None
    say(f"  JSON report: {report}")
    return code == 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/demo", description=__doc__)
    parser.add_argument("--events", type=int, default=20_000, help="events per origin")
    parser.add_argument(
        "--rate", type=float, default=0, help="events/s per origin (default: as fast as possible)"
    )
    parser.add_argument("--partitions", type=int, default=3, help="source partitions")
    parser.add_argument("--no-audit", action="store_true", help="skip the Spark audit")
    args = parser.parse_args(argv)

    run_dir = Path(tempfile.mkdtemp(prefix="kdsync-demo-"))
    say(f"kdsync demo: 3 Kafka clusters, 3 sidecars, {args.events:,} events per origin")
    say(f"  work folder {run_dir}")
    started = time.monotonic()
    try:
        say("[1/5] starting 3 local Kafka clusters (single-node KRaft, Kafka from Maven)")
        with LocalKafkaFleet(list(MEMBERS)) as fleet:
            servers = fleet.bootstrap_servers()
            for name in MEMBERS:
                create_source_topic(servers[name], args.partitions)
                say(f"  {name}: {servers[name]}, topic {TOPIC} ({args.partitions} partitions)")
            say("[2/5] starting a sidecar per cluster (mutual TLS between them)")
            # The product's timing (a 1 s election timeout), not local mode's faster ticks
            # for tests (0.4 s): under a burst on a busy machine those cost needless elections.
            with LocalSidecarGroup(
                "demo",
                servers,
                run_dir / "group",
                topics={"names": [TOPIC]},
                ordering={"tickMs": DEFAULT_TICK_MS},
            ) as group:
                group.start()
                statuses = group.wait_until(
                    "the group to elect a leader and be ready",
                    lambda s: s.get("ready") is True,
                    120,
                )
                leader = next(iter(statuses.values())).get("leader")
                say(f"  ready; leader {leader}; logs in {group.run_dir}")
                return _traffic_and_check(args, group, servers, run_dir, started)
    except KeyboardInterrupt:
        say("\ninterrupted: stopping sidecars and brokers")
        return 130
    except TimeoutError as exc:
        say(f"FAILED: {exc}")
        return 1


def _traffic_and_check(
    args: argparse.Namespace,
    group: LocalSidecarGroup,
    servers: Mapping[str, str],
    run_dir: Path,
    started: float,
) -> int:
    total = args.events * len(MEMBERS)
    say(f"[3/5] producing {total:,} events concurrently into all three origins")
    produced = {name: [0] for name in MEMBERS}
    threads = [
        threading.Thread(
            target=produce, args=(servers[name], name, args.events, args.rate, produced[name])
        )
        for name in MEMBERS
    ]
    traffic_start = time.time()
    for thread in threads:
        thread.start()

    def progress() -> str:
        made = sum(p[0] for p in produced.values())
        counts = delivered_counts(group)
        shown = ", ".join(f"{n} {c:,}" for n, c in counts.items())
        return f"produced {made:,}/{total:,}; in T-global: {shown}"

    terms_before = {n: (group.status(n) or {}).get("term", 0) for n in MEMBERS}
    wait_for(
        "the producers to finish",
        lambda: not any(thread.is_alive() for thread in threads),
        max(600, total / 500),
        progress,
    )
    produced_at = time.time()
    # A group that keeps delivering is waited for however slow the machine is; one that
    # delivers nothing for STALL_SECONDS is stuck, and the demo says so.
    counts: dict[str, int] = dict(delivered_counts(group))
    answered = [c for c in counts.values() if c >= 0]  # -1: no /status answer
    spread_at_stop = max(answered) - min(answered) if answered else 0
    complete_after: dict[str, float] = {}  # member -> seconds after the producers stopped

    def delivered_all() -> bool:
        counts.update(delivered_counts(group))
        for name, count in counts.items():
            if count >= total:
                complete_after.setdefault(name, time.time() - produced_at)
        return all(c >= total for c in counts.values())

    wait_for(
        "all events in every T-global",
        delivered_all,
        STALL_SECONDS,
        progress,
        moving=lambda: tuple(sorted(counts.items())),
    )
    elapsed = time.time() - traffic_start
    caught_up = time.time() - produced_at
    say(f"  {progress()}")

    say("[4/5] checking the three T-global topics with an independent plain-Kafka reader")
    globals_by_member, origins = read_all(servers)
    result = check_group(TOPIC, globals_by_member, origins)
    sizes = ", ".join(f"{n} {len(r):,}" for n, r in globals_by_member.items())
    say(f"  events per T-global: {sizes}")
    if result.ok:
        say("  identical order in all three, every origin event exactly once, origin order")
        say("  kept, keys/values/headers/timestamps unchanged: PASS")
    else:
        say("  FAIL:")
        for problem in result.problems:
            say(f"    {problem}")
    say("  figures:")
    say(f"    throughput: {total:,} events in {elapsed:.1f}s = {total / elapsed:,.0f} events/s")
    say(f"    every T-global complete {caught_up:.1f}s after the producers finished")
    each = ", ".join(f"{n} {complete_after.get(n, caught_up):.1f}s" for n in MEMBERS)
    say(
        f"    members apart when the producers finished: {spread_at_stop:,} events; "
        f"each complete after: {each}"
    )
    statuses = {n: group.status(n) or {} for n in MEMBERS}
    terms = {n: statuses[n].get("term", 0) for n in MEMBERS}
    elections = max(terms.values()) - max(terms_before.values())
    stalls = ", ".join(f"{n} {statuses[n].get('maxEventLoopLagSeconds', 0):.2f}s" for n in MEMBERS)
    say(f"    elections during traffic: {elections} (term {max(terms.values())})")
    say(f"    longest event-loop stall: {stalls}")
    for name in MEMBERS:
        status = group.status(name) or {}
        latency = status.get("latencyMs") or {}
        p50, p99 = latency.get("p50"), latency.get("p99")
        if p50 is not None and p99 is not None:
            say(
                f"    replication latency into {name}'s T-global: p50 {p50:.0f} ms, "
                f"p99 {p99:.0f} ms ({status.get('role')}, {status.get('transactions')} txns)"
            )
    audit_ok: bool | None = None
    if not args.no_audit:
        say("[5/5] Spark audit (kdsync audit) over every member's T-global and T")
        audit_ok = run_audit(group.members[MEMBERS[0]].config_path, run_dir)
    passed = result.ok and audit_ok is not False
    say(f"done in {time.monotonic() - started:.0f}s: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
