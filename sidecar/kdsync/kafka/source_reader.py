"""Reads the member's own source topics into origin batches for the ordering core.

A background thread consumes read_committed with manual positions (no offset commits of
its own: positions are committed in the delivery transaction, once the events they cover
are in ``T-global``). It starts each partition at the ledger's mark for this origin, or at
the beginning, and cuts batches of consecutive events per partition. Batches wait in a
bounded queue, so a group that cannot order (no majority) stops the reading.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from kdsync import naming
from kdsync.kafka.client_config import client_config
from kdsync.kafka.topics import ClusterTopics
from kdsync.ordering import OriginBatch, SourceEvent

log = logging.getLogger(__name__)

_DISCOVERY_SECONDS = 5.0
_ENDS_SECONDS = 1.0  # how often end offsets are refreshed for the record-lag metric


class SourceReader:
    def __init__(
        self,
        properties: Mapping[str, str],
        group: str,
        member: str,
        topics: ClusterTopics,
        selects: Callable[[str], bool],
        start_positions: Mapping[tuple[str, int], int],
        max_batch_events: int,
        max_batch_bytes: int,
        on_batches: Callable[[], None],
        queue_batches: int = 64,
    ) -> None:
        self._member = member
        self._selects = selects
        self._start = dict(start_positions)
        self._max_events = max_batch_events
        self._max_bytes = max_batch_bytes
        self._on_batches = on_batches
        self.batches: queue.Queue[OriginBatch] = queue.Queue(maxsize=queue_batches)
        self._consumer = Consumer(
            client_config(
                properties,
                **{
                    "group.id": naming.consumer_group(group),
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "isolation.level": "read_committed",
                    # A position outside the partition is decided here, not by the
                    # client (see _out_of_range): resetting silently to the start of a
                    # recreated topic would make its new records look like ones
                    # already replicated, and the group would drop them as duplicates.
                    "auto.offset.reset": "error",
                    "client.id": f"kdsync-{group}-{member}-source",
                    "max.partition.fetch.bytes": 16 * 1024 * 1024,
                    # New events should not wait for a fuller fetch: latency over throughput.
                    "fetch.wait.max.ms": 100,
                },
            )
        )
        self._topics = topics  # shared with the sidecar: one admin client per cluster
        self._assigned: dict[tuple[str, int], int] = {}  # partition -> next position to offer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kdsync-source", daemon=True)
        self._close_lock = threading.Lock()
        self._closed = False
        self._to_commit: dict[tuple[str, int], int] | None = None
        self._ends: dict[tuple[str, int], int] = {}
        self.errors = 0
        self.last_error: str | None = None
        # Partitions no longer read, with why: their log ends before what was replicated.
        self.stopped: dict[tuple[str, int], str] = {}

    def commit(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Record positions in the consumer group (after they are in T-global), for lag
        monitoring and audits. The reader thread commits them between reads: the client
        serialises calls on one consumer, so committing from the event loop would stall
        it. The ledger, not the group, is what a restart resumes from."""
        self._to_commit = dict(positions)

    def _commit_pending(self) -> None:
        positions, self._to_commit = self._to_commit, None
        if not positions:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            self._note_error(f"committing source offsets: {exc}")

    def start(self) -> None:
        self._discover()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self._thread.is_alive():
            # Still inside a metadata call (its broker unreachable, up to 30 s): closing the
            # consumer under it would make its next call raise. It closes it on its way out.
            log.info("the source reader is still waiting on Kafka; it stops when that returns")
            return
        self._close_consumer()

    def _close_consumer(self) -> None:
        with self._close_lock:
            if not self._closed:
                self._closed = True
                self._consumer.close()

    def positions(self) -> dict[tuple[str, int], int]:
        return dict(self._assigned)

    def end_offsets(self) -> dict[tuple[str, int], int]:
        """End offsets of the partitions read, as of the latest fetch (refreshed by the
        reader thread about once a second: calls on the consumer from another thread
        would wait for its poll)."""
        return dict(self._ends)

    def _refresh_ends(self) -> None:
        ends: dict[tuple[str, int], int] = {}
        for topic, partition in list(self._assigned):
            try:
                _, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), cached=True
                )
            except KafkaException:
                continue
            if high >= 0:
                ends[(topic, partition)] = int(high)
        self._ends = ends

    def _discover(self) -> None:
        found = self._topics.source_partitions(self._selects)
        new: list[TopicPartition] = []
        for topic, count in sorted(found.items()):
            for partition in range(count):
                where = (topic, partition)
                if where in self._assigned:
                    continue
                start = self._start.get(where)
                new.append(
                    TopicPartition(topic, partition, OFFSET_BEGINNING if start is None else start)
                )
                self._assigned[where] = 0 if start is None else start
        if new:
            log.info(
                "reading %d new source partition(s): %s",
                len(new),
                ", ".join(f"{t.topic}[{t.partition}]" for t in new),
            )
            self._consumer.incremental_assign(new)

    def _run(self) -> None:
        try:
            self._read_until_stopped()
        finally:
            if self._stop.is_set():
                self._close_consumer()

    def _read_until_stopped(self) -> None:
        next_discovery = time.monotonic() + _DISCOVERY_SECONDS
        next_ends = time.monotonic()
        while not self._stop.is_set():
            if time.monotonic() >= next_ends:
                next_ends = time.monotonic() + _ENDS_SECONDS
                self._refresh_ends()
            if time.monotonic() >= next_discovery:
                next_discovery = time.monotonic() + _DISCOVERY_SECONDS
                try:
                    self._discover()
                except Exception as exc:  # discovery is retried; reading goes on
                    self._note_error(f"topic discovery failed: {exc}")
            self._commit_pending()
            messages = self._consumer.consume(num_messages=self._max_events, timeout=0.1)
            if messages:
                self._publish(messages)

    def _note_error(self, text: str) -> None:
        self.errors += 1
        self.last_error = text
        log.warning("%s", text)

    def _publish(self, messages: list[Message]) -> None:
        by_partition, failed = events_by_partition(messages)
        for message in failed:
            error = message.error()
            assert error is not None
            if error.code() == KafkaError._AUTO_OFFSET_RESET:
                self._out_of_range(message.topic(), message.partition())
            elif error.code() != KafkaError._PARTITION_EOF:
                self._note_error(f"reading sources: {error}")
        for where, events in by_partition.items():
            self._cut(where, events)
        self._on_batches()

    def _out_of_range(self, topic: str | None, partition: int | None) -> None:
        """The next position to read is outside the partition's log: records were deleted
        before kdsync read them (retention), or the log is shorter than what kdsync has
        replicated (the topic was deleted and recreated, or truncated)."""
        if topic is None or partition is None or (topic, partition) in self.stopped:
            return
        where = (topic, partition)
        position = self._assigned.get(where, 0)
        try:
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=10, cached=False
            )
        except KafkaException as exc:
            self._note_error(f"{topic}[{partition}]: position {position} is out of range ({exc})")
            return
        if high < position:
            reason = (
                f"source {topic}[{partition}] ends at offset {high}, but kdsync has already "
                f"replicated it up to offset {position}: the topic was deleted and recreated, "
                "or truncated. kdsync stops reading this partition rather than take its new "
                "records for ones already replicated; they stay in the topic, unreplicated. "
                "Fix: write new events to a topic of another name (a recreated topic is a "
                "new source to kdsync), or see docs/operations.md on recreated source topics"
            )
            self.stopped[where] = reason
            self._consumer.pause([TopicPartition(topic, partition)])
            self.errors += 1
            self.last_error = reason
            log.error("%s", reason)
            return
        if low <= position:  # back in range meanwhile (the log grew): read on from there
            self._consumer.incremental_unassign([TopicPartition(topic, partition)])
            self._consumer.incremental_assign([TopicPartition(topic, partition, position)])
            return
        # Records below ``low`` were deleted before kdsync read them: lost at the source.
        self._note_error(
            f"source {topic}[{partition}]: records {position}..{low - 1} were deleted (by "
            "retention) before kdsync read them, so no member will have them; reading goes "
            f"on from offset {low}. Fix: keep the source's retention longer than a "
            "member may be down"
        )
        self._consumer.incremental_unassign([TopicPartition(topic, partition)])
        self._consumer.incremental_assign([TopicPartition(topic, partition, low)])

    def _cut(self, where: tuple[str, int], events: list[SourceEvent]) -> None:
        topic, partition = where
        position = self._assigned.get(where, events[0].offset)
        chunk: list[SourceEvent] = []
        size = 0
        for event in events:
            event_size = 24 + len(event.key or b"") + len(event.value or b"")
            if chunk and (size + event_size > self._max_bytes or len(chunk) >= self._max_events):
                position = self._put(topic, partition, position, chunk)
                chunk, size = [], 0
            chunk.append(event)
            size += event_size
        if chunk:
            position = self._put(topic, partition, position, chunk)
        self._assigned[where] = position

    def _put(self, topic: str, partition: int, start: int, events: list[SourceEvent]) -> int:
        end = events[-1].offset + 1
        batch = OriginBatch(self._member, topic, partition, start, end, False, tuple(events))
        while not self._stop.is_set():
            try:
                self.batches.put(batch, timeout=0.2)
                break
            except queue.Full:
                self._on_batches()
        return end


def events_by_partition(
    messages: list[Message],
) -> tuple[dict[tuple[str, int], list[SourceEvent]], list[Message]]:
    """The consumed records as events by (topic, partition), in offset order, and the
    messages that carry an error instead of a record.

    This runs once per event read. The client returns consumed headers as a list of
    (name, bytes | None) pairs, so they are kept as they come; the NamedTuple is built with
    tuple.__new__, which skips its Python-level constructor."""
    # Keyed by what the client returns, which it types as optional but always sets on a
    # record without an error.
    by_partition: dict[Any, list[SourceEvent]] = {}
    failed: list[Message] = []
    new = tuple.__new__
    for message in messages:
        if message.error() is not None:
            failed.append(message)
            continue
        where = (message.topic(), message.partition())
        events = by_partition.get(where)
        if events is None:
            events = by_partition[where] = []
        headers = message.headers()
        events.append(
            new(
                SourceEvent,
                (
                    message.offset(),
                    message.key(),
                    message.value(),
                    tuple(headers) if headers else (),
                    max(message.timestamp()[1], 0),
                ),
            )
        )
    return by_partition, failed
