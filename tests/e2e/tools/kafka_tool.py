"""Kafka chores of the e2e tests, run INSIDE the cluster (the brokers are pods).

The tests mount this file from a ConfigMap into a pod of the sidecar image (which has
confluent-kafka and kdsync.verification) and read its one line of JSON output:

    python kafka_tool.py topic --bootstrap kafka-one:9092 --topic events --partitions 3
    python kafka_tool.py produce --bootstrap kafka-one:9092 --origin one --topic events \
        --events 2000 --rate 200 [--first 0]
    python kafka_tool.py check --member one=kafka-one:9092 --member two=kafka-two:9092 \
        --topic events --expect 4000 --timeout 300
    python kafka_tool.py inject-redelivery --bootstrap kafka-one:9092 --topic events-global
    python kafka_tool.py count --bootstrap kafka-one:9092 --topic events-global
    python kafka_tool.py watch --bootstrap kafka-one:9092 --topic events-global \
        --expect 8000 --timeout 600

``check`` waits until every member's ``T-global`` holds ``--expect`` events, then runs the
independent checker (kdsync.verification.replica_check): agreement, gap-free sequence,
exactly once, origin order and fidelity against the origin topics.

``remove-by-hand`` takes a member out of the group the way someone with the group CA
would without the operator: as the operator, over the members' admin listeners (the
operator's certificate, issued by the test from the group's CA Secret, comes as base64
PEM arguments), on whoever leads:

    python kafka_tool.py remove-by-hand --group demo --member one=HOST:8443 ... \
        --ca B64 --cert B64 --key B64 --remove arbiter --timeout 120

``watch`` reads a ``T-global`` from its end as a read_committed consumer until
``--expect`` more events have arrived, and reports the longest time between two arrivals:
how long that member delivered nothing while traffic ran (a membership change's pause).
It prints ``{"watching": ...}`` once positioned, so a test starts the traffic after it.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import itertools
import json
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kdsync.admin_client import AdminClient as MemberAdminClient
from kdsync.admin_client import AdminUnreachable
from kdsync.verification.replica_check import TopicFollower, check_group, global_order


def emit(result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)


def make_event(origin: str, i: int, rng: random.Random) -> dict[str, Any]:
    """Keyed and unkeyed records, tombstones, binary values and headers (some empty)."""
    kind = i % 10
    key: bytes | None = f"{origin}-customer-{rng.randrange(1000)}".encode()
    value: bytes | None = f'{{"order":{i},"origin":"{origin}"}}'.encode()
    headers: list[tuple[str, bytes | None]] = [("trace-id", rng.randbytes(8))]
    if kind == 3:
        key = None
    elif kind == 5:
        value = None
    elif kind == 7:
        value = rng.randbytes(rng.randrange(1, 4096))
        headers.append(("empty", None))
    return {"key": key, "value": value, "headers": headers}


def topic(args: argparse.Namespace) -> None:
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    futures = admin.create_topics([NewTopic(args.topic, num_partitions=args.partitions)])
    try:
        futures[args.topic].result(timeout=60)
        emit({"created": args.topic})
    except Exception as error:  # an existing topic is fine: reruns of a test
        if "TOPIC_ALREADY_EXISTS" not in str(error):
            raise
        emit({"exists": args.topic})


def produce(args: argparse.Namespace) -> None:
    producer = Producer({"bootstrap.servers": args.bootstrap, "acks": "all", "linger.ms": 5})
    rng = random.Random(f"{args.origin}-{args.first}")
    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    started = time.monotonic()
    for n in range(args.events):
        event = make_event(args.origin, args.first + n, rng)
        while True:
            try:
                producer.produce(args.topic, on_delivery=delivered, **event)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        if args.rate > 0:
            ahead = (n + 1) / args.rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)  # pacing the traffic
    left = producer.flush(120)
    if left or failures:
        emit({"produced": args.events - len(failures) - left, "failures": failures[:5]})
        sys.exit(1)
    emit({"produced": args.events, "seconds": round(time.monotonic() - started, 1)})


def _members(specs: Sequence[str]) -> dict[str, str]:
    return dict(spec.split("=", 1) for spec in specs)


def check(args: argparse.Namespace) -> None:
    members = _members(args.member)
    global_topic = f"{args.topic}{args.suffix}"
    followers = {
        name: TopicFollower(bootstrap, global_topic) for name, bootstrap in members.items()
    }
    deadline = time.monotonic() + args.timeout
    while True:
        for follower in followers.values():
            follower.poll(1.0)
        counts = {name: len(f.records) for name, f in followers.items()}
        if all(count >= args.expect for count in counts.values()):
            break
        if time.monotonic() > deadline:
            emit({"ok": False, "counts": counts, "problems": [f"timed out: {counts}"]})
            sys.exit(1)
    # Anything beyond --expect would show up as a problem: read a little longer.
    for follower in followers.values():
        follower.poll(2.0)
    globals_by_member = {name: global_order(f.records) for name, f in followers.items()}
    origins = {}
    for name, bootstrap in members.items():
        source = TopicFollower(bootstrap, args.topic)
        source.poll(3.0)
        origins[name] = {(p, o): r for p, o, r in source.records}
        source.close()
    for follower in followers.values():
        follower.close()
    result = check_group(args.topic, globals_by_member, origins)
    emit(
        {
            "ok": result.ok and result.events == args.expect,
            "events": result.events,
            "counts": {name: len(rows) for name, rows in globals_by_member.items()},
            "origins": {name: len(rows) for name, rows in origins.items()},
            "problems": result.problems,
        }
    )


def _committed_consumer(bootstrap: str, group_id: str) -> Consumer:
    """A read_committed consumer that commits nothing (partitions are assigned)."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )


