"""A simulated sidecar: the production ``MemberDriver`` and ``OrderingNode`` behind
simulated ports that keep exactly what a member's own Kafka cluster would keep across a
crash (``SimKafka``).

The ports complete after seeded delays, like Kafka round trips and transactions do, and a
crash may strike while any of them is in flight. An in-flight write may or may not have
become durable when its process died (a transaction committed whose answer was lost is
the case that matters most), so a crash decides that with the seed, too.

A member also models the process it runs in, an event loop on a limited CPU: frames wait
in an inbox and cost work to handle (decoding is what costs a real sidecar its CPU). The
loop handles them in turns of at most ``frames_per_turn``; a tick fires only when the loop
is free, so a long turn delays it, and ticks that fall in a busy or stalled stretch are
lost, as the runtime's tick loop loses them. The whole process can also stall for a
while (a paused VM, a garbage collection). And its destination can refuse every write
for a while (``refusing``), as a ``T-global`` that refuses a record too large for it does.

Its frame port links every pair of members, ever (``_SimFrames``); or, with
``product_links``, it is the sidecar's own (``PeerLinks``) over the simulated network
(``_SimTransport``): a member links the members of its startup file and those its
configurations add, and refuses frames from any other unless that member's membership
comes from its log at a configuration index past its own (what its hello says), as the
peer handshake does (its comparison of startup member lists is not modelled); a member
whose removal committed is retired and gets nothing more. The campaign draws one or the
other for each seed (docs/ordering.md, "The simulator").
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from kdsync.driver import (
    FRAMES_PER_TURN,
    DriverLimits,
    DriverPorts,
    MemberDriver,
    SourcePartition,
    WriteFailure,
)
from kdsync.driver.peer_links import PeerLinks
from kdsync.ordering import (
    Configuration,
    DeliveredEvent,
    Delivery,
    Entry,
    GroupSpec,
    HardState,
    LedgerState,
    OrderingNode,
    OriginBatch,
    RecoveredState,
    SourceEvent,
    Timing,
    entry_size,
)
from kdsync.simulation.network import SimNetwork

NodeFactory = Callable[[str, GroupSpec, Timing, int, RecoveredState | None], OrderingNode]
DriverFactory = Callable[
    [OrderingNode, DriverPorts, DriverLimits, LedgerState | None], MemberDriver
]


def production_driver(
    node: OrderingNode, ports: DriverPorts, limits: DriverLimits, ledger: LedgerState | None
) -> MemberDriver:
    return MemberDriver(node, ports, limits, recovered_ledger=ledger)


@dataclass
class SimKafka:
    """The durable state of one data member: what survives a sidecar crash."""

    sources: dict[SourcePartition, list[SourceEvent]] = field(default_factory=dict)
    hard_state: HardState = field(default_factory=HardState)
    log: list[Entry] = field(default_factory=list)  # the internal log topic
    # The ledger is written in the same Kafka transaction as the global topics.
    ledger: LedgerState = field(default_factory=LedgerState)
    globals: dict[str, list[DeliveredEvent]] = field(default_factory=dict)
    committed: dict[SourcePartition, int] = field(default_factory=dict)  # consumer group
    # Source offsets committed beyond what T-global holds (must never happen).
    positions_ahead: list[str] = field(default_factory=list)
    trimmed_below: int = 0  # the internal log topic holds nothing below this index
    read_back: int = 0  # log entries read back from the internal log topic, in all

    def backfill_copy(self, seed: Configuration) -> SimKafka:
        """What a backfill job gives a new member from this one, as the product's does
        (``kdsync.backfill``): its latest ledger and its global topics up to that ledger's
        sequence numbers (the ledger describes them exactly), nothing else. The ledger
        says the configuration in force there, ``seed`` (this member's startup file's)
        if no change was applied yet: the new member must not take its own startup
        file, which names it, for the group it joins."""
        ledger = self.ledger
        if ledger.config is None:
            ledger = replace(ledger, config=seed, config_index=0)
        return SimKafka(
            ledger=ledger,
            globals={
                topic: stream[: ledger.next_seq.get(topic, 0)]
                for topic, stream in self.globals.items()
            },
        )

    def recovered(self) -> RecoveredState:
        """What the sidecar reads back: as kdsync.kafka.log_store does, only the entries
        that run on without a hole from the applied index (a trimmed log may have one)."""
        after = self.ledger.applied_index
        entries: list[Entry] = []
        for entry in sorted((e for e in self.log if e.index > after), key=_index):
            if entry.index != after + 1 + len(entries):
                break
            entries.append(entry)
        return RecoveredState(self.hard_state, self.ledger, tuple(entries), self.trimmed_below)

    def persist(self, hard: HardState | None, entries: list[Entry], start: int | None) -> None:
        if hard is not None:
            self.hard_state = hard
        if start is not None:
            self.log = [e for e in self.log if e.index < start] + entries

    def commit_transaction(self, deliveries: Sequence[Delivery], ledger: LedgerState) -> None:
        for delivery in deliveries:
            for delivered in delivery.events:
                self.globals.setdefault(delivered.topic, []).append(delivered)
        self.ledger = ledger

    def commit_positions(self, member: str, positions: Mapping[SourcePartition, int]) -> None:
        marks = self.ledger.positions_of(member)
        for where, position in positions.items():
            if position > marks.get(where, 0):
                self.positions_ahead.append(
                    f"{where} committed at {position}, T-global holds up to {marks.get(where)}"
                )
            self.committed[where] = max(self.committed.get(where, 0), position)


@dataclass(frozen=True, slots=True)
class SimCosts:
    """How long a member's I/O takes, in ticks, and how much work it does per tick."""

    persist_ticks: int = 0  # internal log write, acks=all
    transaction_ticks: int = 0  # fixed cost of one T-global transaction
    events_per_tick: int = 0  # transaction throughput (0: unlimited)
    load_ticks: int = 0  # reading entries back
    work_per_tick: int = 0  # CPU per tick, in work units (0: unlimited)
    frames_per_turn: int = FRAMES_PER_TURN  # frames handled before a tick may fire
    stalls: tuple[tuple[int, int], ...] = ()  # [start, end) ticks the process is frozen


