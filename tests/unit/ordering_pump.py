"""A tiny deterministic message pump wiring real OrderingNodes together, for the unit
tests of the core.

The pump is lossless: every outbound message is delivered immediately, in the order it
was produced, unless the test cuts or holds the link or the receiver is down. Each
``Ready`` is handled the way a shell must (kdsync.simulation.member): persist hard state
and entries, then send the messages, then answer loads, then write the deliveries and
the ledger, then call ``applied``. A member in ``halted`` keeps what it is handed
unwritten, as one whose ``T-global`` refuses a record does, until ``resume``. Loops are
bounded in ticks, never in wall time.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pytest

from kdsync.ordering import (
    DeliveredEvent,
    Delivery,
    Entry,
    GroupSpec,
    HardState,
    LedgerState,
    Message,
    OrderingNode,
    OriginBatch,
    RecoveredState,
    Role,
    SourceEvent,
    Timing,
)

TIMING = Timing()  # election after 10..20 ticks without a leader
ELECTION_DEADLINE = 10 * TIMING.election_ticks
PUMP_STEP_LIMIT = 1_000_000  # messages per pump: far beyond any test, catches livelock

EventKey = tuple[str, str, int, int]  # origin, topic, partition, offset


@dataclass
class Disk:
    """What a data member's own Kafka cluster keeps across a sidecar crash."""

    hard_state: HardState = field(default_factory=HardState)
    log: list[Entry] = field(default_factory=list)  # the internal log topic
    ledger: LedgerState = field(default_factory=LedgerState)
    delivered: list[DeliveredEvent] = field(default_factory=list)  # T-global, all topics
    sources: dict[tuple[str, int], list[SourceEvent]] = field(default_factory=dict)

    def recovered(self) -> RecoveredState:
        after = self.ledger.applied_index
        return RecoveredState(
            self.hard_state, self.ledger, tuple(e for e in self.log if e.index > after)
        )


