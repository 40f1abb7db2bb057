"""The independent checker reads a topic to its end offsets: a consumer that is slow to
answer delays the check but never shortens what it reads, and a topic that stops moving
fails with a message naming how far each partition got."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, KafkaError

from kdsync.verification import replica_check
from kdsync.verification.replica_check import IncompleteRead, TopicFollower

TOPIC = "orders-global"


@dataclass
class _Message:
    _partition: int
    _offset: int
    _eof: bool = False

    def error(self) -> KafkaError | None:
        return KafkaError(KafkaError._PARTITION_EOF) if self._eof else None

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1000 + self._offset)

    def key(self) -> bytes:
        return f"k{self._offset}".encode()

    def value(self) -> bytes:
        return f"v{self._offset}".encode()

    def headers(self) -> None:
        return None


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class _SlowConsumer:
    """Answers each fetch from a script: a list of messages, or None for "nothing yet"
    (which costs the whole fetch timeout on the clock, as a real empty fetch would)."""

    def __init__(self, clock: _Clock, ends: dict[int, int], script: Iterator[list[Any] | None]):
        self.clock = clock
        self.ends = ends
        self.script = script

    def list_topics(self, topic: str, timeout: float) -> Any:
        partitions = {p: object() for p in self.ends}
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=partitions)})

    def assign(self, partitions: list[Any]) -> None:
        pass

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        return (0, self.ends[tp.partition])

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        answer = next(self.script, None)
        if answer is None:
            self.clock.now += timeout
            return []
        self.clock.now += 0.1
        return answer

    def close(self) -> None:
        pass


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(replica_check, "time", fake)
    return fake


def _follower(consumer: _SlowConsumer) -> TopicFollower:
    return TopicFollower("127.0.0.1:9092", TOPIC, consumer=cast(Consumer, consumer))


def _records(partition: int, first: int, last: int) -> list[Any]:
    return [_Message(partition, offset) for offset in range(first, last)]


def test_empty_fetches_before_the_data_do_not_cut_the_read_short(clock: _Clock) -> None:
    # A busy broker: three empty answers first, and more between the chunks.
    answers: list[list[Any] | None] = [None, None, None, _records(0, 0, 400), None]
    answers += [_records(1, 0, 250), None, _records(0, 400, 500)]
    answers.append([_Message(0, 500, _eof=True), _Message(1, 250, _eof=True)])
    script = iter(answers)
    follower = _follower(_SlowConsumer(clock, {0: 500, 1: 250}, script))
    assert follower.read_to_end(timeout=10) == 750
    assert sorted((p, o) for p, o, _ in follower.records) == [
        *((0, o) for o in range(500)),
        *((1, o) for o in range(250)),
    ]


def test_a_topic_that_keeps_moving_is_read_however_long_it_takes(clock: _Clock) -> None:
    """The deadline is for no progress at all: 200 slow chunks take far longer in all
    than the timeout, and every record is read."""
    chunks: list[list[Any] | None] = []
    for chunk in range(200):
        chunks += [None, _records(0, chunk * 10, chunk * 10 + 10)]
    chunks.append([_Message(0, 2000, _eof=True)])
    follower = _follower(_SlowConsumer(clock, {0: 2000}, iter(chunks)))
    assert follower.read_to_end(timeout=5) == 2000
    assert clock.now > 5 * 20


def test_a_topic_that_stops_short_of_its_end_fails_naming_how_far_it_got(
    clock: _Clock,
) -> None:
    script = iter([_records(0, 0, 120), [_Message(1, 40, _eof=True)]])  # then nothing
    follower = _follower(_SlowConsumer(clock, {0: 300, 1: 40}, script))
    with pytest.raises(IncompleteRead) as failure:
        follower.read_to_end(timeout=30)
    message = str(failure.value)
    assert "no progress for 30s" in message
    assert "{0: 'read to 120 of 300'}" in message
    assert len(follower.records) == 120


class _AssignRecorder(_SlowConsumer):
    def assign(self, partitions: list[Any]) -> None:
        self.assigned = [(tp.partition, tp.offset) for tp in partitions]


def test_a_consumer_that_stops_fetching_is_replaced_and_the_read_completes(
    clock: _Clock,
) -> None:
    # The first consumer reads 0..4 of 10, then fetches nothing ever again (librdkafka
    # after a broker restart); the replacement starts at 5 and reads to the end.
    stuck = _SlowConsumer(clock, {0: 10}, iter([_records(0, 0, 5)]))
    fresh = _AssignRecorder(clock, {0: 10}, iter([_records(0, 5, 10), [_Message(0, 10, True)]]))
    follower = _follower(stuck)
    follower._make_consumer = lambda: cast(Consumer, fresh)  # as if it had made its own
    assert follower.read_to_end(timeout=60) == 10
    assert [offset for _, offset, _ in follower.records] == list(range(10))
    assert fresh.assigned == [(0, 5)]
    assert follower.consumers_replaced == 1


def test_a_consumer_at_the_end_of_an_idle_topic_is_kept(clock: _Clock) -> None:
    consumer = _SlowConsumer(clock, {0: 10}, iter([_records(0, 0, 10), [_Message(0, 10, True)]]))
    follower = _follower(consumer)
    follower._make_consumer = lambda: pytest.fail("an idle consumer at its end was replaced")
    for _ in range(100):  # 100 empty fetches of 0.5 s on the clock: past STALL_SECONDS
        follower.poll()
    assert len(follower.records) == 10 and follower.consumers_replaced == 0
