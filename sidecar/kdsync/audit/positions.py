"""What to read: offset ranges planned with a plain Kafka client before Spark starts.

Planning fixes the end of every range up front, so Spark reads a stable snapshot and two
members' ranges are comparable. Order matters: each origin's committed source offsets
(consumer group ``kdsync-<group>``) are read **before** the ends of the ``T-global``
topics, so every event below a committed offset was delivered before the snapshot of
``T-global`` was taken (the sidecar commits source offsets in its delivery transaction).
Ends are last stable offsets (read_committed): open transactions are not part of the
snapshot. This is also where an unreachable cluster is found, with a clear message.

The members whose ``T-global`` is read are the members in force, from the ledgers
(``kdsync.audit.membership``); a member that left is read as an origin only, and not at
all once its cluster is gone.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from kdsync import naming
from kdsync.audit.membership import AuditMembership, membership_in_force
from kdsync.audit.state import AuditState
from kdsync.config import MemberConfig, SidecarConfig
from kdsync.kafka.errors import KafkaUnavailable
from kdsync.kafka.ledger_reader import first_seqs, read_latest_ledger, read_seeding
from kdsync.kafka.partition_reader import reading_consumer
from kdsync.ordering import LedgerState

DEFAULT_KAFKA_TIMEOUT = 15.0
# librdkafka's own lines (a refused connection every 50 ms) go here, shown with -v only:
# the error the planning raises already names the member, its servers and the fix, and
# a departed member's cluster being gone is no error at all.
_CLIENT_LOG = logging.getLogger("kdsync.audit.kafka")
_CLIENT_LOG.addHandler(logging.NullHandler())


class KafkaUnreachable(RuntimeError):
    """A member's Kafka cluster did not answer (the message names member and servers)."""


@dataclass(frozen=True)
class TopicRange:
    """Offsets ``[start, end)`` of every partition of one Kafka topic in one member."""

    member: str
    topic: str
    bootstrap: str
    properties: Mapping[str, str]
    start: Mapping[int, int]
    end: Mapping[int, int]
    low: Mapping[int, int] = field(default_factory=dict)
    # Origins only: the committed source offset of kdsync-<group> per partition, or the
    # visible end where the group has not committed: events below it must be replicated.
    expected: Mapping[int, int] = field(default_factory=dict)
    # T-globals of a member seeded by a backfill: the first seq it holds (its hand-over
    # record's firstSeq; 0 for every other member).
    first_seq: int = 0

    @property
    def records(self) -> int:
        """Offsets in the range (records plus transaction markers: an upper bound)."""
        return sum(max(0, self.end[p] - self.start[p]) for p in self.end)

    @property
    def trimmed(self) -> bool:
        """Whether retention already removed the beginning of some partition."""
        return any(offset > 0 for offset in self.low.values())


@dataclass(frozen=True)
class TopicPlan:
    """Everything to read for source topic ``T``."""

    topic: str
    global_topic: str
    globals: tuple[TopicRange, ...]
    origins: tuple[TopicRange, ...]
    # origin member -> partition -> committed offset of kdsync-<group> (None: no commit)
    committed: Mapping[str, Mapping[int, int | None]]


@dataclass(frozen=True)
class AuditPlan:
    group: str
    # The data members in force, whose T-global is read and checked.
    data_members: tuple[str, ...]
    topics: tuple[TopicPlan, ...]
    membership: AuditMembership | None = None
    # Members that left whose cluster did not answer: their origin topics are not read.
    unread: tuple[str, ...] = ()
    # Members in force seeded by a backfill -> their hand-over record (kafka.ledger_reader).
    handovers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def departed(self) -> tuple[str, ...]:
        return () if self.membership is None else self.membership.departed


class _MemberClient:
    """One read_committed consumer per member, used for metadata and offsets only."""

    def __init__(self, group: str, member: MemberConfig, timeout: float) -> None:
        assert member.kafka is not None
        self.group = group
        self.handover: dict[str, Any] | None = None
        self.name = member.name
        self.bootstrap = member.kafka.bootstrap_servers
        self.properties = dict(member.kafka.properties)
        self.timeout = timeout
        self._consumer = Consumer(
            {
                **member.kafka.client_properties(),
                # Never joins: committed() reads the group's offsets without subscribing.
                "group.id": naming.consumer_group(group),
                "client.id": f"kdsync-audit-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "socket.timeout.ms": int(timeout * 1000),
            },
            logger=_CLIENT_LOG,
        )

    def _fail(self, what: str, error: BaseException) -> KafkaUnreachable:
        reason = error.args[0] if error.args else error
        text = reason.str() if hasattr(reason, "str") else str(reason)
        return KafkaUnreachable(
            f"member {self.name}: cannot {what} from Kafka at {self.bootstrap} "
            f"within {self.timeout:g}s ({text}); check that the cluster is up and reachable "
            "and members[].kafka in the config"
        )

    def topics(self) -> dict[str, list[int]]:
        try:
            metadata = self._consumer.list_topics(timeout=self.timeout)
        except KafkaException as error:
            raise self._fail("list topics", error) from None
        return {
            name: sorted(described.partitions)
            for name, described in metadata.topics.items()
            if described.error is None
        }

    def watermarks(self, topic: str, partitions: Iterable[int]) -> dict[int, tuple[int, int]]:
        """partition -> (low watermark, last stable offset)."""
        marks: dict[int, tuple[int, int]] = {}
        for partition in partitions:
            try:
                low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=self.timeout, cached=False
                )
            except KafkaException as error:
                raise self._fail(f"read offsets of {topic}[{partition}]", error) from None
            marks[partition] = (low, high)
        return marks

    def committed(self, topic: str, partitions: Iterable[int]) -> dict[int, int | None]:
        wanted = [TopicPartition(topic, p) for p in partitions]
        if not wanted:
            return {}
        try:
            found = self._consumer.committed(wanted, timeout=self.timeout)
        except KafkaException as error:
            raise self._fail(f"read committed offsets of {topic}", error) from None
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in found}

    def ledger(self, listing: Mapping[str, list[int]]) -> LedgerState | None:
        """The member's latest delivery ledger (None before its first delivery); also
        reads its hand-over record (``handover``) if a backfill seeded it."""
        topic = naming.ledger_topic(self.group)
        if topic not in listing:
            return None
        consumer = reading_consumer(
            self.properties | {"bootstrap.servers": self.bootstrap},
            f"kdsync-audit-{uuid.uuid4().hex[:8]}",
            committed_only=True,
        )
        try:
            latest = read_latest_ledger(consumer, topic, self.timeout)
            if latest is not None:
                self.handover = read_seeding(consumer, topic, self.timeout).handover
            return latest
        except KafkaUnavailable as error:
            raise KafkaUnreachable(
                f"member {self.name}: cannot read the group's ledger {topic} from Kafka at "
                f"{self.bootstrap} ({error}); the audit reads it to learn which members are "
                "in force: allow the audit's principal to read (Describe, Read) that topic"
            ) from None
        finally:
            consumer.close()

    def close(self) -> None:
        self._consumer.close()


