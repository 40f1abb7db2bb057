"""The source reader replaces a consumer that has stopped fetching (librdkafka can stop
fetching an assigned partition for good after its broker restarts, reporting nothing):
that member's events would silently stop entering the order."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from kdsync.kafka.source_reader import SourceReader
from kdsync.ordering import OriginBatch

TOPIC = "orders"
WHERE = (TOPIC, 0)


class FakeMessage:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return f"v{self._offset}".encode()

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000 + self._offset)


class FakeConsumer:
    """Serves the records in [first, stuck_at) from its assigned position, then nothing:
    the stuck client."""

    def __init__(self, stuck_at: int) -> None:
        self.stuck_at = stuck_at
        self.assigned: list[tuple[str, int, int]] = []
        self.position_at = -1001  # librdkafka's "no position yet"
        self.closed = threading.Event()

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.assigned.append((tp.topic, tp.partition, tp.offset))
            self.position_at = max(tp.offset, 0)

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        if self.assigned and self.position_at < self.stuck_at:
            end = min(self.stuck_at, self.position_at + num_messages)
            out = [FakeMessage(o) for o in range(self.position_at, end)]
            self.position_at = end
            return out
        self.closed.wait(timeout)  # the real call blocks for up to its timeout
        return []

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.position_at) for tp in partitions]

    def get_watermark_offsets(self, partition: TopicPartition, **_: Any) -> tuple[int, int]:
        return (0, -1)

    def commit(self, **_: Any) -> None:
        pass

    def close(self) -> None:
        self.closed.set()


class FakeTopics:
    def __init__(self, ends: Callable[[], int]) -> None:
        self._ends = ends
        self.asked = 0

    def source_partitions(self, selects: Callable[[str], bool]) -> dict[str, int]:
        return {TOPIC: 1}

    def committed_ends(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        self.asked += 1
        return {where: self._ends() for where in partitions}


class Harness:
    def __init__(self, consumers: list[FakeConsumer], topics: Any) -> None:
        self.consumers = consumers
        self.made: list[FakeConsumer] = []
        self.reader = SourceReader(
            {"bootstrap.servers": "127.0.0.1:9"},
            "g",
            "m1",
            topics,
            lambda name: name == TOPIC,
            {},
            max_batch_events=3,
            max_batch_bytes=1 << 20,
            on_batches=lambda: None,
            consumer_factory=self._make,
            stall_seconds=0.3,
        )

    def _make(self, config: dict[str, Any]) -> Any:
        consumer = self.consumers[len(self.made)]
        self.made.append(consumer)
        return consumer

    def offsets_read(self) -> list[int]:
        out: list[int] = []
        while not self.reader.batches.empty():
            batch: OriginBatch = self.reader.batches.get_nowait()
            out.extend(e.offset for e in batch.events)
        return out


def wait_until(what: str, condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)  # polling a condition with a deadline


def test_a_consumer_that_stops_fetching_is_replaced_and_reading_goes_on_exactly() -> None:
    stuck, fresh = FakeConsumer(stuck_at=5), FakeConsumer(stuck_at=10)
    committed = iter(range(10, 1000))  # records keep being committed; none reach us
    harness = Harness([stuck, fresh], FakeTopics(lambda: next(committed)))
    reader = harness.reader
    read: list[int] = []
    reader.start()
    try:
        wait_until(
            "offsets 0..9 read", lambda: read.extend(harness.offsets_read()) or len(read) >= 10
        )
    finally:
        reader.stop()
    assert read == list(range(10)), "every record once, in order, across the replacement"
    assert fresh.assigned == [(TOPIC, 0, 5)], "the new consumer starts where the old one stopped"
    assert stuck.closed.is_set()
    assert reader.consumers_replaced == 1
    assert reader.last_error is not None and f"{TOPIC}[0]: 5, 11" in reader.last_error


def test_a_partition_read_to_its_end_keeps_its_consumer() -> None:
    # Its last stable offset is past the last record (a transaction marker), not growing.
    topics = FakeTopics(lambda: 6)
    harness = Harness([FakeConsumer(stuck_at=5)], topics)
    harness.reader.start()
    try:
        wait_until("three stall checks", lambda: topics.asked >= 3)
    finally:
        harness.reader.stop()
    assert harness.reader.consumers_replaced == 0
    assert len(harness.made) == 1


class UnreachableTopics(FakeTopics):
    def committed_ends(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        self.asked += 1
        raise KafkaException("brokers down")


def test_unreachable_brokers_are_not_taken_for_a_stuck_consumer() -> None:
    topics = UnreachableTopics(lambda: 0)
    harness = Harness([FakeConsumer(stuck_at=5)], topics)
    harness.reader.start()
    try:
        wait_until("three stall checks", lambda: topics.asked >= 3)
    finally:
        harness.reader.stop()
    assert harness.reader.consumers_replaced == 0
    assert harness.reader.errors == 0
