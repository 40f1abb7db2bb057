"""A commit that times out is waited on, never aborted: librdkafka keeps the commit under
way, an abort is refused (``_CONFLICT``) and would wedge the producer for good (seen in a
long fault campaign after a broker kill), and the commit may already have happened."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from kdsync.kafka import global_writer
from kdsync.kafka.errors import CommitOutcomeUnknown, KafkaUnavailable
from kdsync.kafka.global_writer import GlobalWriter
from kdsync.ordering import LedgerState


def timed_out() -> KafkaException:
    return KafkaException(
        KafkaError(KafkaError._TIMED_OUT, "outstanding messages not flushed", retriable=True)
    )


class FakeProducer:
    """Records the transactional calls; ``commit_transaction`` raises what it is given."""

    def __init__(self, commit_errors: Iterator[KafkaException | None]) -> None:
        self.calls: list[str] = []
        self._commit_errors = commit_errors

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append("produce")

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")
        error = next(self._commit_errors)
        if error is not None:
            raise error

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")


def writer_with(producer: FakeProducer) -> GlobalWriter:
    writer = GlobalWriter(
        {"bootstrap.servers": "127.0.0.1:1"}, "g", "m1", lambda t: f"{t}-global", lambda t: 1
    )
    writer._producer = producer  # type: ignore[assignment]
    return writer


def test_a_commit_that_times_out_is_committed_again_not_aborted() -> None:
    producer = FakeProducer(iter([timed_out(), timed_out(), None]))
    writer_with(producer).write([], LedgerState())
    assert producer.calls == ["begin", "produce", "commit", "commit", "commit"]


def test_a_commit_still_unsettled_stops_the_member_without_aborting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(global_writer, "COMMIT_RETRY_SECONDS", 0.0)
    producer = FakeProducer(iter([timed_out()] * 5))
    with pytest.raises(CommitOutcomeUnknown, match="may or may not be there"):
        writer_with(producer).write([], LedgerState())
    assert "abort" not in producer.calls


def test_a_commit_that_requires_an_abort_is_aborted_and_retried_later() -> None:
    abortable = KafkaException(
        KafkaError(KafkaError.INVALID_TXN_STATE, "abort it", txn_requires_abort=True)
    )
    producer = FakeProducer(iter([abortable]))
    with pytest.raises(KafkaUnavailable):
        writer_with(producer).write([], LedgerState())
    assert producer.calls == ["begin", "produce", "commit", "abort"]
