"""Read every member's ``T-global`` and origin ``T`` and check the group's promises.

Checked: every ``T-global`` holds the same records in the same order; sequence numbers
run 0, 1, 2, ... per topic without gaps; every origin record appears exactly once;
records of one origin partition keep their offset order; key, value, headers and
timestamp are those of the origin record.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

log = logging.getLogger(__name__)

# A consumer that has read nothing this long while its partitions hold more is replaced.
STALL_SECONDS = 30.0

_OWN = ("kdsync.seq", "kdsync.origin", "kdsync.topic", "kdsync.partition", "kdsync.offset")

Headers = tuple[tuple[str, bytes | None], ...]
Coordinates = tuple[str, str, int, int]  # origin member, topic, partition, offset


@dataclass(frozen=True, slots=True)
class SourceRecord:
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class GlobalRecord:
    partition: int
    seq: int
    coordinates: Coordinates
    record: SourceRecord


@dataclass
class CheckResult:
    events: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _headers(raw: object) -> Headers:
    pairs = raw or []
    return tuple(
        (str(name), value.encode() if isinstance(value, str) else value)
        for name, value in pairs  # type: ignore[attr-defined]
    )


class IncompleteRead(RuntimeError):
    """A topic could not be read to its end offsets before the deadline."""


class TopicFollower:
    """Reads one topic (all partitions, read_committed) incrementally.

    ``read_to_end`` is what a check must use: it takes every partition's end offset
    first and reads until the consumer has reached it, so a slow broker or a busy
    machine can delay the check but never make it see a shortened topic. ``poll`` reads
    whatever is available now, for progress counters only.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        consumer: Consumer | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> None:
        """``properties``: extra librdkafka properties, e.g. a secured cluster's
        ``security.protocol``, ``sasl.*`` and ``ssl.*``."""
        self.topic = topic
        self.bootstrap = bootstrap
        config = {
            **(properties or {}),
            "bootstrap.servers": bootstrap,
            "group.id": f"kdsync-verification-{topic}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
        # A consumer handed in is kept; one made here is replaced when it stops fetching.
        self._make_consumer = None if consumer is not None else (lambda: Consumer(config))
        self._consumer = consumer or Consumer(config)
        self._partitions: list[int] = []
        self._reached: dict[int, int] = {}  # partition -> offset of the last end-of-partition
        self._next: dict[int, int] = {}  # partition -> next offset to read
        self._moved_at = time.monotonic()  # when a record or an end was last read
        self.consumers_replaced = 0
        self.records: list[tuple[int, int, SourceRecord]] = []  # partition, offset, record

    def _assign(self) -> bool:
        metadata = self._consumer.list_topics(self.topic, timeout=10)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            return False
        self._partitions = sorted(topic.partitions)
        self._consumer.assign([TopicPartition(self.topic, p, 0) for p in self._partitions])
        return True

    def poll(self, max_seconds: float = 0.5) -> int:
        """Read what is available now; returns how many records were added."""
        if not self._partitions and not self._assign():
            return 0
        added = 0
        while True:
            batch = self._consumer.consume(num_messages=10_000, timeout=max_seconds)
            if not batch:
                self._unstick()
                return added
            added += self._take(batch)
            max_seconds = 0.05

    def read_to_end(self, timeout: float = 60.0) -> int:
        """Read every partition up to the end offset it has now; returns how many records
        were added. Raises IncompleteRead, naming each partition and how far it got, when
        ``timeout`` seconds pass without progress (no record read, no end reached): a big
        topic on a busy machine may take long, a topic that stops moving may not."""
        if not self._partitions and not self._assign():
            raise IncompleteRead(f"topic {self.topic} does not exist at {self.bootstrap}")
        # For a read_committed consumer the end is reached when the fetcher reports the
        # end of the partition at or past this offset: after the last commit marker too.
        ends = {
            p: int(
                self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=max(1.0, timeout), cached=False
                )[1]
            )
            for p in self._partitions
        }
        added = 0
        last_progress = time.monotonic()
        while any(self._reached.get(p, -1) < end for p, end in ends.items() if end > 0):
            left = last_progress + timeout - time.monotonic()
            if left <= 0:
                read_to: dict[int, int] = {}
                for partition, offset, _ in self.records:
                    read_to[partition] = offset + 1
                behind = {
                    p: f"read to {read_to.get(p, 0)} of {end}"
                    for p, end in ends.items()
                    if self._reached.get(p, -1) < end and end > 0
                }
                raise IncompleteRead(
                    f"{self.topic} at {self.bootstrap}: no progress for {timeout:.0f}s before "
                    f"its end (partition: offset read to, of end) {behind}; an open "
                    "transaction or an unreachable broker holds it back"
                )
            batch = self._consumer.consume(num_messages=10_000, timeout=min(left, 1.0))
            if batch:  # records, or a partition's end reached: both are progress
                last_progress = time.monotonic()
            else:
                self._unstick()
            added += self._take(batch)
        return added

    def _unstick(self) -> None:
        """Replace the consumer if it has read nothing for STALL_SECONDS while its
        partitions hold more: after a broker restart librdkafka can stop fetching an
        assigned partition for good, reporting nothing (see SourceReader._check_stalled),
        and a check would then wait out its deadline on a topic that is complete."""
        if self._make_consumer is None or time.monotonic() - self._moved_at < STALL_SECONDS:
            return
        self._moved_at = time.monotonic()
        behind: list[int] = []
        for p in self._partitions:
            try:
                _, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=5.0, cached=False
                )
            except KafkaException:
                return  # the broker does not answer: not a stuck consumer
            if high > self._next.get(p, 0):
                behind.append(p)
        if not behind:
            return
        log.warning(
            "%s at %s: nothing read for %.0fs although partitions %s hold more; "
            "replacing the consumer",
            self.topic,
            self.bootstrap,
            STALL_SECONDS,
            behind,
        )
        old, self._consumer = self._consumer, self._make_consumer()
        self.consumers_replaced += 1
        self._consumer.assign(
            [TopicPartition(self.topic, p, self._next.get(p, 0)) for p in self._partitions]
        )
        # Closing the stuck client may wait on it.
        threading.Thread(target=old.close, daemon=True).start()

    def _take(self, batch: list[Message]) -> int:
        added = 0
        if batch:
            self._moved_at = time.monotonic()
        for message in batch:
            error = message.error()
            partition, offset = message.partition(), message.offset()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    if partition is not None and offset is not None:
                        self._reached[partition] = max(self._reached.get(partition, 0), offset)
                        self._next[partition] = max(self._next.get(partition, 0), offset)
                    continue
                raise RuntimeError(f"reading {self.topic}: {error}")
            assert partition is not None and offset is not None
            _, timestamp = message.timestamp()
            record = SourceRecord(
                message.key(), message.value(), _headers(message.headers()), timestamp
            )
            self.records.append((partition, offset, record))
            self._next[partition] = offset + 1
            added += 1
        return added

    def close(self) -> None:
        self._consumer.close()


