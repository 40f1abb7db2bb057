"""A plain, independent Kafka client for tests: confluent-kafka only, no kdsync code.

Later tests use it as the independent checker of replication, so it must not share code
with the product: it creates topics, produces in transactions, and reads back exactly
what is committed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

Headers = tuple[tuple[str, bytes | None], ...]

_POLL_SECONDS = 0.2


@dataclass(frozen=True)
class Record:
    """What to produce. ``None`` key or value is sent as null; ``partition=None`` lets the
    partitioner choose; ``timestamp`` is CreateTime in epoch milliseconds (None: now)."""

    key: bytes | None = None
    value: bytes | None = None
    headers: Headers = ()
    timestamp: int | None = None
    partition: int | None = None


@dataclass(frozen=True)
class CommittedRecord:
    """A record as read back from the log."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers = field(default=())
    timestamp: int = 0


class ProduceFailed(RuntimeError):
    """A transaction did not commit; ``errors`` holds the per-record delivery errors."""

    def __init__(self, message: str, errors: Sequence[KafkaError]) -> None:
        super().__init__(message)
        self.errors = list(errors)

    @property
    def codes(self) -> set[int]:
        return {error.code() for error in self.errors}


def _remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    config: Mapping[str, str] | None = None,
    *,
    timeout: float = 30.0,
) -> None:
    """Create ``name`` and return once every partition has a leader."""
    deadline = time.monotonic() + timeout
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [
            NewTopic(
                name, num_partitions=partitions, replication_factor=1, config=dict(config or {})
            )
        ],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    futures[name].result(timeout=timeout)
    # Creation returns when the controller accepted it; the broker may not lead yet.
    while True:
        topic = admin.list_topics(topic=name, timeout=max(0.1, _remaining(deadline))).topics.get(
            name
        )
        if (
            topic is not None
            and topic.error is None
            and len(topic.partitions) == partitions
            and all(p.leader >= 0 and p.error is None for p in topic.partitions.values())
        ):
            return
        if _remaining(deadline) <= 0:
            raise TimeoutError(f"topic {name} on {bootstrap} has no leaders after {timeout}s")
        time.sleep(_POLL_SECONDS)


def produce_transactionally(
    bootstrap: str,
    topic: str,
    records: Iterable[Record],
    transactional_id: str | None = None,
    *,
    abort: bool = False,
    timeout: float = 30.0,
) -> None:
    """Produce ``records`` in one transaction, then commit it (or abort it if ``abort``).

    Raises :class:`ProduceFailed` if any record was rejected; the transaction is then
    aborted, so none of the records is visible to read_committed readers.
    """
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id or f"plain-kafka-{uuid.uuid4().hex}",
            "transaction.timeout.ms": int(timeout * 1000),
            "message.timeout.ms": int(timeout * 1000),
        }
    )
    errors: list[KafkaError] = []
    ends: dict[int, int] = {}  # partition -> one past the last record written there

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            errors.append(error)
            return
        partition, offset = message.partition(), message.offset()
        if partition is not None and offset is not None:
            ends[partition] = max(ends.get(partition, 0), offset + 1)

    producer.init_transactions(timeout)
    producer.begin_transaction()
    for record in records:
        kwargs: dict[str, Any] = {"key": record.key, "value": record.value}
        if record.headers:
            kwargs["headers"] = list(record.headers)
        if record.timestamp is not None:
            kwargs["timestamp"] = record.timestamp
        if record.partition is not None:
            kwargs["partition"] = record.partition
        producer.produce(topic, on_delivery=on_delivery, **kwargs)
    if abort:
        producer.abort_transaction(timeout)
        return
    # Delivery reports tell which record failed; commit_transaction alone says only that
    # the transaction cannot commit.
    producer.flush(timeout)
    if errors:
        producer.abort_transaction(timeout)
        raise ProduceFailed(f"{len(errors)} record(s) rejected by {bootstrap}: {errors[0]}", errors)
    try:
        producer.commit_transaction(timeout)
    except KafkaException as error:
        producer.abort_transaction(timeout)
        raise ProduceFailed(f"commit on {bootstrap} failed: {error}", [error.args[0]]) from error
    _wait_until_visible(bootstrap, topic, ends, time.monotonic() + timeout)


