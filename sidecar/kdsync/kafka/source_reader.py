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
from kdsync.kafka.partition_reader import read_available
from kdsync.kafka.topics import ClusterTopics
from kdsync.ordering import OriginBatch, SourceEvent
from kdsync.ordering.events import EVENT_OVERHEAD_BYTES, header_bytes

log = logging.getLogger(__name__)

_DISCOVERY_SECONDS = 5.0
# The longest one read waits for a first record, so the loop's other work gets its turn.
_TURN_SECONDS = 0.1
_ENDS_SECONDS = 1.0  # how often end offsets are refreshed for the record-lag metric
# A partition with committed records beyond what was read, and nothing read for this long,
# gets a new consumer (see _check_stalled); checked this often.
_STALL_SECONDS = 30.0
_STALL_CHECK_SECONDS = 10.0
# The largest event kdsync carries. An event travels alone in its origin batch, which
# crosses the peer port as one frame and is stored as one ordering-log record, both capped
# at 64 MiB (transport/framing.py, topics.LOG_TOPIC_CONFIG); half of that leaves room for
# the envelope and for a replication message's other entries. A larger event is stopped
# at the source with a reason instead of failing the sidecar each time it is read.
MAX_EVENT_BYTES = 32 * 1024 * 1024
_LARGE_EVENT_BYTES = 1024 * 1024


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
        linger_ms: int = 100,
        queue_batches: int = 64,
        consumer_factory: Callable[[dict[str, Any]], Consumer] = Consumer,
        stall_seconds: float = _STALL_SECONDS,
    ) -> None:
        """``consumer_factory`` and ``stall_seconds`` are for tests of the stall check."""
        self._member = member
        self._selects = selects
        self._start = dict(start_positions)
        self._max_events = max_batch_events
        self._max_bytes = max_batch_bytes
        self._linger_seconds = linger_ms / 1000
        self._on_batches = on_batches
        self.batches: queue.Queue[OriginBatch] = queue.Queue(maxsize=queue_batches)
        config = client_config(
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
        self._make_consumer: Callable[[], Consumer] = lambda: consumer_factory(config)
        self._stall_seconds = stall_seconds
        self._stall_check_seconds = min(_STALL_CHECK_SECONDS, stall_seconds / 3)
        self._consumer = self._make_consumer()
        self.consumers_replaced = 0
        self.failure: str | None = None  # why the reading thread ended, if not stopped
        self._topics = topics  # shared with the sidecar: one admin client per cluster
        self._assigned: dict[tuple[str, int], int] = {}  # partition -> next position to offer
        # Partitions still to be read from their beginning (nothing read yet), and when
        # each last moved forward (for _check_stalled).
        self._from_beginning: set[tuple[str, int]] = set()
        self._progress_at: dict[tuple[str, int], float] = {}
        self._quiet_ends: dict[tuple[str, int], int] = {}  # last stable offsets last asked
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kdsync-source", daemon=True)
        self._close_lock = threading.Lock()
        self._closed = False
        self._to_commit: dict[tuple[str, int], int] | None = None
        self._ends: dict[tuple[str, int], int] = {}
        self.errors = 0
        self.last_error: str | None = None
        # When the reader thread last returned from the client (monotonic): a reader stuck
        # inside a client call shows in /status as a growing age.
        self.read_at = time.monotonic()
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
                if start is None:
                    self._from_beginning.add(where)
                self._progress_at[where] = time.monotonic()
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
        except Exception as exc:
            # Not caught, it would end this thread alone: the sidecar would run on while
            # its cluster's events silently stopped entering the order. It stops instead
            # (exit 1, restarted by its supervisor, reading on from the ledger's positions).
            log.exception("the source reader failed")
            self.failure = f"the source reader failed: {exc!r}"
            self._on_batches()  # wakes the sidecar's loop, which sees the failure
        finally:
            if self._stop.is_set():
                self._close_consumer()

    def _read_until_stopped(self) -> None:
        next_discovery = time.monotonic() + _DISCOVERY_SECONDS
        next_ends = time.monotonic()
        next_stall_check = time.monotonic() + self._stall_check_seconds
        while not self._stop.is_set():
            if time.monotonic() >= next_stall_check:
                next_stall_check = time.monotonic() + self._stall_check_seconds
                self._check_stalled()
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
            messages = self._read_batch()
            self.read_at = time.monotonic()
            if messages:
                self._publish(messages)

    def _read_batch(self) -> list[Message]:
        """The next records, after waiting up to the linger for a fuller batch.

        A batch consume returns early only with all of num_messages, so at low rates its
        timeout is the linger (counted from the call). A linger shorter than the loop's
        turn first waits for one record, so an idle reader does not spin."""
        linger = self._linger_seconds
        if linger >= _TURN_SECONDS:
            return self._consumer.consume(num_messages=self._max_events, timeout=linger)
        return read_available(self._consumer, _TURN_SECONDS, self._max_events, linger)

    def _check_stalled(self) -> None:
        """Replace the consumer when it has stopped fetching.

        After its broker restarts, a librdkafka consumer that uses assign() can stop
        fetching a partition for good while reporting nothing (librdkafka issues 5153 and
        4492; seen here in the broker-restart test). That member's events would silently
        stop entering the order. So a partition with nothing read for _STALL_SECONDS is
        compared with its last stable offset, asked through the admin client; a new
        consumer reads on from the same positions (nothing skipped, nothing read twice).

        Stuck means: nothing read for _STALL_SECONDS while the last stable offset grew
        past the position. An idle partition's offset does not grow, and the growth test
        needs no exact position (transaction markers and deleted records sit between the
        last record read and that offset), so a healthy consumer is never replaced."""
        now = time.monotonic()
        quiet = [
            where
            for where, at in self._progress_at.items()
            if now - at >= self._stall_seconds and where not in self.stopped
        ]
        if not quiet:
            return
        try:
            ends = self._topics.committed_ends(quiet)
        except (KafkaException, TimeoutError):
            return  # the brokers do not answer: not a stuck consumer; asked again later
        stuck: dict[tuple[str, int], tuple[int, int]] = {}
        for where in quiet:
            self._progress_at[where] = now
            before, end = self._quiet_ends.get(where), ends.get(where)
            if end is None:
                continue
            self._quiet_ends[where] = end
            position = self._assigned[where]
            if before is not None and end > before and end > position:
                stuck[where] = (position, end)
        if stuck:
            self._note_error(
                "the source consumer stopped fetching although committed records wait "
                "(partition: position, last stable offset) "
                + ", ".join(f"{t}[{p}]: {a}, {b}" for (t, p), (a, b) in sorted(stuck.items()))
                + f", nothing read for {self._stall_seconds:.0f}s while more was committed; "
                "replaced it, reading on from "
                "the same positions"
            )
            self._replace_consumer()

    def _replace_consumer(self) -> None:
        old = self._consumer
        self._consumer = self._make_consumer()
        self.consumers_replaced += 1
        reading = [
            TopicPartition(t, p, OFFSET_BEGINNING if (t, p) in self._from_beginning else offset)
            for (t, p), offset in self._assigned.items()
            if (t, p) not in self.stopped
        ]
        if reading:
            self._consumer.incremental_assign(reading)
        # Closing the stuck client may wait on it: not in the reading thread.
        threading.Thread(
            target=_close_quietly, args=(old,), name="kdsync-source-close", daemon=True
        ).start()

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
        now = time.monotonic()
        for where, events in by_partition.items():
            if where in self.stopped:
                continue  # fetched before the pause took effect
            self._progress_at[where] = now
            self._quiet_ends.pop(where, None)
            self._from_beginning.discard(where)
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
            self._stop_reading(where, reason)
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

    def _stop_reading(self, where: tuple[str, int], reason: str) -> None:
        """Reads no more of this partition, for the reason given (until a restart)."""
        self.stopped[where] = reason
        self._consumer.pause([TopicPartition(*where)])
        self.errors += 1
        self.last_error = reason
        log.error("%s", reason)

    def _cut(self, where: tuple[str, int], events: list[SourceEvent]) -> None:
        topic, partition = where
        position = self._assigned.get(where, events[0].offset)
        chunk: list[SourceEvent] = []
        size = 0
        for event in events:
            event_size = EVENT_OVERHEAD_BYTES + len(event.key or b"") + len(event.value or b"")
            if event_size > _LARGE_EVENT_BYTES:  # rare: only large events count headers
                event_size += header_bytes(event.headers)
                if event_size > MAX_EVENT_BYTES:
                    if chunk:
                        position = self._put(topic, partition, position, chunk)
                    self._assigned[where] = position
                    self._stop_reading(
                        where, _too_large(topic, partition, event.offset, event_size)
                    )
                    return
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


def _too_large(topic: str, partition: int, offset: int, size: int) -> str:
    limit_mib = MAX_EVENT_BYTES // (1024 * 1024)
    return (
        f"source {topic}[{partition}] offset {offset}: an event of {size} bytes is over the "
        f"{MAX_EVENT_BYTES} bytes ({limit_mib} MiB) kdsync carries per event. kdsync stops "
        "reading this partition at that event: it and the events after it stay in the "
        "topic, unreplicated; the events before it are replicated as usual. Fix: keep "
        f"events under {limit_mib} MiB (a large payload belongs in object storage, with a "
        "reference in the event); to go on past this one without it, delete it from the "
        f"source (kafka-delete-records.sh, offset {offset + 1} for {topic} partition "
        f"{partition}; no member will then have it) and restart this sidecar"
    )


def _close_quietly(consumer: Consumer) -> None:
    try:
        consumer.close()
    except (KafkaException, RuntimeError) as exc:
        log.info("closing a replaced source consumer: %s", exc)


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