def _committed_records(bootstrap: str, name: str) -> list[Any]:
    consumer = _committed_consumer(bootstrap, "kdsync-e2e-tool")
    metadata = consumer.list_topics(name, timeout=30).topics[name]
    consumer.assign([TopicPartition(name, p, 0) for p in metadata.partitions])
    records: list[Any] = []
    idle = time.monotonic() + 3.0
    while time.monotonic() < idle:
        batch = consumer.consume(num_messages=10_000, timeout=0.5)
        if batch:
            records += [m for m in batch if m.error() is None]
            idle = time.monotonic() + 1.0
    consumer.close()
    return records


def count(args: argparse.Namespace) -> None:
    emit({"count": len(_committed_records(args.bootstrap, args.topic))})


def inject_redelivery(args: argparse.Namespace) -> None:
    """Writes an event this T-global already holds once more, under the next sequence
    number: what a sidecar that is not exactly-once would do after a crash. Only this
    member gets it. The audit must report a ``duplicate`` (in an incremental run: an event
    from below what the previous clean run saw replicated)."""
    records = _committed_records(args.bootstrap, args.topic)
    if not records:
        emit({"injected": None, "problem": "the topic is empty"})
        sys.exit(1)

    def seq(message: Any) -> int:
        headers = dict(message.headers() or [])
        return int(headers["kdsync.seq"])

    victim = records[len(records) // 2]
    next_seq = max(seq(m) for m in records) + 1
    headers = [
        (name, str(next_seq).encode() if name == "kdsync.seq" else value)
        for name, value in victim.headers() or []
    ]
    producer = Producer({"bootstrap.servers": args.bootstrap, "acks": "all"})
    producer.produce(
        args.topic,
        key=victim.key(),
        value=victim.value(),
        headers=headers,
        partition=victim.partition(),
        timestamp=victim.timestamp()[1],
    )
    if producer.flush(60):
        emit({"injected": None, "problem": "not delivered"})
        sys.exit(1)
    emit({"injected": next_seq, "copy_of": seq(victim)})


def _partitions(consumer: Consumer, topic: str) -> list[int]:
    """The topic's partitions; none while it does not exist."""
    found = consumer.list_topics(topic, timeout=30).topics.get(topic)
    return [] if found is None or found.error is not None else sorted(found.partitions)


def watch(args: argparse.Namespace) -> None:
    consumer = _committed_consumer(args.bootstrap, "kdsync-e2e-watch")
    partitions = _partitions(consumer, args.topic)
    ends = {}
    for p in partitions:
        _, high = consumer.get_watermark_offsets(TopicPartition(args.topic, p), timeout=30)
        ends[p] = high
    emit({"watching": args.topic, "from": ends})
    deadline = time.monotonic() + args.timeout
    # A sidecar creates its T-global at its first delivery: in a group that has delivered
    # nothing yet, everything the topic will hold is new.
    while not partitions and time.monotonic() < deadline:
        time.sleep(0.2)  # polling for the topic, within the deadline
        partitions = _partitions(consumer, args.topic)
    consumer.assign([TopicPartition(args.topic, p, ends.get(p, 0)) for p in partitions])
    started, started_wall = time.monotonic(), time.time()
    arrivals: list[float] = []
    while len(arrivals) < args.expect and time.monotonic() < deadline:
        batch = consumer.consume(num_messages=10_000, timeout=0.1)
        now = time.monotonic() - started
        arrivals += [now for m in batch if m.error() is None]
    consumer.close()
    gaps = [(b - a, a) for a, b in itertools.pairwise(arrivals)]
    longest, at = max(gaps, default=(0.0, 0.0))
    emit(
        {
            "events": len(arrivals),
            "longest_gap_s": round(longest, 2),
            "gap_began_s": round(at, 1),  # since the watch began to read
            # On the node's clock, to set beside the pods' and events' times.
            "gap_began_at": datetime.datetime.fromtimestamp(
                started_wall + at, datetime.UTC
            ).isoformat(),
            "first_s": round(arrivals[0], 1) if arrivals else None,
            "last_s": round(arrivals[-1], 1) if arrivals else None,
        }
    )
    if len(arrivals) < args.expect:
        sys.exit(1)  # delivery stopped: the test fails with this line


def remove_by_hand(args: argparse.Namespace) -> None:
    """POST {"remove": NAME} to the leader's admin listener until it is taken, then wait
    until the leader's configuration in force no longer has it. Asks again, within the
    deadline, when no member leads yet, a change is settling (409) or a request got no
    answer (it may have been taken: a later 404, no such member, then means it was)."""
    addresses = dict(item.split("=", 1) for item in args.member)
    pems = [base64.b64decode(value) for value in (args.ca, args.cert, args.key)]
    deadline = time.monotonic() + args.timeout
    last: dict[str, Any] = {}
    asked = False
    with MemberAdminClient(*pems, args.group) as client:

        def leader_status() -> tuple[str, dict[str, Any]] | None:
            nonlocal last
            for member, address in addresses.items():
                try:
                    code, status = client.get_json(address, "/status", member, 10)
                except AdminUnreachable as exc:
                    last = {"unreachable": member, "error": str(exc)}
                    continue
                if code == 200 and status.get("role") == "leader":
                    return member, status
            return None

        while time.monotonic() < deadline:
            found = leader_status()
            if found is not None:
                leader, status = found
                config = status.get("configuration") or {}
                members = [*config.get("voters", []), *config.get("learners", [])]
                if asked and args.remove not in members and config.get("committed"):
                    emit({"taken": True, "leader": leader, "configuration": config, **last})
                    return
                if not asked or args.remove in members:
                    try:
                        code, answer = client.post_json(
                            addresses[leader], "/membership", leader, {"remove": args.remove}, 10
                        )
                    except AdminUnreachable as exc:
                        asked, last = True, {"leader": leader, "error": str(exc)}
                    else:
                        last = {"leader": leader, "status": code, "answer": answer}
                        if code == 200 or (code == 404 and asked):
                            asked = True  # taken now, or by an earlier request
                        elif code != 409:
                            break  # refused for good: the test fails with this answer
            time.sleep(0.5)  # asking again, within the deadline
    emit({"taken": False, **last})
    sys.exit(1)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("topic")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", type=int, default=3)
    p.set_defaults(run=topic)
    p = commands.add_parser("produce")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--origin", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--events", type=int, required=True)
    p.add_argument("--rate", type=float, default=0.0, help="events/s; 0: as fast as possible")
    p.add_argument("--first", type=int, default=0, help="number of the first event")
    p.set_defaults(run=produce)
    p = commands.add_parser("check")
    p.add_argument("--member", action="append", required=True, metavar="NAME=BOOTSTRAP")
    p.add_argument("--topic", required=True)
    p.add_argument("--suffix", default="-global")
    p.add_argument("--expect", type=int, required=True)
    p.add_argument("--timeout", type=float, default=300.0)
    p.set_defaults(run=check)
    p = commands.add_parser("count")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.set_defaults(run=count)
    p = commands.add_parser("inject-redelivery")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.set_defaults(run=inject_redelivery)
    p = commands.add_parser("watch")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--expect", type=int, required=True)
    p.add_argument("--timeout", type=float, default=600.0)
    p.set_defaults(run=watch)
    p = commands.add_parser("remove-by-hand")
    p.add_argument("--group", required=True)
    p.add_argument("--member", action="append", required=True, metavar="NAME=HOST:PORT")
    p.add_argument("--ca", required=True, help="the group CA certificate, PEM in base64")
    p.add_argument("--cert", required=True, help="the operator's certificate, PEM in base64")
    p.add_argument("--key", required=True, help="the operator's key, PEM in base64")
    p.add_argument("--remove", required=True)
    p.add_argument("--timeout", type=float, default=120.0)
    p.set_defaults(run=remove_by_hand)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
