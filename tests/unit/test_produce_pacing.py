"""The writers hand librdkafka about one batch per partition at a time, then wait.

librdkafka's idempotent producer keeps one request in flight per partition and busy-polls
while more records of that partition wait behind it (kdsync.kafka.produce_pacing). These
tests record what a fake client is handed between flushes, counting each record the way a
record batch does: no partition ever holds more than a batch, batches are not flushed
half empty, every record still arrives once and in order, and a wait that fails aborts the
transaction instead of committing part of it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from kdsync.kafka.errors import KafkaUnavailable, RecordTooLarge
from kdsync.kafka.global_writer import GlobalWriter
from kdsync.kafka.log_store import LogStore
from kdsync.kafka.produce_pacing import BATCH_BYTES
from kdsync.ordering import Entry, LedgerState
from kdsync.ordering.events import DeliveredEvent, Header, OriginBatch, SourceEvent
from kdsync.ordering.ledger import BatchVerdict, Delivery
from kdsync.wire_format.records import decode_entry

# What a record adds to a v2 record batch besides its bytes: its length, attributes,
# timestamp and offset deltas, key and value lengths (varints, up to 5 bytes each at
# these sizes), a header count, and two lengths per header.
RECORD_FRAMING = 21
HEADER_FRAMING = 4


class FakeError:
    def __init__(self, code: int) -> None:
        self._code = code

    def code(self) -> int:
        return self._code

    def str(self) -> str:
        return "Broker: Message size too large"


class FakeMessage:
    def __init__(self, topic: str, size: int) -> None:
        self._topic, self._size = topic, size

    def topic(self) -> str:
        return self._topic

    def key(self) -> None:
        return None

    def value(self) -> bytes:
        return bytes(self._size)

    def headers(self) -> None:
        return None


class PacedProducer:
    """Counts the bytes queued per partition since the last flush, as librdkafka batches."""

    def __init__(self, unacknowledged_after_flush: int = 0, refuse_on_flush: bool = False) -> None:
        self.calls: list[str] = []
        self.values: list[bytes] = []
        self.queued: dict[tuple[str, int], int] = {}
        self.most_queued = 0  # the largest per-partition backlog any flush found
        self._left = unacknowledged_after_flush
        self._refuse = refuse_on_flush
        self._callbacks: list[tuple[Callable[..., None], str]] = []

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                partition: int = 0, **kwargs: Any) -> None:  # fmt: skip
        headers: list[Header] = kwargs.get("headers") or []
        size = RECORD_FRAMING + len(value or b"") + len(key or b"")
        size += sum(HEADER_FRAMING + len(n.encode()) + len(v or b"") for n, v in headers)
        where = (topic, partition)
        self.queued[where] = self.queued.get(where, 0) + size
        self.most_queued = max(self.most_queued, self.queued[where])
        self.values.append(value or b"")
        self.calls.append("produce")
        if "on_delivery" in kwargs:
            self._callbacks.append((kwargs["on_delivery"], topic))

    def flush(self, timeout: float = -1) -> int:
        self.calls.append("flush")
        self.queued.clear()
        if self._refuse and self._callbacks:
            callback, topic = self._callbacks[0]
            callback(FakeError(KafkaError.MSG_SIZE_TOO_LARGE), FakeMessage(topic, 9_000_000))
        self._callbacks.clear()
        return self._left

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")
        if self._refuse:
            raise KafkaException(
                KafkaError(KafkaError._STATE, "a record was refused", txn_requires_abort=True)
            )

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")


def writer_with(producer: PacedProducer, partitions: int) -> GlobalWriter:
    writer = GlobalWriter(
        {"bootstrap.servers": "127.0.0.1:1"},
        "g",
        "m1",
        lambda t: f"{t}.global",
        lambda t: partitions,
    )
    writer._producer = producer  # type: ignore[assignment]
    return writer


def delivery(
    partition: int, first_seq: int, count: int, size: int, headers: tuple[Header, ...] = ()
) -> Delivery:
    events = tuple(
        DeliveredEvent(
            first_seq + i,
            "eu-west-1",
            "payments.transactions",
            partition,
            SourceEvent(
                10**12 + first_seq + i,
                None,
                f"{partition}:{first_seq + i}:".encode().ljust(size, b"x"),
                headers,
                0,
            ),
        )
        for i in range(count)
    )
    where = ("eu-west-1", "payments.transactions", partition)
    return Delivery(1, 1, BatchVerdict.DELIVERED, events, where)


def interleaved(partitions: int, rounds: int, per_delivery: int, size: int,
                headers: tuple[Header, ...] = ()) -> list[Delivery]:  # fmt: skip
    """Many small deliveries, the partitions taking turns: a count carried between
    deliveries of a partition is what keeps each within a batch."""
    return [
        delivery(p, 10**9 + n * per_delivery, per_delivery, size, headers)
        for n in range(rounds)
        for p in range(partitions)
    ]


@pytest.mark.parametrize(
    ("size", "headers"),
    [(1024, ()), (100, ()), (1024, (("trace-id", bytes(200)), ("tenant-é", bytes(100))))],
    ids=["1KiB", "100B", "1KiB-with-user-headers"],
)
def test_a_transaction_is_handed_over_at_most_a_batch_per_partition_at_a_time(
    size: int, headers: tuple[Header, ...]
) -> None:
    producer = PacedProducer()
    deliveries = interleaved(3, 60, 100, size, headers)  # 18,000 events in 180 deliveries
    result = writer_with(producer, 3).write(deliveries, LedgerState())

    assert result.events == 18_000
    assert producer.most_queued <= BATCH_BYTES
    written = [v for v in producer.values if v[:2] in (b"0:", b"1:", b"2:")]
    assert written == [e.event.value for d in deliveries for e in d.events]  # once, in order
    assert producer.calls[0] == "begin" and producer.calls[-1] == "commit"


def test_batches_are_not_flushed_half_empty() -> None:
    producer = PacedProducer()
    deliveries = interleaved(3, 60, 100, 1024)
    writer_with(producer, 3).write(deliveries, LedgerState())

    total = 18_000 * (1024 + 150)  # value and kdsync's headers, about
    # All three partitions fill about together, so one flush serves three batches.
    assert producer.calls.count("flush") <= math.ceil(total / (3 * 0.8 * BATCH_BYTES))


def test_a_small_transaction_is_not_flushed_before_its_commit() -> None:
    producer = PacedProducer()
    writer_with(producer, 3).write([delivery(0, 0, 100, 1024)], LedgerState())
    assert "flush" not in producer.calls
    assert producer.calls[-1] == "commit"


def test_an_event_larger_than_a_batch_is_sent_alone() -> None:
    producer = PacedProducer()
    big = delivery(0, 0, 1, 3 * BATCH_BYTES)
    writer_with(producer, 1).write([big, delivery(0, 1, 10, 1024)], LedgerState())
    # No flush before the first record (nothing queued), one after it, then the commit.
    assert producer.calls[:3] == ["begin", "produce", "flush"]
    assert producer.calls.count("flush") == 1


def test_records_still_unacknowledged_abort_the_transaction_instead_of_committing_part() -> None:
    producer = PacedProducer(unacknowledged_after_flush=3)
    with pytest.raises(KafkaUnavailable, match="unacknowledged"):
        writer_with(producer, 1).write([delivery(0, 0, 2000, 1024)], LedgerState())
    assert "commit" not in producer.calls
    assert producer.calls[-1] == "abort"


def test_a_record_refused_during_a_flush_halts_with_its_topic_and_aborts() -> None:
    producer = PacedProducer(refuse_on_flush=True)
    with pytest.raises(RecordTooLarge, match=re.escape("payments.transactions.global")):
        writer_with(producer, 1).write([delivery(0, 0, 2000, 1024)], LedgerState())
    assert producer.calls[-1] == "abort"


def test_the_ordering_log_is_stored_a_batch_at_a_time_in_index_order() -> None:
    store = LogStore({"bootstrap.servers": "127.0.0.1:1"}, "g", "m1")
    producer = PacedProducer()
    store._producer = producer  # type: ignore[assignment]
    entries = [
        Entry(i, 1, OriginBatch("c1", "orders", 0, i * 100, (i + 1) * 100, i == 1, tuple(
            SourceEvent(i * 100 + j, None, bytes(1024), (), 0) for j in range(100)
        )))
        for i in range(1, 31)
    ]  # fmt: skip
    store.persist(None, entries)

    assert producer.most_queued <= BATCH_BYTES
    assert producer.calls.count("flush") <= math.ceil(30 * 104_000 / (0.8 * BATCH_BYTES))
    assert producer.calls[-1] == "flush"
    assert [decode_entry(v).index for v in producer.values] == list(range(1, 31))