def _selected_topics(
    config: SidecarConfig, listings: Iterable[Mapping[str, list[int]]]
) -> list[str]:
    names = set(config.topics.names)
    for listing in listings:
        names.update(name for name in listing if config.topics.selects(name))
    return sorted(names)


def plan_audit(
    config: SidecarConfig,
    state: AuditState | None,
    *,
    timeout: float = DEFAULT_KAFKA_TIMEOUT,
) -> AuditPlan:
    """Plan the ranges to read from every data member in force (and every member that
    left, as an origin, while its cluster answers); ``KafkaUnreachable`` if a member in
    force is down, ``MembershipProblem`` if the ledgers name a member the file lacks."""
    clients = [_MemberClient(config.group, m, timeout) for m in config.data_members]
    try:
        listings: dict[str, dict[str, list[int]]] = {}
        down: dict[str, KafkaUnreachable] = {}
        for client in clients:
            try:
                listings[client.name] = client.topics()
            except KafkaUnreachable as error:
                down[client.name] = error
        ledgers = {c.name: c.ledger(listings[c.name]) for c in clients if c.name in listings}
        membership = membership_in_force([c.name for c in clients], ledgers)
        for name in membership.checked:
            if name in down:
                raise down[name]
        # Members that left are origins while their cluster answers; the rest are checked.
        origin_clients = [c for c in clients if c.name in listings]
        global_clients = [c for c in origin_clients if c.name in membership.checked]
        topics = _selected_topics(config, listings.values())
        plans: list[TopicPlan] = []
        for topic in topics:
            previous = state.topics.get(topic) if state is not None else None
            global_name = config.topics.global_topic(topic)
            committed: dict[str, dict[int, int | None]] = {}
            origins: list[TopicRange] = []
            # 1. origins: committed source offsets first, then their visible ends.
            for client in origin_clients:
                partitions = listings[client.name].get(topic)
                if partitions is None:
                    continue
                commits = client.committed(topic, partitions)
                committed[client.name] = commits
                marks = client.watermarks(topic, partitions)
                start: dict[int, int] = {}
                end: dict[int, int] = {}
                expected: dict[int, int] = {}
                for p in partitions:
                    low, stable = marks[p]
                    upto = commits.get(p)
                    # Read up to the visible end: another member may have delivered an
                    # event its origin has not (yet) committed; its record is there.
                    end[p] = stable
                    expected[p] = stable if upto is None else min(upto, stable)
                    resume = None if previous is None else previous.origin_offset(client.name, p)
                    start[p] = min(max(low, resume if resume is not None else low), end[p])
                origins.append(
                    TopicRange(
                        client.name,
                        topic,
                        client.bootstrap,
                        client.properties,
                        start,
                        end,
                        {p: marks[p][0] for p in partitions},
                        expected,
                    )
                )
            # 2. then the T-global of every member in force.
            globals_: list[TopicRange] = []
            for client in global_clients:
                partitions = listings[client.name].get(global_name)
                if partitions is None:
                    continue
                marks = client.watermarks(global_name, partitions)
                start = {}
                end = {}
                for p in partitions:
                    low, stable = marks[p]
                    resume = None if previous is None else previous.global_offset(client.name, p)
                    end[p] = stable
                    start[p] = min(max(low, resume if resume is not None else low), stable)
                globals_.append(
                    TopicRange(
                        client.name,
                        global_name,
                        client.bootstrap,
                        client.properties,
                        start,
                        end,
                        {p: marks[p][0] for p in partitions},
                        first_seq=first_seqs(client.handover).get(topic, 0),
                    )
                )
            plans.append(TopicPlan(topic, global_name, tuple(globals_), tuple(origins), committed))
        return AuditPlan(
            group=config.group,
            data_members=membership.checked,
            topics=tuple(plans),
            membership=membership,
            unread=tuple(m for m in membership.departed if m not in listings),
            handovers={c.name: c.handover for c in global_clients if c.handover is not None},
        )
    finally:
        for client in clients:
            client.close()
