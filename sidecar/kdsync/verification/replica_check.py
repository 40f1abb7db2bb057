"""Read every member's ``T-global`` and origin ``T`` and check the group's promises.

Checked: every ``T-global`` holds the same records in the same order; sequence numbers
run 0, 1, 2, ... per topic without gaps; every origin record appears exactly once;
records of one origin partition keep their offset order; key, value, headers and
timestamp are those of the origin record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, TopicPartition

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


class TopicFollower:
    """Reads one topic (all partitions, read_committed) incrementally."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"kdsync-verification-{topic}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            }
        )
        self._assigned = False
        self.records: list[tuple[int, int, SourceRecord]] = []  # partition, offset, record

    def _assign(self) -> bool:
        metadata = self._consumer.list_topics(self.topic, timeout=10)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            return False
        self._consumer.assign([TopicPartition(self.topic, p, 0) for p in topic.partitions])
        self._assigned = True
        return True

    def poll(self, max_seconds: float = 0.5) -> int:
        """Read what is available now; returns how many records were added."""
        if not self._assigned and not self._assign():
            return 0
        added = 0
        while True:
            batch = self._consumer.consume(num_messages=10_000, timeout=max_seconds)
            if not batch:
                return added
            for message in batch:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"reading {self.topic}: {error}")
                partition, offset = message.partition(), message.offset()
                assert partition is not None and offset is not None
                _, timestamp = message.timestamp()
                record = SourceRecord(
                    message.key(), message.value(), _headers(message.headers()), timestamp
                )
                self.records.append((partition, offset, record))
                added += 1
            max_seconds = 0.05

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
