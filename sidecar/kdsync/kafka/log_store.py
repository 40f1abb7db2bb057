"""The ordering core's durable log, kept in the member's own cluster.

One single-partition topic ``kdsync-<group>.log.internal`` holds two kinds of records,
both written by an idempotent producer and acknowledged by all in-sync replicas before
the core may send anything that depends on them:

- ``hard`` records: the term and vote (the latest one counts);
- ``entry`` records: log entries. An entry with index ``i`` replaces the entry ``i`` and
  truncates everything after it, exactly as a Raft follower overwrites a conflicting
  suffix. Reading the topic in order therefore rebuilds the log.

Records below the point every data member has stored and this member has applied are
deleted from time to time (``trim``), after rewriting the hard state above that point.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from kdsync import naming
from kdsync.kafka.client_config import admin_config, client_config
from kdsync.kafka.errors import KafkaUnavailable
from kdsync.kafka.partition_reader import read_to_end, reading_consumer
from kdsync.kafka.produce_pacing import PACED_PRODUCER, RECORD_FRAMING, must_flush
from kdsync.ordering import Entry, HardState
from kdsync.wire_format.records import (
    decode_entry,
    decode_hard_state,
    encode_entry,
    encode_hard_state,
)

log = logging.getLogger(__name__)

HARD_KEY = b"hard"
ENTRY_KEY = b"entry"
TRUNCATE_KEY = b"truncate"  # value: decimal index; drops that entry and all after it


@dataclass(frozen=True, slots=True)
class RecoveredLog:
    hard_state: HardState
    entries: tuple[Entry, ...]  # contiguous, after ``after``
    after: int
    trimmed_below: int = 0  # records were deleted: the topic holds no entry below this


class LogStore:
    def __init__(self, properties: Mapping[str, str], group: str, member: str) -> None:
        self._properties = dict(properties)
        self._topic = naming.log_topic(group)
        self._group_id = f"{naming.consumer_group(group)}.{member}.log-reader"
        self._producer = Producer(
            client_config(
                self._properties,
                **{
                    "enable.idempotence": True,
                    "acks": "all",
                    **PACED_PRODUCER,  # persist() flushes: sent at once
                    "message.max.bytes": 64 * 1024 * 1024,
                    "client.id": f"kdsync-{group}-{member}-log",
                },
            )
        )
        self._offsets: dict[int, int] = {}  # entry index -> offset of its latest record
        self._hard_offset = -1
        self._hard_state = HardState()
        self._lock = threading.Lock()  # delivery callbacks vs. readers of _offsets
        self._errors: list[str] = []

    @property
    def topic(self) -> str:
        return self._topic

    def recover(self, after: int) -> RecoveredLog:
        """Read the whole log back; keep the entries after ``after`` (the applied index)."""
        consumer = reading_consumer(self._properties, self._group_id, committed_only=False)
        hard = HardState()
        entries: dict[int, Entry] = {}
        last = 0
        first_offset: int | None = None
        try:
            for message in read_to_end(consumer, self._topic, 0):
                key, value, offset = message.key(), message.value(), message.offset()
                assert value is not None and offset is not None
                if first_offset is None:
                    first_offset = offset
                if key == HARD_KEY:
                    hard = decode_hard_state(value)
                    self._hard_offset = offset
                elif key == TRUNCATE_KEY:
                    cut = int(value)
                    for index in range(cut, last + 1):
                        entries.pop(index, None)
                        self._offsets.pop(index, None)
                    last = min(last, cut - 1)
                elif key == ENTRY_KEY:
                    entry = decode_entry(value)
                    if entry.index <= last:
                        # A rewritten suffix: drop what it replaces.
                        for index in range(entry.index, last + 1):
                            entries.pop(index, None)
                            self._offsets.pop(index, None)
                    last = entry.index
                    self._offsets[entry.index] = offset
                    if entry.index > after:
                        entries[entry.index] = entry
        finally:
            consumer.close()
        self._hard_state = hard
        kept = [entries[i] for i in sorted(entries)]
        # Only a contiguous run right after the applied index is usable.
        contiguous: list[Entry] = []
        for entry in kept:
            if entry.index != after + 1 + len(contiguous):
                break
            contiguous.append(entry)
        if len(contiguous) < len(kept):
            log.warning(
                "log topic %s has a hole after index %d; later entries come from the leader",
                self._topic,
                after + len(contiguous),
            )
        # Records were deleted (by trim(), or retention set by hand): the lowest entry held.
        trimmed = min(self._offsets, default=0) if first_offset else 0
        return RecoveredLog(hard, tuple(contiguous), after, trimmed)

    def persist(
        self, hard_state: HardState | None, entries: list[Entry], truncate_from: int | None = None
    ) -> None:
        """Write and wait until the cluster has acknowledged everything (blocking).

        ``entries`` replace the log from ``truncate_from`` on (their first index); with no
        entries, a truncation record says the log ends before ``truncate_from``.
        """
        if hard_state is not None:
            self._produce(HARD_KEY, encode_hard_state(hard_state), None)
            self._hard_state = hard_state
        if truncate_from is not None and not entries:
            self._produce(TRUNCATE_KEY, str(truncate_from).encode(), None)
        queued = 0
        for entry in entries:
            value = encode_entry(entry)
            size = RECORD_FRAMING + len(ENTRY_KEY) + len(value)
            if must_flush(queued, size):
                # One batch at a time (kdsync.kafka.produce_pacing); order is kept.
                self._flush()
                queued = 0
            self._produce(ENTRY_KEY, value, entry.index)
            queued += size
        self._flush()

    def _produce(self, key: bytes, value: bytes, index: int | None) -> None:
        def on_delivery(error: object, message: object) -> None:
            if error is not None:
                self._errors.append(str(error))
                return
            offset = message.offset()  # type: ignore[attr-defined]
            with self._lock:
                if key == HARD_KEY:
                    self._hard_offset = max(self._hard_offset, offset)
                elif index is not None:
                    self._offsets[index] = offset

        while True:
            try:
                self._producer.produce(
                    self._topic, value=value, key=key, partition=0, on_delivery=on_delivery
                )
                return
            except BufferError:
                # flush, not poll: with the long linger a half-full batch would wait.
                self._producer.flush(0.05)

    def _flush(self) -> None:
        remaining = self._producer.flush(60.0)
        if self._errors or remaining:
            errors, self._errors = self._errors, []
            raise KafkaUnavailable(
                f"could not store the ordering log in {self._topic}: "
                f"{errors[0] if errors else f'{remaining} record(s) unacknowledged after 60s'}"
            )

    def load(self, first: int, last: int, max_bytes: int) -> list[Entry]:
        """Read entries ``first..last`` back, in order, for peers behind our in-memory
        log or our own applying. Stops once more than ``max_bytes`` of records are read
        (at least one entry)."""
        with self._lock:
            wanted = {i: self._offsets[i] for i in range(first, last + 1) if i in self._offsets}
        if not wanted:
            return []
        by_offset = {offset: index for index, offset in wanted.items()}
        consumer = reading_consumer(self._properties, self._group_id, committed_only=False)
        found: list[Entry] = []
        read = 0
        try:
            for message in read_to_end(
                consumer, self._topic, 0, min(by_offset), max(by_offset) + 1
            ):
                offset = message.offset()
                value = message.value()
                if offset in by_offset and value is not None:
                    found.append(decode_entry(value))
                    read += len(value)
                    if read > max_bytes:
                        break
        finally:
            consumer.close()
        return found

    def trim(self, below_index: int) -> None:
        """Delete records of entries below ``below_index`` (blocking; best effort)."""
        with self._lock:
            offsets = [o for i, o in self._offsets.items() if i >= below_index]
            if not offsets:
                return
            cut = min(offsets)
            stale = [i for i in self._offsets if i < below_index]
        if cut <= 0:
            return
        if self._hard_offset < cut:
            # The latest hard state must survive the cut: write it again above it.
            self.persist(self._hard_state, [])
        admin = AdminClient(admin_config(self._properties))
        try:
            futures = admin.delete_records([TopicPartition(self._topic, 0, cut)])
            for future in futures.values():
                future.result(timeout=30)
        except (KafkaException, TimeoutError) as exc:
            # Best effort: a broker away for 30 s (TimeoutError from the future) is retried
            # on the next trim like any other failure.
            log.warning("could not trim %s below offset %d: %r", self._topic, cut, exc)
            return
        with self._lock:
            for index in stale:
                self._offsets.pop(index, None)

    def close(self) -> None:
        self._producer.flush(10.0)
