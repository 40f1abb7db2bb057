"""``ordering.sourceLingerMs``: how long the source reader waits for a fuller batch.

At the default (100 ms) one batch consume waits up to the linger, as the reader always
did. Below the loop's 100 ms turn, the reader first waits for one record and only then
lingers: an idle reader must not spin every few milliseconds, and a record that arrives
must wait no longer than the linger."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kdsync.config.sections import OrderingConfig
from kdsync.kafka.source_reader import SourceReader


class RecordingConsumer:
    """Answers poll with the queued records one by one and consume with the rest."""

    def __init__(self, records: list[str]) -> None:
        self.records = list(records)
        self.calls: list[tuple[str, int | None, float]] = []

    def poll(self, timeout: float) -> str | None:
        self.calls.append(("poll", None, timeout))
        return self.records.pop(0) if self.records else None

    def consume(self, num_messages: int, timeout: float) -> list[str]:
        self.calls.append(("consume", num_messages, timeout))
        taken, self.records = self.records[:num_messages], self.records[num_messages:]
        return taken

    def close(self) -> None:
        pass


def reader(consumer: RecordingConsumer, linger_ms: int, max_events: int = 500) -> SourceReader:
    return SourceReader(
        {"bootstrap.servers": "127.0.0.1:9"},
        "g",
        "m1",
        object(),  # type: ignore[arg-type]
        lambda _topic: True,
        {},
        max_batch_events=max_events,
        max_batch_bytes=1 << 20,
        on_batches=lambda: None,
        linger_ms=linger_ms,
        consumer_factory=lambda _config: consumer,  # type: ignore[arg-type,return-value]
    )


def read(source: SourceReader) -> list[Any]:
    return source._read_batch()  # the one read the reading loop makes per turn


def test_the_default_linger_is_one_batch_consume_that_waits_up_to_100_ms() -> None:
    consumer = RecordingConsumer(["a", "b"])
    assert read(reader(consumer, 100)) == ["a", "b"]
    assert consumer.calls == [("consume", 500, 0.1)]


def test_a_short_linger_waits_for_a_first_record_then_at_most_the_linger() -> None:
    consumer = RecordingConsumer(["a", "b", "c"])
    assert read(reader(consumer, 5)) == ["a", "b", "c"]
    assert consumer.calls == [("poll", None, 0.1), ("consume", 499, 0.005)]


def test_an_idle_reader_with_a_short_linger_does_not_spin() -> None:
    consumer = RecordingConsumer([])
    assert read(reader(consumer, 0)) == []
    assert consumer.calls == [("poll", None, 0.1)], "one wait of a whole turn, no consume"


def test_a_batch_of_one_event_takes_the_first_record_alone() -> None:
    consumer = RecordingConsumer(["a", "b"])
    assert read(reader(consumer, 0, max_events=1)) == ["a"]
    assert consumer.records == ["b"]


@pytest.mark.parametrize("value", [-1, 1001])
def test_a_linger_out_of_range_is_refused_by_the_config(value: int) -> None:
    with pytest.raises(ValidationError, match=r"sourceLingerMs|source_linger_ms"):
        OrderingConfig.model_validate({"sourceLingerMs": value})