@dataclass(slots=True)
class _Pending:
    due: int
    kind: str  # "persist", "write", "load"
    apply: Callable[[], None]  # makes the operation durable / reads its result
    complete: Callable[[], None]  # tells the driver


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
        limits: DriverLimits,
        costs: SimCosts | None = None,
        driver_factory: DriverFactory = production_driver,
        kafka: SimKafka | None = None,
        product_links: bool = False,
    ) -> None:
        self.name = name
        self.product_links = product_links
        self.group = group
        self.timing = timing
        self.network = network
        self.rng = rng
        self.factory = factory
        self.driver_factory = driver_factory
        self.max_batch_events = max_batch_events
        self.limits = limits
        self.costs = costs or SimCosts()
        self.is_witness = group.is_witness(name)
        self.kafka = kafka or SimKafka()
        self.driver: MemberDriver | None = None
        self._links: PeerLinks | None = None  # with product_links: the running process's
        self._transport: _SimTransport | None = None
        self.crash_in_ready = 0.0  # chance to die when an operation completes
        self.refusing = False  # T-global refuses every transaction: the member halts
        self.incarnations = 0
        self.now = 0
        self.down_since = 0  # the tick of the last crash (meaningful while down)
        self._inbox: deque[tuple[str, bytes]] = deque()
        self._cpu = 0  # work units left this tick; below zero: a long step runs on
        self._pending: list[_Pending] = []
        self._read: dict[SourcePartition, int] = {}  # the source reader's positions
        self._batches: deque[OriginBatch] = deque()  # the reader's bounded queue
        # Membership changes asked of this member (POST /membership in the sidecar),
        # taken at its next step like any other input, stalls and all.
        self._proposals: deque[Configuration] = deque()
        self.start()

    # ------------------------------------------------------------------ lifecycle

    @property
    def up(self) -> bool:
        return self.driver is not None

    @property
    def node(self) -> OrderingNode | None:
        return self.driver.node if self.driver is not None else None

    def start(self) -> None:
        self.incarnations += 1
        incarnation = self.rng.getrandbits(62)
        recovered = None if self.is_witness else self.kafka.recovered()
        node = self.factory(self.name, self.group, self.timing, incarnation, recovered)
        frames: PeerLinks | _SimFrames = _SimFrames(self)
        if self.product_links:
            # A process starts with the links of its startup file, as the sidecar does.
            self._transport = _SimTransport(self)
            frames = self._links = PeerLinks(self._transport)
        ports = DriverPorts(
            None if self.is_witness else _SimLogPort(self),
            None if self.is_witness else _SimDeliveryPort(self),
            None if self.is_witness else _SimSourcePort(self),
            frames,
        )
        ledger = recovered.ledger if recovered is not None else None
        self.driver = self.driver_factory(node, ports, self.limits, ledger)
        # The source reader resumes at the ledger's marks, as the sidecar's does.
        marks = self.kafka.ledger.positions_of(self.name)
        self._read = {tp: marks.get(tp, 0) for tp in self.kafka.sources}
        self._batches.clear()
        self._inbox.clear()

    def crash(self) -> None:
        """The process dies: in-flight writes are durable or not, as the seed decides."""
        for pending in self._pending:
            if pending.kind != "load" and self.rng.random() < 0.5:
                pending.apply()
        self._pending.clear()
        self._inbox.clear()
        self._batches.clear()
        self._proposals.clear()
        self.driver = None
        self._links = self._transport = None
        self.down_since = self.now

    # ------------------------------------------------------------------ one tick

    def deliver(self, sender: str, frame: bytes, sender_run: int, sender_config_index: int) -> None:
        """A frame arrives; with ``product_links``, from a member this process has no
        link with, it is refused (the handshake's "is not another member"). The first
        frame from each run of the sender (``sender_run``: its starts so far) to this run
        of ours stands for its connection's hello: if the sender's membership comes from
        its log (``sender_config_index`` > 0, the hello's ``membershipChanged``), it is
        told to the links first (``introduce``), which may link a member added while our
        log is behind, or one we retired, as the product's handshake does. A refused
        sender dials again: its next frame is another hello."""
        if self.driver is None:
            return
        transport = self._transport
        if transport is not None and transport.hellos.get(sender) != sender_run:
            if sender_config_index > 0 and transport.introduce is not None:
                transport.introduce(sender, f"{sender}.sim:1", sender_config_index)
            if transport.knows(sender):
                transport.hellos[sender] = sender_run  # a link now: no hello until it ends
        if transport is None or transport.knows(sender):
            self._inbox.append((sender, frame))

    @property
    def hello_config_index(self) -> int:
        """Where this process's configuration stands in its log, as its hello says (0:
        its startup file's, or no product links)."""
        return self._transport.config_index if self._transport is not None else 0

    def propose(self, config: Configuration) -> None:
        """Ask this member for a membership change; it answers at its next step."""
        if self.driver is not None:
            self._proposals.append(config)

    def stalled(self, now: int) -> bool:
        return any(start <= now < end for start, end in self.costs.stalls)

    def step(self, now: int) -> None:
        """One tick of the process: completions, the tick, source reads, then frames in
        turns while CPU is left. A busy loop (a turn that overran) loses the tick."""
        self.now = now
        if self.driver is None or self.stalled(now):
            return
        budget = self.costs.work_per_tick
        if budget:
            self._cpu = min(self._cpu + budget, budget)
            if self._cpu <= 0:
                return  # still inside a long step: this tick is lost
        if not self._complete_due(now):
            return
        driver = self.driver
        assert driver is not None
        while self._proposals:
            driver.propose_configuration(self._proposals.popleft())
        driver.tick()
        if self._links is not None:
            self._links.retire_departed(driver.node)  # as the sidecar does every tick
        if not self.is_witness and (self._read_sources() or self._batches):
            driver.sources_ready()
        while self._inbox and self.driver is not None and (not budget or self._cpu > 0):
            self._handle_turn()

    def _complete_due(self, now: int) -> bool:
        """Completions whose time has come, in order; False when the member crashed."""
        while self._pending and self._pending[0].due <= now:
            pending = self._pending.pop(0)
            if self.crash_in_ready and self.rng.random() < self.crash_in_ready:
                self._pending.insert(0, pending)
                self.crash()
                return False
            pending.apply()
            pending.complete()
            if self.driver is None:
                return False
        return True

    def _handle_turn(self) -> None:
        """Frames back to back, as the runtime's receive loop takes them, up to a turn."""
        for _ in range(self.costs.frames_per_turn):
            if not self._inbox or self.driver is None:
                return
            sender, frame = self._inbox.popleft()
            # Decoding is the work: one unit per frame and per ~128 bytes (a few events).
            self._cpu -= 1 + len(frame) // 128
            self.driver.receive_frame(sender, frame)

    def _read_sources(self) -> bool:
        """The source reader: batches of new events into a bounded queue; True if any."""
        read = False
        for (topic, partition), events in self.kafka.sources.items():
            position = self._read.get((topic, partition), 0)
            first = bisect_left(events, position, key=_offset)
            while first < len(events) and len(self._batches) < 64:
                take = events[first : first + self.rng.randint(1, self.max_batch_events)]
                end = take[-1].offset + 1
                self._batches.append(
                    OriginBatch(self.name, topic, partition, position, end, False, tuple(take))
                )
                position = end
                first += len(take)
                read = True
            self._read[(topic, partition)] = position
        return read

    def _schedule(self, pending: _Pending) -> None:
        # Operations of one kind complete in the order they started (one client each).
        last_due = max((p.due for p in self._pending if p.kind == pending.kind), default=0)
        pending.due = max(pending.due, last_due)
        index = len(self._pending)
        while index > 0 and self._pending[index - 1].due > pending.due:
            index -= 1
        self._pending.insert(index, pending)


