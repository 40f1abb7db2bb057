"""A source reader whose reading thread fails unexpectedly says so, and wakes the
sidecar, which stops (exit 1) rather than run on while its cluster's events no longer
enter the order. Seen: a NameError in the reading loop ended the thread alone, and the
sidecar stayed up and healthy-looking with nothing read."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import TopicPartition

from kdsync.kafka.source_reader import SourceReader


class FailingConsumer:
    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        raise RuntimeError("boom in the reading loop")

    def commit(self, **_: Any) -> None:
        pass

    def get_watermark_offsets(self, partition: TopicPartition, **_: Any) -> tuple[int, int]:
        return (0, 0)

    def close(self) -> None:
        pass


class OneTopic:
    def source_partitions(self, selects: Callable[[str], bool]) -> dict[str, int]:
        return {"orders": 1}


def test_a_failed_reading_thread_reports_its_failure_and_wakes_the_sidecar() -> None:
    woken = threading.Event()
    reader = SourceReader(
        {"bootstrap.servers": "127.0.0.1:9"},
        "g",
        "m1",
        OneTopic(),  # type: ignore[arg-type]
        lambda _topic: True,
        {},
        max_batch_events=500,
        max_batch_bytes=1 << 20,
        on_batches=woken.set,
        consumer_factory=lambda _config: FailingConsumer(),  # type: ignore[arg-type,return-value]
    )
    assert reader.failure is None
    reader.start()
    try:
        assert woken.wait(10), "the sidecar was not woken"
    finally:
        reader.stop()
    assert reader.failure is not None
    assert "source reader failed" in reader.failure and "boom in the reading loop" in reader.failure