def parse_global(partition: int, record: SourceRecord) -> GlobalRecord:
    headers = record.headers
    tail = [name for name, _ in headers[-len(_OWN) :]]
    if tuple(tail) != _OWN:
        raise ValueError(f"a T-global record without kdsync headers: {headers!r}")
    values = [v or b"" for _, v in headers[-len(_OWN) :]]
    seq = int(values[0])
    coordinates = (values[1].decode(), values[2].decode(), int(values[3]), int(values[4]))
    user = SourceRecord(record.key, record.value, headers[: -len(_OWN)], record.timestamp_ms)
    return GlobalRecord(partition, seq, coordinates, user)


def global_order(rows: Iterable[tuple[int, int, SourceRecord]]) -> list[GlobalRecord]:
    """Records of a ``T-global`` in sequence order (partitions merged by ``kdsync.seq``)."""
    parsed = [parse_global(partition, record) for partition, _, record in rows]
    return sorted(parsed, key=lambda r: r.seq)


def check_group(
    topic: str,
    globals_by_member: Mapping[str, list[GlobalRecord]],
    origins: Mapping[str, Mapping[tuple[int, int], SourceRecord]],
    max_problems: int = 20,
) -> CheckResult:
    """``globals_by_member``: each member's T-global in seq order; ``origins``: each data
    member's source records of ``topic`` by (partition, offset)."""
    result = CheckResult()

    def problem(text: str) -> None:
        if len(result.problems) < max_problems:
            result.problems.append(text)

    members = sorted(globals_by_member)
    reference_member = members[0]
    reference = globals_by_member[reference_member]
    result.events = len(reference)
    for member in members[1:]:
        other = globals_by_member[member]
        if len(other) != len(reference):
            problem(
                f"{member} has {len(other)} events in T-global, {reference_member} "
                f"has {len(reference)}"
            )
        for mine, theirs in zip(reference, other, strict=False):
            if mine != theirs:
                problem(
                    f"seq {mine.seq}: {reference_member} has {mine.coordinates}, "
                    f"{member} has {theirs.coordinates} (seq {theirs.seq})"
                )
                break
    seen: set[Coordinates] = set()
    last_offset: dict[tuple[str, str, int], int] = {}
    for position, row in enumerate(reference):
        if row.seq != position:
            problem(f"sequence gap or repeat: position {position} holds seq {row.seq}")
        if row.coordinates in seen:
            problem(f"seq {row.seq}: {row.coordinates} delivered twice")
        seen.add(row.coordinates)
        origin, source_topic, partition, offset = row.coordinates
        if source_topic != topic:
            problem(f"seq {row.seq}: from topic {source_topic}, expected {topic}")
        where = (origin, source_topic, partition)
        if last_offset.get(where, -1) >= offset:
            problem(f"seq {row.seq}: {where} offset {offset} after {last_offset[where]}")
        last_offset[where] = offset
        source = origins.get(origin, {}).get((partition, offset))
        if source is None:
            problem(f"seq {row.seq}: {row.coordinates} is not a record of any origin")
        elif source != row.record:
            problem(f"seq {row.seq}: {row.coordinates} differs from the origin record")
    for origin, records in origins.items():
        missing = [(p, o) for (p, o) in records if (origin, topic, p, o) not in seen]
        if missing:
            problem(
                f"{len(missing)} event(s) of {origin} never delivered, e.g. {sorted(missing)[:3]}"
            )
    return result
