"""Reading a partition's watermarks just after its topic was created: its leader may not
be elected yet. A sidecar's first start used to exit on NOT_LEADER_FOR_PARTITION for
its new ledger topic (seen in a benchmark round); it now asks again until its timeout.
Other errors (a topic that does not exist) still fail at once, so a lost T-global is
reported as lost, not after a wait."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from kdsync.kafka.errors import KafkaUnavailable
from kdsync.kafka.partition_reader import watermarks


class Answers:
    def __init__(self, *answers: tuple[int, int] | int) -> None:
        self.answers = list(answers)
        self.asked = 0

    def get_watermark_offsets(self, _partition: Any, **_: Any) -> tuple[int, int]:
        self.asked += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, int):
            raise KafkaException(KafkaError(answer))
        return answer


def test_a_leader_being_elected_is_asked_again() -> None:
    consumer = Answers(KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, (0, 7))
    assert watermarks(consumer, "t", 0, timeout=10) == (0, 7)  # type: ignore[arg-type]
    assert consumer.asked == 3


def test_an_unknown_topic_fails_at_once() -> None:
    consumer = Answers(KafkaError.UNKNOWN_TOPIC_OR_PART)
    with pytest.raises(KafkaUnavailable, match=r"cannot read the offsets of t\[0\]"):
        watermarks(consumer, "t", 0, timeout=10)  # type: ignore[arg-type]
    assert consumer.asked == 1


def test_a_leader_never_elected_fails_at_the_timeout_naming_the_partition() -> None:
    consumer = Answers(KafkaError.NOT_LEADER_FOR_PARTITION)
    with pytest.raises(KafkaUnavailable, match=r"t\[2\].*Not leader|t\[2\].*NOT_LEADER"):
        watermarks(consumer, "t", 2, timeout=0.3)  # type: ignore[arg-type]
    assert consumer.asked >= 2
