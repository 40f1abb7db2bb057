"""The backfill copy job against real brokers: a donor's T-global written by hand (kafka-1)
copied into a new member's cluster (kafka-2) by local Spark, then read back committed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence

import pytest
from confluent_kafka import OFFSET_END, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession

from kdsync import naming
from kdsync.audit.positions import TopicRange
from kdsync.audit.reader import read_range as real_read_range
from kdsync.backfill import copy_job
from kdsync.backfill.copy_job import BackfillError, CopyResult, KafkaEndpoint, copy_global_topics
from kdsync.localkafka import LocalKafkaFleet
from kdsync.ordering.events import DeliveredEvent, SourceEvent
from kdsync.record_format import SEQ_HEADER, GlobalRecord, to_global_record
from tests.support.plain_kafka import (
    CommittedRecord,
    Record,
    create_topic,
    produce_transactionally,
    read_committed,
)

pytestmark = pytest.mark.kafka

# (partition, key, value, headers, timestamp): what must be identical in the copy.
Copied = tuple[int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]


def make_events(seqs: Sequence[int], topic: str, origins: int = 2) -> list[DeliveredEvent]:
    """Events with these seqs; keys and values None in places, user headers that include a
    None value and a user header named kdsync.seq; origin partitions in an irregular mix."""
    now_ms = int(time.time() * 1000)  # recent: older records would fall to retention
    events = []
    for i, seq in enumerate(seqs):
        key = None if i % 5 == 2 else f"k{seq}".encode()
        value = None if i % 7 == 3 else f"v{seq}".encode() * (1 + i % 3)
        headers = (("trace", f"t{seq}".encode()), (SEQ_HEADER, b"users-own"), ("empty", None))
        source = SourceEvent(100 + i, key, value, headers, now_ms - 10_000 + i)
        origin_partition = (i * i + i // 4) % origins
        events.append(DeliveredEvent(seq, f"m{1 + i % 3}", "orders", origin_partition, source))
    return events


def global_records(
    events: Sequence[DeliveredEvent], topic: str, partitions: int
) -> list[GlobalRecord]:
    return [to_global_record(event, topic, partitions) for event in events]


def write(bootstrap: str, records: Sequence[GlobalRecord], *, abort: bool = False) -> None:
    produce_transactionally(
        bootstrap,
        records[0].topic,
        [Record(r.key, r.value, tuple(r.headers), r.timestamp_ms, r.partition) for r in records],
        abort=abort,
    )


def expected(records: Sequence[GlobalRecord]) -> list[Copied]:
    """Partition by partition, in seq (= offset) order, as read_committed returns them."""
    ordered = sorted(records, key=lambda r: (r.partition, seq_of_headers(r.headers)))
    return [(r.partition, r.key, r.value, tuple(r.headers), r.timestamp_ms) for r in ordered]


def seq_of_headers(headers: Sequence[tuple[str, bytes | None]]) -> int:
    name, raw = headers[-5]
    assert name == SEQ_HEADER and raw is not None
    return int(raw)


def as_copied(records: Sequence[CommittedRecord]) -> list[Copied]:
    return [(r.partition, r.key, r.value, r.headers, r.timestamp) for r in records]


def seqs_by_partition(records: Sequence[GlobalRecord]) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for r in records:
        found.setdefault(r.partition, []).append(seq_of_headers(r.headers))
    return {p: sorted(seqs) for p, seqs in found.items()}


def trim(bootstrap: str, topic: str, before: dict[int, int | None]) -> None:
    """Delete records as retention would: partition -> delete below the record with this
    seq (None: every record)."""
    offsets = {
        (r.partition, seq_of_headers(r.headers)): r.offset for r in read_committed(bootstrap, topic)
    }
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = [
        TopicPartition(topic, p, OFFSET_END if seq is None else offsets[(p, seq)])
        for p, seq in before.items()
    ]
    for future in admin.delete_records(request).values():
        future.result(timeout=30)


def partition_count(bootstrap: str, topic: str) -> int | None:
    found = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics.get(topic)
    return None if found is None or found.error is not None else len(found.partitions)


@pytest.fixture
def clusters(kafka_fleet: LocalKafkaFleet) -> tuple[str, str]:
    """(donor, target) bootstrap servers."""
    servers = list(kafka_fleet.bootstrap_servers().values())
    return servers[0], servers[1]


@pytest.fixture
def global_topic(fresh_topic: Callable[[str], str]) -> Callable[[], str]:
    return lambda: naming.global_topic(fresh_topic("bf"))


def endpoints(clusters: tuple[str, str]) -> tuple[KafkaEndpoint, KafkaEndpoint]:
    donor, target = clusters
    return (
        KafkaEndpoint("m2", {"bootstrap.servers": donor}),
        KafkaEndpoint("m4", {"bootstrap.servers": target}),
    )


def test_copies_every_record_below_next_seq_and_nothing_else(
    spark: SparkSession,
    clusters: tuple[str, str],
    global_topic: Callable[[], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    donor_servers, target_servers = clusters
    two, one = global_topic(), global_topic()
    create_topic(donor_servers, two, partitions=2)
    create_topic(donor_servers, one)
    records = global_records(make_events(range(40), two), two, 2)
    # Several transactions, and an aborted one (valid-looking records, seqs that would
    # clash) that a read_committed copy never sees.
    write(donor_servers, records[:15])
    write(donor_servers, global_records(make_events(range(15, 20), two), two, 2), abort=True)
    write(donor_servers, records[15:28])
    write(donor_servers, records[28:])
    single = global_records(make_events(range(12), one, origins=1), one, 1)
    write(donor_servers, single)
    # Several commits per partition in this run.
    monkeypatch.setattr(copy_job, "COMMIT_RECORDS", 7)
    donor, target = endpoints(clusters)

    result = copy_global_topics(
        spark, donor, target, {two: 30, one: 12}, f"kdsync-g.m4.backfill-{uuid.uuid4().hex[:6]}"
    )

    assert result == CopyResult(
        copied={two: 30, one: 12}, present={two: 0, one: 0}, first_seq={two: 0, one: 0}
    )
    assert partition_count(target_servers, two) == 2
    assert partition_count(target_servers, one) == 1
    copied = read_committed(target_servers, two)
    assert as_copied(copied) == expected(records[:30])
    assert {seq_of_headers(r.headers) for r in copied} == set(range(30))
    # Commit markers between the records: the run committed several transactions.
    first_partition = [r.offset for r in copied if r.partition == 0]
    assert first_partition[-1] - first_partition[0] > len(first_partition)
    assert as_copied(read_committed(target_servers, one)) == expected(single)


def test_resumes_after_a_crash_without_duplicates_or_gaps(
    spark: SparkSession,
    clusters: tuple[str, str],
    global_topic: Callable[[], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    donor_servers, target_servers = clusters
    topic = global_topic()
    create_topic(donor_servers, topic, partitions=2)
    records = global_records(make_events(range(30), topic), topic, 2)
    write(donor_servers, records[:17])
    write(donor_servers, records[17:])
    monkeypatch.setattr(copy_job, "COMMIT_RECORDS", 4)
    donor, target = endpoints(clusters)
    prefix = f"kdsync-g.m4.backfill-{uuid.uuid4().hex[:6]}"

    first = copy_global_topics(spark, donor, target, {topic: 12}, prefix)
    assert first == CopyResult(copied={topic: 12}, present={topic: 0}, first_seq={topic: 0})

    # The crash: an attempt at partition 0 left a transaction open (the next records,
    # produced, never committed, the producer abandoned but alive); one at partition 1
    # had its transaction aborted.
    later = [r for r in records[12:] if r.partition == 0][:3]
    zombie = Producer(
        {"bootstrap.servers": target_servers, "transactional.id": f"{prefix}.{topic}.0"}
    )
    zombie.init_transactions(30)
    zombie.begin_transaction()
    for r in later:
        zombie.produce(
            topic, key=r.key, value=r.value, partition=0, headers=list(r.headers),
            timestamp=r.timestamp_ms,
        )  # fmt: skip
    assert zombie.flush(30) == 0
    aborted = [r for r in records[12:] if r.partition == 1][:3]
    produce_transactionally(
        target_servers,
        topic,
        [Record(r.key, r.value, tuple(r.headers), r.timestamp_ms, 1) for r in aborted],
        transactional_id=f"{prefix}.{topic}.1",
        abort=True,
    )

    second = copy_global_topics(spark, donor, target, {topic: 30}, prefix)

    assert second == CopyResult(copied={topic: 18}, present={topic: 12}, first_seq={topic: 0})
    # The copy fenced the abandoned attempt: it can commit nothing any more.
    with pytest.raises(KafkaException):
        zombie.commit_transaction(10)
    assert as_copied(read_committed(target_servers, topic)) == expected(records)

    third = copy_global_topics(spark, donor, target, {topic: 30}, prefix)
    assert third == CopyResult(copied={topic: 0}, present={topic: 30}, first_seq={topic: 0})
    assert as_copied(read_committed(target_servers, topic)) == expected(records)


def test_refuses_a_donor_whose_seqs_go_backwards(
    spark: SparkSession, clusters: tuple[str, str], global_topic: Callable[[], str]
) -> None:
    donor_servers, target_servers = clusters
    topic = global_topic()
    create_topic(donor_servers, topic)
    records = global_records(make_events([0, 1, 2, 3, 5, 4, 6, 7], topic, 1), topic, 1)
    write(donor_servers, records)
    donor, target = endpoints(clusters)

    with pytest.raises(BackfillError) as raised:
        copy_global_topics(spark, donor, target, {topic: 8}, f"kdsync-g.m4.bf-{uuid.uuid4().hex}")

    message = str(raised.value)
    assert f"donor m2's {topic}[0] offset 5 has seq 4, not above the previous" in message
    # The open transaction was aborted: nothing of the refused partition is visible.
    assert read_committed(target_servers, topic) == []


def test_refuses_a_lagging_donor_before_writing_anything(
    spark: SparkSession, clusters: tuple[str, str], global_topic: Callable[[], str]
) -> None:
    donor_servers, target_servers = clusters
    fine, lagging = global_topic(), global_topic()
    for topic in (fine, lagging):
        create_topic(donor_servers, topic)
        write(donor_servers, global_records(make_events(range(10), topic, 1), topic, 1))
    donor, target = endpoints(clusters)
    prefix = f"kdsync-g.m4.bf-{uuid.uuid4().hex}"

    with pytest.raises(BackfillError, match=r"holds seqs up to 9 only.*behind") as raised:
        copy_global_topics(spark, donor, target, {fine: 10, lagging: 11}, prefix)
    assert f"donor m2's {lagging}" in str(raised.value)
    # Refused while planning: no topic was created in the target.
    assert partition_count(target_servers, fine) is None
    assert partition_count(target_servers, lagging) is None


def test_copies_a_trimmed_donor_from_the_seq_where_it_holds_every_later_one(
    spark: SparkSession, clusters: tuple[str, str], global_topic: Callable[[], str]
) -> None:
    donor_servers, target_servers = clusters
    topic = global_topic()
    create_topic(donor_servers, topic, partitions=2)
    records = global_records(make_events(range(40), topic), topic, 2)
    write(donor_servers, records[:17])
    write(donor_servers, records[17:])
    seqs = seqs_by_partition(records)
    # Partition 0 loses its first four records, partition 1 one: every seq from partition
    # 0's new first one on is still held, some below it may not be.
    trim(donor_servers, topic, {0: seqs[0][4], 1: seqs[1][1]})
    start = seqs[0][4]
    assert seqs[1][1] < start < 30
    donor, target = endpoints(clusters)

    result = copy_global_topics(
        spark, donor, target, {topic: 30}, f"kdsync-g.m4.bf-{uuid.uuid4().hex}"
    )

    assert result == CopyResult(
        copied={topic: 30 - start}, present={topic: 0}, first_seq={topic: start}
    )
    copied = read_committed(target_servers, topic)
    assert as_copied(copied) == expected(records[start:30])
    assert sorted(seq_of_headers(r.headers) for r in copied) == list(range(start, 30))


def test_a_donor_partition_trimmed_to_its_end_leaves_the_topic_empty(
    spark: SparkSession, clusters: tuple[str, str], global_topic: Callable[[], str]
) -> None:
    donor_servers, target_servers = clusters
    topic = global_topic()
    create_topic(donor_servers, topic, partitions=2)
    records = global_records(make_events(range(20), topic), topic, 2)
    write(donor_servers, records)
    # The partition without seq 19: the donor still shows it is not behind.
    emptied = 1 - records[19].partition
    trim(donor_servers, topic, {emptied: None})
    donor, target = endpoints(clusters)

    result = copy_global_topics(
        spark, donor, target, {topic: 20}, f"kdsync-g.m4.bf-{uuid.uuid4().hex}"
    )

    # Which seqs the emptied partition held is unknown: the new T-global starts empty.
    assert result == CopyResult(copied={topic: 0}, present={topic: 0}, first_seq={topic: 20})
    assert partition_count(target_servers, topic) == 2
    assert read_committed(target_servers, topic) == []


def test_resumes_from_a_donor_trimmed_below_what_was_copied(
    spark: SparkSession, clusters: tuple[str, str], global_topic: Callable[[], str]
) -> None:
    donor_servers, target_servers = clusters
    topic = global_topic()
    create_topic(donor_servers, topic, partitions=2)
    records = global_records(make_events(range(30), topic), topic, 2)
    write(donor_servers, records[:17])
    write(donor_servers, records[17:])
    donor, target = endpoints(clusters)
    prefix = f"kdsync-g.m4.bf-{uuid.uuid4().hex}"
    first = copy_global_topics(spark, donor, target, {topic: 12}, prefix)
    assert first == CopyResult(copied={topic: 12}, present={topic: 0}, first_seq={topic: 0})

    # The partition holding seq 12 loses every record the first run copied from it (the
    # target's last one there included), the other one its first record.
    seqs = seqs_by_partition(records)
    holder = records[12].partition
    other = 1 - holder
    trim(donor_servers, topic, {holder: 12, other: seqs[other][1]})
    assert seqs[other][1] < 12

    second = copy_global_topics(spark, donor, target, {topic: 30}, prefix)

    # The donor holds every seq from 12 on: the target is claimed complete from there (its
    # records below 12 stay, uncounted).
    assert second == CopyResult(copied={topic: 18}, present={topic: 0}, first_seq={topic: 12})
    copied = read_committed(target_servers, topic)
    assert as_copied(copied) == expected(records)
    assert sorted(seq_of_headers(r.headers) for r in copied) == list(range(30))


def test_resumes_from_the_later_of_the_donors_start_and_the_targets(
    spark: SparkSession,
    clusters: tuple[str, str],
    global_topic: Callable[[], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    donor_servers, target_servers = clusters
    topic = global_topic()
    create_topic(donor_servers, topic, partitions=2)
    records = global_records(make_events(range(30), topic), topic, 2)
    write(donor_servers, records[:17])
    write(donor_servers, records[17:])
    seqs = seqs_by_partition(records)
    # An earlier run from seq 0, killed when the partition holding seq 0 had nothing
    # committed in the target and the other one its first eight records.
    starter = records[0].partition
    other = 1 - starter
    prefix = f"kdsync-g.m4.bf-{uuid.uuid4().hex}"
    create_topic(target_servers, topic, partitions=2)
    earlier = [r for r in records if r.partition == other][:8]
    produce_transactionally(
        target_servers,
        topic,
        [Record(r.key, r.value, tuple(r.headers), r.timestamp_ms, other) for r in earlier],
        transactional_id=f"{prefix}.{topic}.{other}",
    )
    # Then the donor loses the starter's first five records and the other's first two:
    # it holds every seq from the starter's sixth one (F) on.
    trim(donor_servers, topic, {starter: seqs[starter][5], other: seqs[other][2]})
    start = seqs[starter][5]
    target_first = seqs[other][0]
    assert target_first < start < seqs[other][7]  # the target's first seq: T < F
    before = [s for s in seqs[other][:8] if s < start]  # in the target, below the start
    donor_offsets = {
        (r.partition, seq_of_headers(r.headers)): r.offset
        for r in read_committed(donor_servers, topic)
    }
    reads: list[dict[int, int]] = []

    def read_range(spark: SparkSession, rng: TopicRange) -> DataFrame:
        reads.append(dict(rng.start))
        return real_read_range(spark, rng)

    monkeypatch.setattr(copy_job, "read_range", read_range)
    donor, target = endpoints(clusters)

    result = copy_global_topics(spark, donor, target, {topic: 30}, prefix)

    # Claimed complete from max(F, T) = F; the target's records below it are not counted.
    assert result == CopyResult(
        copied={topic: 30 - start - (8 - len(before))},
        present={topic: 8 - len(before)},
        first_seq={topic: start},
    )
    copied = read_committed(target_servers, topic)
    held = [seq_of_headers(r.headers) for r in copied]
    assert sorted(s for s in held if s >= start) == list(range(start, 30))
    assert sorted(s for s in held if s < start) == before
    assert as_copied(copied) == expected(
        [r for r in records if seq_of_headers(r.headers) in set(held)]
    )
    # Each donor partition is read from its first record at or above the start, not from
    # its log start (which retention could delete during a long copy).
    first_at_or_after = {p: min(s for s in seqs[p] if s >= start) for p in (starter, other)}
    assert reads == [{p: donor_offsets[(p, s)] for p, s in first_at_or_after.items()}]
    assert first_at_or_after[other] > seqs[other][2]
