"""The writers hand librdkafka about one batch per partition at a time, then wait.

librdkafka's idempotent producer keeps one request in flight per partition and busy-polls
while more records of that partition wait behind it (kdsync.kafka.produce_pacing). These
tests record what a fake client is handed between flushes: no partition ever holds more
than a batch, every record still arrives once and in order, and a wait that times out
aborts the transaction instead of committing part of it.
"""

from __future__ import annotations

from typing import Any

import pytest

from kdsync.kafka.errors import KafkaUnavailable
from kdsync.kafka.global_writer import GlobalWriter
from kdsync.kafka.log_store import LogStore
from kdsync.kafka.produce_pacing import BATCH_BYTES
from kdsync.ordering import Entry, LedgerState
from kdsync.ordering.events import DeliveredEvent, OriginBatch, SourceEvent
from kdsync.ordering.ledger import BatchVerdict, Delivery
from kdsync.wire_format.records import decode_entry


class PacedProducer:
    """Counts the bytes queued per partition since the last flush, as librdkafka batches."""

    def __init__(self, unacknowledged_after_flush: int = 0) -> None:
        self.calls: list[str] = []
        self.values: list[bytes] = []
        self.queued: dict[tuple[str, int], int] = {}
        self.most_queued = 0  # the largest per-partition backlog any flush found
        self._left = unacknowledged_after_flush

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                partition: int = 0, **kwargs: Any) -> None:  # fmt: skip
        headers = kwargs.get("headers") or ()
        size = len(value or b"") + len(key or b"")
        size += sum(len(name) + len(v or b"") for name, v in headers)
        where = (topic, partition)
        self.queued[where] = self.queued.get(where, 0) + size
        self.most_queued = max(self.most_queued, self.queued[where])
        self.values.append(value or b"")
        self.calls.append("produce")

    def flush(self, timeout: float = -1) -> int:
        self.calls.append("flush")
        self.queued.clear()
        return self._left

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")


def writer_with(producer: PacedProducer, partitions: int) -> GlobalWriter:
    writer = GlobalWriter(
        {"bootstrap.servers": "127.0.0.1:1"},
        "g",
        "m1",
        lambda t: f"{t}-global",
        lambda t: partitions,
    )
    writer._producer = producer  # type: ignore[assignment]
    return writer


def delivery(partition: int, first_seq: int, count: int, size: int) -> Delivery:
    events = tuple(
        DeliveredEvent(
            first_seq + i,
            "c1",
            "orders",
            partition,
            SourceEvent(i, None, f"{partition}:{first_seq + i}:".encode().ljust(size, b"x"), (), 0),
        )
        for i in range(count)
    )
    return Delivery(1, 1, BatchVerdict.DELIVERED, events, ("c1", "orders", partition))


def test_a_transaction_of_several_batches_per_partition_is_handed_over_a_batch_at_a_time() -> None:
    producer = PacedProducer()
    # 3 partitions, 2,500 events of 1 KiB each in two deliveries: ~2.5 MB per partition.
    deliveries = [delivery(p, n * 1250, 1250, 1024) for n in range(2) for p in range(3)]
    result = writer_with(producer, 3).write(deliveries, LedgerState())

    assert result.events == 7500
    assert producer.most_queued <= BATCH_BYTES
    assert producer.calls.count("flush") >= 5  # 7.5 MB in batches of at most 1 MB
    assert producer.calls[0] == "begin" and producer.calls[-1] == "commit"
    written = [v for v in producer.values if v.startswith((b"0:", b"1:", b"2:"))]
    expected = [e.event.value for d in deliveries for e in d.events]
    assert written == expected  # each once, in the agreed order


def test_a_small_transaction_is_not_flushed_before_its_commit() -> None:
    producer = PacedProducer()
    writer_with(producer, 3).write([delivery(0, 0, 100, 1024)], LedgerState())
    assert "flush" not in producer.calls
    assert producer.calls[-1] == "commit"


def test_records_still_unacknowledged_abort_the_transaction_instead_of_committing_part() -> None:
    producer = PacedProducer(unacknowledged_after_flush=3)
    with pytest.raises(KafkaUnavailable, match="unacknowledged"):
        writer_with(producer, 1).write([delivery(0, 0, 2000, 1024)], LedgerState())
    assert "commit" not in producer.calls
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
    assert producer.calls.count("flush") >= 3  # 30 entries of ~100 KiB
    assert producer.calls[-1] == "flush"
    assert [decode_entry(v).index for v in producer.values] == list(range(1, 31))
