"""Benchmark of the consistency audit: N events replicated across 3 members, audited with
local Spark, compared with a plain confluent-kafka consumer reading the same topics.

Run through ``hack/bench-audit [--events N]`` (default 10 million). The data is written
directly, the way tests do (origin records in each member's T, the same globally ordered
records in every member's T-global, committed source offsets), without transactions so
offsets are dense; the fleet is started for the run and removed afterwards.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import yaml
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kdsync import naming
from kdsync.audit.job import AuditOptions, run_audit
from kdsync.audit.positions import plan_audit
from kdsync.audit.session import audit_session
from kdsync.config import load_config
from kdsync.localkafka import LocalKafkaFleet, find_distribution
from kdsync.localkafka.fleet import default_run_root
from kdsync.record_format import KDSYNC_HEADERS

MEMBERS = ("m1", "m2", "m3")
VALUE = b"v" * 100
# Recent: brokers delete records older than retention.ms by their CreateTime.
NOW_MS = int(time.time() * 1000)
Headers = list[tuple[str, str | bytes | None]]


def say(text: str) -> None:
    print(f"[bench-audit] {text}", file=sys.stderr, flush=True)


def create(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(60)


def producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "batch.num.messages": 100_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "enable.idempotence": True,
        }
    )


def produce_all(p: Producer, topic: str, records: Iterator[tuple[bytes, Headers]]) -> None:
    for key, headers in records:
        while True:
            try:
                p.produce(topic, VALUE, key, partition=0, headers=headers, timestamp=NOW_MS)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(300) != 0:
        raise RuntimeError(f"could not deliver every record to {topic}")


def origin_records(member: int, count: int) -> Iterator[tuple[bytes, Headers]]:
    for offset in range(count):
        yield f"{member}-{offset}".encode(), [("trace", b"t")]


def global_records(topic: str, events: int) -> Iterator[tuple[bytes, Headers]]:
    names = KDSYNC_HEADERS
    encoded_topic = topic.encode()
    origins = [m.encode() for m in MEMBERS]
    for seq in range(events):
        member, offset = seq % 3, seq // 3
        yield (
            f"{member}-{offset}".encode(),
            [
                ("trace", b"t"),
                (names[0], str(seq).encode()),
                (names[1], origins[member]),
                (names[2], encoded_topic),
                (names[3], b"0"),
                (names[4], str(offset).encode()),
            ],
        )


def write_group(fleet: LocalKafkaFleet, events: int, workdir: Path) -> Path:
    bootstrap = dict(zip(MEMBERS, fleet.bootstrap_servers().values(), strict=True))
    topic = f"bench-{uuid.uuid4().hex[:6]}"
    group = f"bench{uuid.uuid4().hex[:6]}"
    counts = [len(range(i, events, 3)) for i in range(3)]
    started = time.monotonic()
    for i, member in enumerate(MEMBERS):
        create(bootstrap[member], topic)
        create(bootstrap[member], naming.global_topic(topic))
        produce_all(producer(bootstrap[member]), topic, origin_records(i, counts[i]))
        consumer = Consumer(
            {"bootstrap.servers": bootstrap[member], "group.id": naming.consumer_group(group)}
        )
        consumer.commit(offsets=[TopicPartition(topic, 0, counts[i])], asynchronous=False)
        consumer.close()
    for member in MEMBERS:
        produce_all(
            producer(bootstrap[member]), naming.global_topic(topic), global_records(topic, events)
        )
    seconds = time.monotonic() - started
    say(f"wrote {4 * events:,} records in {seconds:.0f}s ({4 * events / seconds:,.0f}/s)")
    config = workdir / f"{group}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "group": group,
                "member": MEMBERS[0],
                "insecure": True,
                "members": [
                    {
                        "name": m,
                        "peer": f"127.0.0.1:{7400 + i}",
                        "kafka": {"bootstrapServers": bootstrap[m]},
                    }
                    for i, m in enumerate(MEMBERS)
                ],
                "topics": {"names": [topic]},
            }
        )
    )
    return config


def plain_read(bootstrap: str, topic: str) -> int:
    """Read ``topic`` end to end with one confluent-kafka consumer; return records read."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-read-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
        }
    )
    _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    consumer.assign([TopicPartition(topic, 0, 0)])
    read = 0
    try:
        while True:
            batch = consumer.consume(10_000, timeout=1.0)
            for message in batch:
                error = message.error()
                if error is None:
                    read += 1
                    message.headers()  # a reader of T-global looks at the headers
                elif error.code() == KafkaError._PARTITION_EOF and (message.offset() or 0) >= end:
                    return read
    finally:
        consumer.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hack/bench-audit")
    parser.add_argument(
        "--events", type=int, default=10_000_000, help="global events (default 10M)"
    )
    parser.add_argument("--driver-memory", default="10g")
    args = parser.parse_args(argv)
    # The audit logs how long each of its Spark phases took.
    logging.basicConfig(level=logging.WARNING, format="[bench-audit] %(message)s")
    logging.getLogger("kdsync.audit").setLevel(logging.INFO)
    workdir = default_run_root().parent / "bench-audit"
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"starting 3 local Kafka clusters; {args.events:,} events, {4 * args.events:,} records")
    with LocalKafkaFleet(
        MEMBERS, run_root=default_run_root(), distribution=find_distribution()
    ) as fleet:
        config_path = write_group(fleet, args.events, workdir)
        config = load_config(config_path, check_files=False)
        plan = plan_audit(config, None)

        started = time.monotonic()
        plain = 0
        for topic_plan in plan.topics:
            for rng in (*topic_plan.globals, *topic_plan.origins):
                plain += plain_read(rng.bootstrap, rng.topic)
        plain_seconds = time.monotonic() - started
        say(f"plain consumer: {plain:,} records in {plain_seconds:.1f}s")

        spark = audit_session(
            "local[2]",
            {"spark.sql.shuffle.partitions": "64", "spark.driver.memory": args.driver_memory},
        )
        started = time.monotonic()
        outcome = run_audit(spark, plan, None, AuditOptions(min_partitions=8))
        audit_seconds = time.monotonic() - started
        spark.stop()
    report = outcome.report
    records = 4 * args.events
    audit_rate = records / audit_seconds
    plain_rate = plain / plain_seconds
    print(report.summary)
    print(
        f"events audited:        {report.checked.events:,} global events, {records:,} records read"
    )
    events_rate = args.events / audit_seconds
    print(
        f"audit:                 {audit_seconds:,.1f}s  {events_rate:,.0f} events/s  "
        f"{audit_rate:,.0f} records/s"
    )
    print(
        f"plain consumer:        {plain_seconds:,.1f}s  {plain_rate:,.0f} records/s "
        "(one confluent-kafka consumer, topics read one after another)"
    )
    print(f"ratio audit/consumer:  {audit_rate / plain_rate:.2f}")
    return 0 if report.passed and plain == records else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
