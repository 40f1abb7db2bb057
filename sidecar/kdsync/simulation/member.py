"""A simulated sidecar: the real ``OrderingNode`` inside a shell that keeps exactly what
a member's own Kafka cluster would keep across a crash (``SimKafka``)."""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

from kdsync.ordering import (
    DeliveredEvent,
    Entry,
    GroupSpec,
    HardState,
    LedgerState,
    OrderingNode,
    OriginBatch,
    Ready,
    RecoveredState,
    SourceEvent,
    Timing,
)
from kdsync.simulation.network import SimNetwork

NodeFactory = Callable[[str, GroupSpec, Timing, int, RecoveredState | None], OrderingNode]


@dataclass
class SimKafka:
    """The durable state of one data member: what survives a sidecar crash."""

    sources: dict[tuple[str, int], list[SourceEvent]] = field(default_factory=dict)
    hard_state: HardState = field(default_factory=HardState)
    log: list[Entry] = field(default_factory=list)  # the internal log topic
    # The ledger is written in the same Kafka transaction as the global topics.
    ledger: LedgerState = field(default_factory=LedgerState)
    globals: dict[str, list[DeliveredEvent]] = field(default_factory=dict)
    committed: dict[tuple[str, int], int] = field(default_factory=dict)  # source positions

    def recovered(self) -> RecoveredState:
        after = self.ledger.applied_index
        entries = tuple(e for e in self.log if e.index > after)
        return RecoveredState(self.hard_state, self.ledger, entries)


class CrashPoint(Exception):
    """Raised inside ready-processing to model a crash between two of its steps."""


class SimMember:
    def __init__(
        self,
        name: str,
        group: GroupSpec,
        timing: Timing,
        network: SimNetwork,
        rng: random.Random,
        factory: NodeFactory,
        max_batch_events: int,
    ) -> None:
        self.name = name
        self.group = group
        self.timing = timing
        self.network = network
        self.rng = rng
        self.factory = factory
        self.max_batch_events = max_batch_events
        self.is_witness = group.is_witness(name)
        self.kafka = SimKafka()
        self.node: OrderingNode | None = None
        self.positions: dict[tuple[str, int], int] = {}
        self.crash_in_ready = 0.0  # chance to die part-way through handling a Ready
        self.incarnations = 0
        self.start()

    @property
    def up(self) -> bool:
        return self.node is not None

    def start(self) -> None:
        self.incarnations += 1
        incarnation = self.rng.getrandbits(62)
        recovered = None if self.is_witness else self.kafka.recovered()
        self.node = self.factory(self.name, self.group, self.timing, incarnation, recovered)
        # The source consumer resumes from the positions committed with the last delivery.
        self.positions = {tp: self.kafka.committed.get(tp, 0) for tp in self.kafka.sources}

    def crash(self) -> None:
        self.node = None

    def process(self, now: int) -> None:
        """Drive the node's outputs the way the real shell does, in the same order."""
        node = self.node
        if node is None:
            return
        for _ in range(64):  # loads can produce another Ready; bounded for safety
            ready = node.ready()
            if ready.is_empty():
                return
            try:
                self._handle(now, node, ready)
            except CrashPoint:
                self.crash()
                return

    def _maybe_crash(self) -> None:
        if self.crash_in_ready and self.rng.random() < self.crash_in_ready:
            raise CrashPoint

    def _handle(self, now: int, node: OrderingNode, ready: Ready) -> None:
        kafka = self.kafka
        if not self.is_witness:
            if ready.hard_state is not None:
                kafka.hard_state = ready.hard_state
            if ready.persist_from is not None:
                keep = [e for e in kafka.log if e.index < ready.persist_from]
                kafka.log = keep + ready.entries
            self._maybe_crash()
        for out in ready.messages:
            self.network.send(now, self.name, out.to, out.message)
        if ready.loads:
            wanted = {i for first, last in ready.loads for i in range(first, last + 1)}
            node.entries_loaded([e for e in kafka.log if e.index in wanted])
        if ready.deliveries:
            self._maybe_crash()
            assert ready.ledger is not None
            # One Kafka transaction: global topics, the ledger and our source offsets.
            for delivery in ready.deliveries:
                for delivered in delivery.events:
                    kafka.globals.setdefault(delivered.topic, []).append(delivered)
            kafka.ledger = ready.ledger
            for (origin, topic, partition), mark in ready.ledger.marks.items():
                if origin == self.name:
                    kafka.committed[(topic, partition)] = mark
            node.applied(ready.deliveries[-1].index)

    def read_sources(self) -> None:
        """The source consumer: offer new events of our topics in batches."""
        node = self.node
        if node is None or self.is_witness:
            return
        for (topic, partition), events in self.kafka.sources.items():
            position = self.positions.get((topic, partition), 0)
            first = bisect_left(events, position, key=_offset)
            while first < len(events):
                take = events[first : first + self.rng.randint(1, self.max_batch_events)]
                end = take[-1].offset + 1
                batch = OriginBatch(self.name, topic, partition, position, end, False, tuple(take))
                if not node.offer(batch):
                    break
                position = end
                first += len(take)
            self.positions[(topic, partition)] = position


def _offset(event: SourceEvent) -> int:
    return event.offset