class _SimLogPort:
    def __init__(self, member: SimMember) -> None:
        self.m = member

    def persist(
        self, hard_state: HardState | None, entries: list[Entry], truncate_from: int | None
    ) -> None:
        m = self.m
        driver = m.driver
        assert driver is not None
        m._schedule(
            _Pending(
                m.now + m.costs.persist_ticks,
                "persist",
                lambda: m.kafka.persist(hard_state, entries, truncate_from),
                driver.log_persisted,
            )
        )

    def load(self, spans: list[tuple[int, int]], max_bytes: int) -> None:
        m = self.m
        driver = m.driver
        assert driver is not None
        found: list[Entry] = []

        def read() -> None:
            stored = {e.index: e for e in m.kafka.log}
            for first, last in spans:
                budget = max_bytes
                for index in range(first, last + 1):
                    entry = stored.get(index)
                    if entry is None:
                        continue
                    found.append(entry)
                    m.kafka.read_back += 1
                    budget -= entry_size(entry)
                    if budget < 0:
                        break

        m._schedule(
            _Pending(m.now + m.costs.load_ticks, "load", read, lambda: driver.entries_loaded(found))
        )

    def trim(self, below_index: int) -> None:
        kafka = self.m.kafka
        kafka.log = [e for e in kafka.log if e.index >= below_index]
        kafka.trimmed_below = max(kafka.trimmed_below, below_index)