def _wait_until_visible(bootstrap: str, topic: str, ends: dict[int, int], deadline: float) -> None:
    """commit_transaction returns before the coordinator has written the commit markers;
    wait until every partition's last stable offset is past the records just written
    (their offsets from the delivery reports), so that read_committed readers see them.
    (Waiting only until the last stable offset reached the high watermark once let a CI
    run read nothing right after the commit: both are asked separately, and a stale
    answer passed; the records' own offsets are the fact to wait for.)"""
    settings = {"bootstrap.servers": bootstrap, "group.id": f"stable-{uuid.uuid4()}"}
    committed = Consumer({**settings, "isolation.level": "read_committed"})
    try:
        for partition, end in sorted(ends.items()):
            where = TopicPartition(topic, partition)
            while True:
                wait = _remaining(deadline)
                if wait <= 0:
                    raise TimeoutError(
                        f"{topic}[{partition}] on {bootstrap}: the records up to offset {end} "
                        "never became visible to read_committed readers"
                    )
                _, stable = committed.get_watermark_offsets(where, timeout=wait, cached=False)
                if stable >= end:
                    break
                time.sleep(0.05)  # polling interval of a condition with a deadline
    finally:
        committed.close()


def _to_committed(message: Message) -> CommittedRecord:
    partition = message.partition()
    offset = message.offset()
    assert partition is not None and offset is not None
    raw_headers = message.headers() or []
    headers: list[tuple[str, bytes | None]] = []
    for name, value in raw_headers if isinstance(raw_headers, list) else raw_headers.items():
        headers.append((name, value.encode() if isinstance(value, str) else value))
    key = message.key()
    value = message.value()
    return CommittedRecord(
        partition=partition,
        offset=offset,
        key=key.encode() if isinstance(key, str) else key,
        value=value.encode() if isinstance(value, str) else value,
        headers=tuple(headers),
        timestamp=message.timestamp()[1],
    )


def read_committed(bootstrap: str, topic: str, timeout: float = 30.0) -> list[CommittedRecord]:
    """Every committed record of ``topic`` up to its current end, by partition then offset.

    The end of each partition is its last stable offset, taken when the call starts;
    records of open or aborted transactions are not returned.
    """
    deadline = time.monotonic() + timeout
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"plain-kafka-reader-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=max(0.1, _remaining(deadline)))
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            raise LookupError(f"topic {topic} not found on {bootstrap}")
        # For a read_committed consumer the "high" watermark is the last stable offset.
        ends: dict[int, int] = {}
        starts: dict[int, int] = {}
        for partition in sorted(described.partitions):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=max(0.1, _remaining(deadline))
            )
            starts[partition], ends[partition] = low, high
        pending = {p for p in ends if ends[p] > starts[p]}
        if not pending:
            return []
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in sorted(pending)])
        records: list[CommittedRecord] = []
        while pending:
            if _remaining(deadline) <= 0:
                raise TimeoutError(
                    f"read_committed({topic}) on {bootstrap}: partitions {sorted(pending)} "
                    f"not read to their end {ends} within {timeout}s"
                )
            message = consumer.poll(min(_POLL_SECONDS * 5, _remaining(deadline)))
            if message is None:
                continue
            error = message.error()
            partition = message.partition()
            offset = message.offset()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    # EOF is reported at the fetch position, past any commit markers.
                    if partition in pending and offset is not None and offset >= ends[partition]:
                        pending.discard(partition)
                    continue
                raise KafkaException(error)
            if partition is None or offset is None or offset >= ends[partition]:
                continue  # committed after we took the snapshot of end offsets
            records.append(_to_committed(message))
            if offset == ends[partition] - 1:
                pending.discard(partition)
        records.sort(key=lambda r: (r.partition, r.offset))
        return records
    finally:
        consumer.close()


def wait_for_committed(
    bootstrap: str,
    topic: str,
    condition: Callable[[list[CommittedRecord]], bool],
    *,
    timeout: float = 60.0,
    what: str = "condition",
) -> list[CommittedRecord]:
    """Re-read ``topic`` until ``condition(records)`` holds; return those records."""
    deadline = time.monotonic() + timeout
    records: list[CommittedRecord] = []
    while True:
        remaining = _remaining(deadline)
        if remaining <= 0:
            raise TimeoutError(
                f"{what} not met on {bootstrap}/{topic} within {timeout}s; "
                f"last read {len(records)} records"
            )
        try:
            records = read_committed(bootstrap, topic, timeout=remaining)
        except LookupError:
            records = []
        if condition(records):
            return records
        time.sleep(_POLL_SECONDS)


def without_positions(records: Iterable[CommittedRecord]) -> list[Record]:
    """Records as they were produced (for comparing with what a test sent)."""
    return [
        Record(
            key=r.key,
            value=r.value,
            headers=r.headers,
            timestamp=r.timestamp,
            partition=r.partition,
        )
        for r in records
    ]