class Pump:
    def __init__(
        self,
        group: GroupSpec,
        timing: Timing = TIMING,
        cut: Iterable[tuple[str, str]] = (),
        node_class: type[OrderingNode] = OrderingNode,
    ) -> None:
        self.group = group
        self.timing = timing
        self.node_class = node_class
        # Messages for which this returns True are lost: (sender, receiver, message).
        self.drop: Callable[[str, str, Message], bool] = lambda sender, receiver, message: False
        self.disks = {m: Disk() for m in group.members}
        self.nodes: dict[str, OrderingNode | None] = dict.fromkeys(group.members)
        self.positions: dict[str, dict[tuple[str, int], int]] = {m: {} for m in group.members}
        self.cut = set(cut)  # (sender, receiver) links that drop every message
        self.hold: set[tuple[str, str]] = set()  # links whose messages wait in `held`
        self.held: list[tuple[str, str, Message]] = []
        self.queue: deque[tuple[str, str, Message]] = deque()
        self.ticks = 0
        self.loads_served = 0  # entries read back from a disk
        self.halted: set[str] = set()  # members that write nothing they are handed
        self.unwritten: dict[str, list[tuple[Delivery, LedgerState]]] = {}
        self.leaders_by_term: dict[int, str] = {}
        self.startup_groups: dict[str, GroupSpec] = {}  # members started with another file
        self._incarnations = itertools.count(1)
        self._next_offset: dict[tuple[str, str, int], int] = {}
        for member in group.members:
            self.start(member)

    # ------------------------------------------------------------ membership

    def node(self, member: str) -> OrderingNode:
        node = self.nodes[member]
        assert node is not None, f"{member} is down"
        return node

    def up(self) -> list[OrderingNode]:
        return [n for n in self.nodes.values() if n is not None]

    def start(self, member: str, startup: GroupSpec | None = None) -> None:
        """Start ``member`` (again); ``startup``: the group its startup file lists, for a
        member the pump did not start with (it keeps that file across restarts)."""
        if startup is not None:
            self.startup_groups[member] = startup
            self.nodes.setdefault(member, None)
            self.disks.setdefault(member, Disk())
            self.positions.setdefault(member, {})
        assert self.nodes[member] is None, f"{member} is already up"
        group = self.startup_groups.get(member, self.group)
        witness = group.is_witness(member)
        recovered = None if witness else self.disks[member].recovered()
        node = self.node_class(member, group, self.timing, next(self._incarnations), recovered)
        self.nodes[member] = node
        if not witness:
            # The source consumer resumes from the positions committed with the ledger.
            marks = self.disks[member].ledger.marks
            self.positions[member] = {
                (topic, partition): marks.get((member, topic, partition), 0)
                for topic, partition in self.disks[member].sources
            }
            self._read_sources(member)
        self.pump()

    def _is_witness(self, member: str) -> bool:
        return self.startup_groups.get(member, self.group).is_witness(member)

    def crash(self, member: str) -> None:
        self.nodes[member] = None  # messages in flight to it are lost
        self.unwritten.pop(member, None)  # and so is what it had not written

    # ------------------------------------------------------------ sources

    def produce(self, member: str, count: int, topic: str = "t", partition: int = 0) -> None:
        """Append ``count`` events to ``member``'s source partition and offer them."""
        sources = self.disks[member].sources.setdefault((topic, partition), [])
        for _ in range(count):
            key = (member, topic, partition)
            offset = self._next_offset.get(key, 0)
            self._next_offset[key] = offset + 1
            sources.append(
                SourceEvent(offset, f"{member}-{offset}".encode(), b"v", (), 1000 + offset)
            )
        if self.nodes[member] is not None:
            self._read_sources(member)
            self.pump()

    def _read_sources(self, member: str) -> None:
        node = self.node(member)
        positions = self.positions[member]
        for (topic, partition), events in self.disks[member].sources.items():
            position = positions.get((topic, partition), 0)
            for source in events:
                if source.offset < position:
                    continue
                batch = OriginBatch(
                    member, topic, partition, position, source.offset + 1, False, (source,)
                )
                if not node.offer(batch):
                    break
                position = source.offset + 1
            positions[(topic, partition)] = position

    def produced(self) -> set[EventKey]:
        return {
            (member, topic, partition, event.offset)
            for member, disk in self.disks.items()
            for (topic, partition), events in disk.sources.items()
            for event in events
        }

    # ------------------------------------------------------------ driving

    def pump(self) -> None:
        steps = 0
        while True:
            progressed = False
            for member, node in self.nodes.items():
                if node is not None:
                    progressed |= self._handle(member, node)
            while self.queue:
                sender, receiver, message = self.queue.popleft()
                target = self.nodes.get(receiver)  # (None too: one the pump never runs)
                if (
                    target is None
                    or (sender, receiver) in self.cut
                    or self.drop(sender, receiver, message)
                ):
                    continue
                if (sender, receiver) in self.hold:
                    self.held.append((sender, receiver, message))
                    continue
                target.receive(sender, message)
                self._handle(receiver, target)
                steps += 1
                assert steps < PUMP_STEP_LIMIT, "the group never went quiet: a message storm"
            if not progressed:
                return

    def _handle(self, member: str, node: OrderingNode) -> bool:
        ready = node.ready()
        if ready.is_empty():
            return False
        disk = self.disks[member]
        if not self._is_witness(member):
            if ready.hard_state is not None:
                disk.hard_state = ready.hard_state
            if ready.persist_from is not None:
                disk.log = [e for e in disk.log if e.index < ready.persist_from] + ready.entries
                if disk.log:
                    first = disk.log[0].index
                    indexes = [e.index for e in disk.log]
                    assert indexes == list(range(first, first + len(indexes))), (
                        f"{member} persisted a log with holes: {indexes}"
                    )
            node.persisted(ready.number)
        for out in ready.messages:
            self.queue.append((member, out.to, out.message))
        if ready.loads:
            wanted = {i for first, last in ready.loads for i in range(first, last + 1)}
            loaded = [e for e in disk.log if e.index in wanted]
            self.loads_served += len(loaded)
            node.entries_loaded(loaded)
        if ready.deliveries:
            assert not self._is_witness(member), f"witness {member} delivered events"
            assert ready.ledger is not None
            unwritten = self.unwritten.setdefault(member, [])
            unwritten.extend((d, ready.ledger) for d in ready.deliveries)
            if member not in self.halted:
                self._write(member, node)
        # Only committed entries leave a log's memory: compacted ones count as matching.
        assert node.log.snapshot_index <= node.commit_index, node.status()
        self._check_one_leader_per_term()
        return True

    def _write(self, member: str, node: OrderingNode) -> None:
        unwritten = self.unwritten.pop(member, [])
        if not unwritten:
            return
        disk = self.disks[member]
        for delivery, _ in unwritten:
            disk.delivered.extend(delivery.events)
        disk.ledger = unwritten[-1][1]
        node.applied(unwritten[-1][0].index)

    def resume(self, member: str) -> None:
        """A halted member writes what it holds, and what it is handed from now on."""
        self.halted.discard(member)
        self._write(member, self.node(member))
        self.pump()

    def _check_one_leader_per_term(self) -> None:
        for node in self.up():
            if node.role is Role.LEADER:
                first = self.leaders_by_term.setdefault(node.term, node.member)
                assert first == node.member, f"two leaders in term {node.term}"

    def tick(self, *only: str) -> None:
        """One tick for every live member (or only for the members named)."""
        self.ticks += 1
        for node in self.up():
            if not only or node.member in only:
                node.tick()
        self.pump()

    def release(self, sender: str, receiver: str) -> None:
        """Deliver what a held link kept back, and stop holding it."""
        self.hold.discard((sender, receiver))
        keep = [h for h in self.held if (h[0], h[1]) != (sender, receiver)]
        due = [h for h in self.held if (h[0], h[1]) == (sender, receiver)]
        self.held = keep
        self.queue.extend(due)
        self.pump()

    def run_until(self, done: Callable[[], bool], ticks: int, what: str) -> int:
        """Tick until ``done()``; fail with the group's state after ``ticks`` ticks."""
        for elapsed in range(ticks + 1):
            if done():
                return elapsed
            self.tick()
        pytest.fail(f"{what}: not within {ticks} ticks\n{self.describe()}", pytrace=False)

    # ------------------------------------------------------------ observations

    def leader(self) -> str | None:
        """The leader every live non-recovering member agrees on, if there is one."""
        live = [n for n in self.up() if n.role is not Role.RECOVERING]
        leaders = [n for n in live if n.role is Role.LEADER]
        if len(leaders) != 1:
            return None
        chosen = leaders[0]
        if all(n.leader == chosen.member and n.term == chosen.term for n in live):
            return chosen.member
        return None

    def delivered(self, member: str) -> list[EventKey]:
        return [
            (d.origin, d.topic, d.partition, d.event.offset) for d in self.disks[member].delivered
        ]

    def all_delivered_everywhere(self) -> bool:
        wanted = self.produced()
        return all(
            set(self.delivered(m)) == wanted and self.nodes[m] is not None
            for m in self.group.data_members
        )

    def describe(self) -> str:
        lines = [f"after {self.ticks} ticks, {len(self.produced())} events produced:"]
        for member in self.group.members:
            node = self.nodes[member]
            state = "down" if node is None else str(node.status())
            lines.append(f"  {member}: delivered={len(self.disks[member].delivered)} {state}")
        return "\n".join(lines)


