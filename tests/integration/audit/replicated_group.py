"""Replicated groups written by hand: origin records in each member's ``T``, the same
globally ordered records in every member's ``T-global``, committed source offsets. The
audit is tested against real brokers without a sidecar."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from confluent_kafka import Consumer, TopicPartition

from kdsync import naming
from kdsync.ordering.events import DeliveredEvent, SourceEvent
from kdsync.record_format import to_global_record
from tests.support.plain_kafka import Record, produce_transactionally, read_committed

MEMBERS = ("m1", "m2", "m3")


@dataclass
class ReplicatedGroup:
    """A group of three members replicating one topic, written by hand."""

    group: str
    topic: str
    bootstrap: dict[str, str]
    config_path: Path
    # The agreed history: delivered[seq] is the event at that seq.
    delivered: list[DeliveredEvent] = field(default_factory=list)

    @property
    def global_topic(self) -> str:
        return naming.global_topic(self.topic)

    def produce_origin(self, member: str, count: int, tag: str) -> list[SourceEvent]:
        """Write ``count`` records to ``member``'s T; return them with their offsets."""
        before = {r.offset for r in read_committed(self.bootstrap[member], self.topic)}
        # Recent timestamps: brokers delete records older than retention.ms (7 days) by
        # their CreateTime, which would make the audit see truncated topics.
        now_ms = int(time.time() * 1000)
        records = []
        for i in range(count):
            key = None if i % 3 == 2 else f"{member}-{tag}-k{i}".encode()
            value = None if i % 4 == 3 else f"{member}-{tag}-v{i}".encode()
            headers: tuple[tuple[str, bytes | None], ...] = (
                ("trace", f"{tag}{i}".encode()),
                ("kdsync.seq", b"users-own"),
                ("empty", None),
            )
            records.append(Record(key=key, value=value, headers=headers, timestamp=now_ms + i))
        produce_transactionally(self.bootstrap[member], self.topic, records)
        written = [
            r for r in read_committed(self.bootstrap[member], self.topic) if r.offset not in before
        ]
        return [
            SourceEvent(r.offset, r.key, r.value, tuple(r.headers), r.timestamp) for r in written
        ]

    def deliver(self, order: Sequence[tuple[str, SourceEvent]]) -> list[DeliveredEvent]:
        """Give the next seqs to ``order`` (origin, event) and remember them."""
        fresh = [
            DeliveredEvent(len(self.delivered) + i, origin, self.topic, 0, event)
            for i, (origin, event) in enumerate(order)
        ]
        self.delivered.extend(fresh)
        return fresh

    def write_global(self, member: str, events: Sequence[DeliveredEvent]) -> None:
        records = []
        for event in events:
            rec = to_global_record(event, self.global_topic, 1)
            records.append(
                Record(
                    key=rec.key,
                    value=rec.value,
                    headers=tuple(rec.headers),
                    timestamp=rec.timestamp_ms,
                    partition=rec.partition,
                )
            )
        produce_transactionally(self.bootstrap[member], self.global_topic, records)

    def commit_source_offsets(self, member: str, below_seq: int | None = None) -> None:
        """Commit kdsync-<group>'s offset on ``member``'s T past its last delivered event
        (only events below ``below_seq``: what that member's sidecar has written)."""
        mine = [
            d.event.offset
            for d in self.delivered
            if d.origin == member and (below_seq is None or d.seq < below_seq)
        ]
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap[member],
                "group.id": naming.consumer_group(self.group),
                "enable.auto.commit": False,
            }
        )
        try:
            consumer.commit(
                offsets=[TopicPartition(self.topic, 0, max(mine) + 1)], asynchronous=False
            )
        finally:
            consumer.close()

    def add_round(self, per_member: int, tag: str) -> list[DeliveredEvent]:
        """Every member writes ``per_member`` events; they are ordered round-robin, except
        that the first origin's 2nd and 3rd events are adjacent (a same-partition pair)."""
        produced = {m: self.produce_origin(m, per_member, tag) for m in MEMBERS}
        order: list[tuple[str, SourceEvent]] = []
        queue = {m: list(events) for m, events in produced.items()}
        first = MEMBERS[0]
        step = 0
        while any(queue.values()):
            for m in MEMBERS:
                take = 2 if (m == first and step == 1) else 1
                for _ in range(take):
                    if queue[m]:
                        order.append((m, queue[m].pop(0)))
            step += 1
        return self.deliver(order)

    def replicate(self, events: Sequence[DeliveredEvent], skip: Sequence[str] = ()) -> None:
        for member in MEMBERS:
            if member not in skip:
                self.write_global(member, events)
        for member in MEMBERS:
            self.commit_source_offsets(member)


def write_config(
    path: Path, group: str, topic: str, bootstrap: dict[str, str], members: Sequence[str]
) -> Path:
    data = {
        "group": group,
        "member": members[0],
        "insecure": True,
        "members": [
            {
                "name": m,
                "peer": f"127.0.0.1:{7400 + i}",
                "kafka": {"bootstrapServers": bootstrap[m]},
            }
            for i, m in enumerate(members)
        ],
        "topics": {"names": [topic]},
    }
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path