class _SimDeliveryPort:
    def __init__(self, member: SimMember) -> None:
        self.m = member

    def write(self, deliveries: Sequence[Delivery], ledger: LedgerState) -> None:
        m = self.m
        driver = m.driver
        assert driver is not None
        costs = m.costs
        ticks = costs.transaction_ticks
        if costs.events_per_tick:
            ticks += sum(len(d.events) for d in deliveries) // costs.events_per_tick
        if m.refusing:
            m._schedule(
                _Pending(
                    m.now + ticks,
                    "write",
                    lambda: None,
                    lambda: driver.transaction_failed(
                        WriteFailure.TOO_LARGE, "T-global refuses a record (simulated)"
                    ),
                )
            )
            return
        m._schedule(
            _Pending(
                m.now + ticks,
                "write",
                lambda: m.kafka.commit_transaction(deliveries, ledger),
                driver.transaction_committed,
            )
        )


class _SimSourcePort:
    def __init__(self, member: SimMember) -> None:
        self.m = member

    def take(self) -> OriginBatch | None:
        batches = self.m._batches
        return batches.popleft() if batches else None

    def commit(self, positions: Mapping[SourcePartition, int]) -> None:
        self.m.kafka.commit_positions(self.m.name, positions)


class _SimFrames:
    """Frames over the simulated network, which links every pair of members, ever."""

    def __init__(self, member: SimMember) -> None:
        self.m = member

    def send(self, peer: str, frame: bytes) -> bool:
        self.m.network.send(self.m.now, self.m.name, peer, frame)
        return True

    def follow_configuration(self, config: Configuration, index: int) -> None:
        pass

    def reach_members(self, config: Configuration) -> None:
        pass


class _SimTransport:
    """The peer transport's membership over the simulated network: linked with the
    startup file's members and those added since (``add_peer``), nothing for a retired
    one. The receiving member refuses strangers (``SimMember.deliver``)."""

    def __init__(self, member: SimMember) -> None:
        self._m = member
        self.membership_changed = False
        self.introduce: Callable[[str, str, int], bool] | None = None  # set by PeerLinks
        self.config_index = 0
        self.advertised_address: str | None = None
        self.hellos: dict[str, int] = {}  # sender -> its run whose hello we heard
        self._retired: dict[str, bool] = {
            name: False for name in member.group.members if name != member.name
        }

    @property
    def member(self) -> str:
        return self._m.name

    @property
    def peers(self) -> tuple[str, ...]:
        return tuple(self._retired)

    def knows(self, peer: str) -> bool:
        """Linked with ``peer`` (retired or not): its frames are taken."""
        return peer in self._retired

    def send(self, peer: str, frame: bytes) -> bool:
        retired = self._retired.get(peer)
        if retired is None:
            raise ValueError(f"{peer!r} is not another member")  # as TcpTransport.send
        if retired:
            return False
        self._m.network.send(self._m.now, self._m.name, peer, frame)
        return True

    def add_peer(self, peer: str, address: str) -> bool:
        if peer == self._m.name or self._retired.get(peer) is False:
            return False
        self._retired[peer] = False
        return True

    def retire_peer(self, peer: str) -> bool:
        if self._retired.get(peer) is not False:
            return False
        self._retired[peer] = True
        return True


def _offset(event: SourceEvent) -> int:
    return event.offset


def _index(entry: Entry) -> int:
    return entry.index
