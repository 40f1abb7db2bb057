"""An event larger than kdsync carries (over MAX_EVENT_BYTES) stops its source partition
at that event, with a reason naming it and the fix, instead of failing the sidecar each
time it is read (it used to end in FrameTooLarge at the peer port, a crash loop): the
events before it are batched as usual, nothing after it is offered, other partitions go
on."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import TopicPartition

from kdsync.kafka.source_reader import MAX_EVENT_BYTES, SourceReader
from kdsync.ordering import OriginBatch

TOPIC = "orders"
BIG_OFFSET = 3
HUGE = b"x" * (MAX_EVENT_BYTES + 1)


class FakeMessage:
    def __init__(self, partition: int, offset: int, value: bytes) -> None:
        self._partition, self._offset, self._value = partition, offset, value

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[tuple[str, bytes]]:
        return [("h", b"1")]

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000 + self._offset)


class FakeConsumer:
    """Serves partition 0's offsets 0..5 (offset 3 huge) and partition 1's 0..5, once."""

    def __init__(self) -> None:
        self.served = False
        self.paused: list[tuple[str, int]] = []
        self.closed = threading.Event()

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        if not self.served:
            self.served = True
            return [
                FakeMessage(p, o, HUGE if (p, o) == (0, BIG_OFFSET) else f"v{o}".encode())
                for o in range(6)
                for p in (0, 1)
            ]
        self.closed.wait(timeout)
        return []

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused.extend((tp.topic, tp.partition) for tp in partitions)

    def get_watermark_offsets(self, partition: TopicPartition, **_: Any) -> tuple[int, int]:
        return (0, 6)

    def commit(self, **_: Any) -> None:
        pass

    def close(self) -> None:
        self.closed.set()


class FakeTopics:
    def source_partitions(self, selects: Callable[[str], bool]) -> dict[str, int]:
        return {TOPIC: 2}

    def committed_ends(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return {where: 6 for where in partitions}


def wait_until(what: str, condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)  # polling a condition with a deadline


def test_an_event_over_the_limit_stops_its_partition_there_with_the_fix() -> None:
    consumer = FakeConsumer()
    reader = SourceReader(
        {"bootstrap.servers": "127.0.0.1:9"},
        "g",
        "m1",
        FakeTopics(),  # type: ignore[arg-type]
        lambda name: name == TOPIC,
        {},
        max_batch_events=500,
        max_batch_bytes=1 << 20,
        on_batches=lambda: None,
        consumer_factory=lambda _config: consumer,  # type: ignore[arg-type,return-value]
    )
    batches: list[OriginBatch] = []

    def offered(partition: int) -> list[int]:
        return [e.offset for b in batches if b.partition == partition for e in b.events]

    reader.start()
    try:
        wait_until(
            "partition 1 read to its end and partition 0 stopped",
            lambda: batches.extend(_drain(reader)) or (len(offered(1)) == 6 and reader.stopped),
        )
    finally:
        reader.stop()

    assert offered(0) == [0, 1, 2], "the events before the big one, and nothing after it"
    assert offered(1) == list(range(6)), "another partition is not held back"
    assert [(b.start, b.end) for b in batches if b.partition == 0] == [(0, BIG_OFFSET)]
    assert consumer.paused == [(TOPIC, 0)]
    assert reader.positions()[(TOPIC, 0)] == BIG_OFFSET, "a restart reads it again, not past"
    reason = reader.stopped[(TOPIC, 0)]
    assert f"source {TOPIC}[0] offset {BIG_OFFSET}" in reason
    assert f"{MAX_EVENT_BYTES} bytes" in reason and "unreplicated" in reason
    assert "Fix:" in reason and f"offset {BIG_OFFSET + 1}" in reason, reason
    assert reader.last_error == reason and reader.errors == 1


def _drain(reader: SourceReader) -> list[OriginBatch]:
    out: list[OriginBatch] = []
    while not reader.batches.empty():
        out.append(reader.batches.get_nowait())
    return out