def halted_follower(timing: Timing) -> tuple[Pump, str, str]:
    """A three-member pump with an elected leader and one follower halted (its
    T-global refuses writes): (pump, leader, follower)."""
    pump = Pump(THREE, timing)
    pump.run_until(lambda: pump.leader() is not None, ELECTION_DEADLINE, "election")
    leader = pump.leader()
    assert leader is not None
    follower = next(m for m in THREE.members if m != leader)
    pump.halted.add(follower)
    return pump, leader, follower


def assert_same_order_everywhere(pump: Pump, members: Iterable[str]) -> list[EventKey]:
    streams = {m: pump.disks[m].delivered for m in members}
    reference_member, reference = next(iter(streams.items()))
    for member, stream in streams.items():
        assert stream == reference, (
            f"{member} and {reference_member} delivered different streams:\n"
            f"  {member}: {pump.delivered(member)}\n"
            f"  {reference_member}: {pump.delivered(reference_member)}"
        )
    keys = [(d.origin, d.topic, d.partition, d.event.offset) for d in reference]
    assert len(keys) == len(set(keys)), "an event was delivered twice"
    by_topic: dict[str, list[int]] = {}
    for delivered in reference:
        by_topic.setdefault(delivered.topic, []).append(delivered.seq)
    for topic, seqs in by_topic.items():
        assert seqs == list(range(len(seqs))), f"sequence numbers of {topic} are not 0..n-1"
    by_origin: dict[tuple[str, str, int], list[int]] = {}
    for origin, topic, partition, offset in keys:
        by_origin.setdefault((origin, topic, partition), []).append(offset)
    for where, offsets in by_origin.items():
        assert offsets == sorted(offsets), f"origin order broken for {where}: {offsets}"
    return keys


THREE = GroupSpec(("a", "b", "c"))
WITH_WITNESS = GroupSpec(("a", "b", "w"), witnesses=frozenset({"w"}))
