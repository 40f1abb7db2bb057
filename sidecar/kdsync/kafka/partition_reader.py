"""Read one partition from a position to its current end: recovery and read-back."""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from kdsync.kafka.client_config import client_config
from kdsync.kafka.errors import KafkaUnavailable


def reading_consumer(
    properties: Mapping[str, str],
    group_id: str,
    *,
    committed_only: bool,
    fetch_wait_ms: int | None = None,
) -> Consumer:
    """A consumer that reads by assignment. ``fetch_wait_ms``: how long the broker holds
    a fetch with nothing to return (librdkafka's ``fetch.wait.max.ms``); probes that
    often read at the end of a log lower it, or each such read costs that long (the
    default, 500 ms, unless the user's properties set it)."""
    wait = {} if fetch_wait_ms is None else {"fetch.wait.max.ms": fetch_wait_ms}
    return Consumer(
        client_config(
            properties,
            **wait,
            **{
                "group.id": group_id,
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed" if committed_only else "read_uncommitted",
                "auto.offset.reset": "earliest",
                "fetch.max.bytes": 64 * 1024 * 1024,
                "max.partition.fetch.bytes": 16 * 1024 * 1024,
            },
        )
    )


# Records, and about how many bytes of them, read_to_end takes from the consumer at a
# time (what its fetches brought; it does not wait to fill a batch).
READ_BATCH = 1000
READ_BATCH_BYTES = 1 << 20


def read_available(
    consumer: Consumer, wait_seconds: float, max_records: int, linger_seconds: float = 0.0
) -> list[Message]:
    """The records the consumer has, returned as soon as there is one (or none after
    ``wait_seconds``), with what more arrives within ``linger_seconds`` after it.

    A batch ``consume`` with a timeout returns early only once it holds all of
    ``num_messages``, so at low rates it waits out its timeout. ``poll`` returns with the
    first record; ``consume`` then takes what the same fetch brought along (and, with a
    linger, what comes within it).
    """
    first = consumer.poll(wait_seconds)
    if first is None:
        return []
    if max_records == 1:
        return [first]
    return [first, *consumer.consume(num_messages=max_records - 1, timeout=linger_seconds)]


# A partition whose leader is being elected, as just after its topic was created (seen:
# a sidecar's first start exited on NOT_LEADER_FOR_PARTITION for its new ledger topic).
_LEADER_MOVING = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE})


def _left(deadline: float) -> float:
    """Seconds to the deadline, for a call that must be given some time."""
    return max(deadline - time.monotonic(), 0.1)


def watermarks(consumer: Consumer, topic: str, partition: int, timeout: float) -> tuple[int, int]:
    """The partition's low and high watermarks, asked of its leader; asked again while
    its leader is being elected, until ``timeout``."""
    deadline = time.monotonic() + timeout
    pause = 0.05
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition),
                timeout=_left(deadline),
                cached=False,
            )
            return int(low), int(high)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            moving = isinstance(error, KafkaError) and error.code() in _LEADER_MOVING
            if not moving or deadline - time.monotonic() <= pause:
                raise KafkaUnavailable(
                    f"cannot read the offsets of {topic}[{partition}]: {exc}"
                ) from exc
        time.sleep(pause)  # a backoff before asking again, not a wait for an event
        pause = min(pause * 2, 1.0)


def wait_until_committed_readable(
    properties: Mapping[str, str], group_id: str, topic: str, partition: int, timeout: float
) -> None:
    """Return once a ``read_committed`` reader sees every record ``topic[partition]`` holds
    now. A producer's commit returns once the commit is decided, before the transaction's
    markers reach the partition: until then the last stable offset stays before its
    records, and a reader started at once (``read_to_end``) ends before them. Raises
    KafkaUnavailable after ``timeout``."""
    everything = reading_consumer(properties, group_id, committed_only=False)
    committed = reading_consumer(properties, group_id, committed_only=True)
    try:
        deadline = time.monotonic() + timeout
        _, written = watermarks(everything, topic, partition, timeout)
        while watermarks(committed, topic, partition, _left(deadline))[1] < written:
            if time.monotonic() > deadline:
                raise KafkaUnavailable(
                    f"{topic}[{partition}]: committed records below offset {written} are not "
                    f"readable after {timeout:.0f}s (an open transaction holds them back)"
                )
            time.sleep(0.05)  # polling interval of a condition with a deadline
    finally:
        everything.close()
        committed.close()


def read_to_end(
    consumer: Consumer,
    topic: str,
    partition: int,
    start: int | None = None,
    stop: int | None = None,
    timeout: float = 30.0,
) -> Generator[Message]:
    """Yield the records of ``topic[partition]`` from ``start`` (default: the beginning)
    up to the end as it was when reading started (or ``stop``, exclusive).

    With a read_committed consumer the end is the last stable offset: records of open
    transactions are not waited for, aborted ones are skipped.
    """
    low, high = watermarks(consumer, topic, partition, timeout)
    end = high if stop is None else min(stop, high)
    first = low if start is None else max(start, low)
    if first >= end:
        return
    consumer.assign([TopicPartition(topic, partition, first if first > low else OFFSET_BEGINNING)])
    idle_polls = 0
    position = first
    limit = 1  # records per call, until the first shows how large they are
    try:
        while True:
            # What the consumer holds, a batch per call: each call gives up the GIL and
            # must win it back. With the sidecar's event loop busy, one record per call
            # read about 20 times slower than a batch per call (hack/bench-readback).
            # A batch stops at the end wanted and at about READ_BATCH_BYTES: records taken
            # from librdkafka are copied while it fetches more.
            batch = read_available(consumer, 1.0, max(1, min(limit, end - position)))
            if not batch:
                idle_polls += 1
                if idle_polls > timeout:
                    raise KafkaUnavailable(
                        f"reading {topic}[{partition}] stalled for {timeout:.0f}s "
                        f"before offset {end}"
                    )
                continue
            idle_polls = 0
            largest = max(len(message) for message in batch)
            limit = max(1, min(READ_BATCH, READ_BATCH_BYTES // max(1, largest)))
            for message in batch:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return
                    raise KafkaUnavailable(f"reading {topic}[{partition}] failed: {error}")
                offset = message.offset()
                if offset is not None and offset >= end:
                    return
                yield message
                if offset is not None:
                    if offset >= end - 1:
                        return
                    position = offset + 1
    finally:
        consumer.unassign()
