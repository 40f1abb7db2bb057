"""Runs one scenario to completion and judges it."""

from __future__ import annotations

import random
from dataclasses import dataclass

from kdsync.ordering import GroupSpec, OrderingNode, Role, SourceEvent
from kdsync.simulation.checker import EventId, Violation, check_properties
from kdsync.simulation.member import (
    DriverFactory,
    NodeFactory,
    SimKafka,
    SimMember,
    production_driver,
)
from kdsync.simulation.membership import MembershipOperator
from kdsync.simulation.network import LinkFaults, SimNetwork
from kdsync.simulation.scenario import (
    HALT_TRAFFIC_TICKS,
    TRIGGER_TICKS,
    Fault,
    MembershipStep,
    Scenario,
)


@dataclass(frozen=True)
class Outcome:
    scenario: Scenario
    violations: tuple[Violation, ...]
    events: int
    ticks: int
    messages: int
    settled_after: int | None  # ticks after healing until everything was delivered
    drivers: frozenset[type] = frozenset()  # the driver classes the members ran
    # When the faulty phase ended, with traffic still flowing: committed entries each data
    # member that was up had not applied yet (how far behind a returned member still is).
    unapplied_at_heal: tuple[tuple[str, int], ...] = ()
    # The membership steps completed, each with the tick it completed at.
    membership_done: tuple[tuple[MembershipStep, int], ...] = ()
    # Ordering-log entries each data member read back from its storage (for a lagging
    # peer, or its own applying past max_log_bytes).
    read_back: tuple[tuple[str, int], ...] = ()

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self) -> str:
        head = f"{self.scenario.describe()} events={self.events} ticks={self.ticks}"
        if self.ok:
            return head + " ok"
        lines = [head + " FAILED"] + [f"  {v}" for v in self.violations[:10]]
        lines.append(f"  replay: python -m kdsync.simulation --seed {self.scenario.seed}")
        return "\n".join(lines)


def run_scenario(
    scenario: Scenario,
    factory: NodeFactory = OrderingNode,
    driver_factory: DriverFactory = production_driver,
) -> Outcome:
    rng = random.Random(scenario.seed ^ 0x5EED)
    network = SimNetwork(random.Random(rng.getrandbits(64)), scenario.link)

    def new_member(name: str, group: GroupSpec, kafka: SimKafka | None = None) -> SimMember:
        return SimMember(
            name,
            group,
            scenario.timing,
            network,
            random.Random(rng.getrandbits(64)),
            factory,
            scenario.max_batch_events,
            scenario.limits,
            scenario.costs.get(name),
            driver_factory,
            kafka,
            scenario.product_links,
        )

    members = {name: new_member(name, scenario.group) for name in scenario.group.members}
    data_members = [m for m in members.values() if not m.is_witness]
    sources: dict[EventId, SourceEvent] = {}
    next_offset: dict[tuple[str, str, int], int] = {}
    for member in data_members:
        member.crash_in_ready = scenario.crash_in_ready
        for topic, partitions in scenario.topics:
            for partition in range(partitions):
                member.kafka.sources[(topic, partition)] = []
                next_offset[(member.name, topic, partition)] = 0

    faults = list(scenario.faults)
    armed: list[_Armed] = []
    order = list(members.values())
    clock = [0]

    def start_member(name: str, group: GroupSpec, kafka: SimKafka | None) -> SimMember:
        """A member added by a membership change (its sources start empty)."""
        member = new_member(name, group, kafka)
        members[name] = member
        order.append(member)
        if not member.is_witness:
            member.crash_in_ready = (
                scenario.crash_in_ready if clock[0] < scenario.fault_ticks else 0.0
            )
            data_members.append(member)
            for topic, partitions in scenario.topics:
                for partition in range(partitions):
                    member.kafka.sources[(topic, partition)] = []
                    next_offset[(name, topic, partition)] = 0
        return member

    operator = MembershipOperator(scenario.membership, members, start_member)

    def staying(candidates: list[SimMember]) -> list[SimMember]:
        """Leaving the group (or gone): no new events, nothing owed to it at the end."""
        return [m for m in candidates if m.name not in operator.leaving]

    def produce(at: list[SimMember]) -> None:
        for member in staying(at):
            for (topic, partition), events in member.kafka.sources.items():
                if rng.random() >= scenario.produce_rate:
                    continue
                for _ in range(scenario.burst):
                    key = (member.name, topic, partition)
                    offset = next_offset[key]
                    # Offsets skip now and then, as transaction markers make them do.
                    next_offset[key] = offset + rng.choice((1, 1, 1, 2))
                    event = SourceEvent(
                        offset,
                        None if rng.random() < 0.1 else f"k{offset % 5}".encode(),
                        None if rng.random() < 0.05 else rng.randbytes(rng.randint(0, 8)),
                        (("h", str(clock[0]).encode()),) if rng.random() < 0.3 else (),
                        clock[0],
                    )
                    events.append(event)
                    sources[(member.name, topic, partition, offset)] = event

    def step() -> None:
        clock[0] += 1
        now = clock[0]
        operator.drive(now)
        for sender, receiver, frame in network.due(now):
            if receiver in members:  # (a member added but not started yet: lost)
                origin = members.get(sender)
                run, index = (origin.incarnations, origin.hello_config_index) if origin else (0, 0)
                members[receiver].deliver(sender, frame, run, index)
        for member in order:
            member.step(now)
        if armed:
            armed[:] = [a for a in armed if not a.fire(members, network) and a.until > now]

    def settle(must_complete: list[SimMember], recovered: bool = False) -> int | None:
        """Ticks until every member in ``must_complete`` holds every event (and, with
        ``recovered``, no witness is still recovering), or None past the bound."""
        for waited in range(1, scenario.settle_ticks + 1):
            step()
            if (
                waited % 10 == 0
                and not operator.pending
                and _complete(staying(must_complete), expected_total())
                and not (recovered and _recovering(order))
            ):
                return waited
        return None

    def expected_total() -> int:
        """Every event of a member staying; of one leaving, those the group ordered
        (what the longest stream of a staying member holds: the rest never will be)."""
        if not operator.leaving:
            return len(sources)
        staying_count = sum(1 for key in sources if key[0] not in operator.leaving)
        ordered = max(
            (
                sum(1 for s in m.kafka.globals.values() for d in s if d.origin in operator.leaving)
                for m in staying(data_members)
            ),
            default=0,
        )
        return staying_count + ordered

    # Phase 1: the faulty phase, with traffic into every origin.
    while clock[0] < scenario.fault_ticks:
        while faults and faults[0].at <= clock[0] + 1:
            fault = faults.pop(0)
            if fault.kind in _Armed.KINDS:
                armed.append(_Armed.arm(fault, members, clock[0] + TRIGGER_TICKS))
            else:
                _apply_fault(fault, members, network, operator.removed)
        produce(data_members)
        step()
    committed = max((m.node.status().commit_index for m in order if m.node is not None), default=0)
    unapplied_at_heal = tuple(
        (m.name, committed - m.kafka.ledger.applied_index) for m in data_members if m.up
    )
    # Phase 2: everything heals; every event must reach every data member in bounded time.
    armed.clear()
    network.heal()
    network.faults = LinkFaults(max_delay=scenario.link.max_delay, reorder=0.01)
    for member in order:
        member.crash_in_ready = 0.0
        if not member.up and member.name not in operator.removed:
            member.start()
    # A restarted witness rejoins only when every member answers (docs/ordering.md), so
    # the minority goes down below only once the witnesses have recovered.
    settled_after = settle(data_members, recovered=bool(scenario.minority_down))
    progress: list[str] = []
    if settled_after is None:
        pending = [f"{s.kind} {s.member}" for s in operator.pending]
        waiting = f" (membership changes not done: {pending})" if pending else ""
        progress.append(f"not complete {scenario.settle_ticks} ticks after healing{waiting}")
    elif minority_down := _minority_down(scenario.minority_down, operator, members):
        # Phase 3: a minority stops; the rest keep replicating new traffic among themselves.
        down = [members[name] for name in minority_down]
        for member in down:
            member.crash()
        up = [m for m in data_members if m.up]
        for _ in range(40):
            produce(up)
            step()
        if settle(up) is None:
            progress.append(f"{sorted(minority_down)} down: the majority stalled")
        # Phase 4: the minority returns and catches up.
        for member in down:
            member.start()
        if not progress and settle(data_members) is None:
            progress.append(f"{sorted(minority_down)} did not catch up after return")
    if scenario.halted is not None and scenario.halted not in operator.leaving and not progress:
        # Phase 5: one member's T-global refuses every write. It keeps ordering (it votes,
        # stores, may lead) and offering its own events; the others deliver them all.
        # Traffic runs over the scenario's own faulty links, and the halted member may
        # restart in the middle of it, still halted.
        halted = members[scenario.halted]
        halted.refusing = True
        others = [m for m in staying(data_members) if m is not halted]
        network.faults = scenario.link
        restart_at = scenario.halted_restart_at  # down for 5 ticks, within the traffic
        for tick in range(HALT_TRAFFIC_TICKS):
            if tick == restart_at:
                halted.crash()
            elif restart_at is not None and tick == restart_at + 5:
                halted.start()
            produce(data_members)
            step()
        network.faults = LinkFaults(max_delay=scenario.link.max_delay, reorder=0.01)
        if settle(others) is None:
            progress.append(f"{halted.name} halted: the others did not deliver every event")
        halted.refusing = False
        if not progress and settle(data_members) is None:
            progress.append(f"{halted.name} did not catch up once its T-global took writes")

    globals_by_member = {m.name: m.kafka.globals for m in data_members}
    # A member that left holds a prefix of the stream; events of its own that the group
    # never ordered are owed to nobody.
    ordered = {
        (d.origin, d.topic, d.partition, d.event.offset)
        for m in staying(data_members)
        for stream in m.kafka.globals.values()
        for d in stream
        if d.origin in operator.leaving
    }
    expected = {k: e for k, e in sources.items() if k[0] not in operator.leaving or k in ordered}
    violations = check_properties(
        globals_by_member, expected, require_complete=True, partial=frozenset(operator.leaving)
    )
    for member in data_members:
        violations.extend(
            Violation("positions-ahead", member.name, text)
            for text in member.kafka.positions_ahead[:3]
        )
    if progress and not violations:
        violations.extend(Violation("progress", "group", text) for text in progress)
    drivers = frozenset(type(m.driver) for m in members.values() if m.driver is not None)
    return Outcome(
        scenario,
        tuple(violations),
        len(sources),
        clock[0],
        network.sent,
        settled_after,
        drivers,
        unapplied_at_heal,
        tuple(operator.done),
        tuple((m.name, m.kafka.read_back) for m in data_members),
    )


def _minority_down(
    planned: tuple[str, ...], operator: MembershipOperator, members: dict[str, SimMember]
) -> list[str]:
    """The planned minority, less members that left; fewer if the group shrank, so that
    a majority of the voters in force stays up."""
    # The configuration of the staying member furthest along (one that left may not
    # know it did).
    nodes = [
        m.node for name, m in members.items() if m.node is not None and name not in operator.leaving
    ]
    if not nodes:
        return []
    config = max(nodes, key=lambda node: node.commit_index).config
    down = [n for n in planned if n in config.voters and n not in operator.leaving]
    return down[: (len(config.voters) - 1) // 2]


def _apply_fault(
    fault: Fault, members: dict[str, SimMember], network: SimNetwork, removed: set[str]
) -> None:
    if fault.kind in ("crash-leader", "isolate-leader"):
        leader = _leader(members)
        if leader is None:
            return  # an election is under way: nobody to target
        if fault.kind == "crash-leader":
            members[leader].crash()
        else:
            network.partition({leader}, set(members) - {leader})
    elif fault.kind == "restart-oldest":
        down = [
            (member.down_since, name)
            for name, member in members.items()
            if not member.up and name not in removed
        ]
        if down:
            members[min(down)[1]].start()
    elif fault.kind == "crash":
        for name in fault.members:
            members[name].crash()
    elif fault.kind == "restart":
        for name in fault.members:
            if not members[name].up and name not in removed:
                members[name].start()
    elif fault.kind == "partition":
        network.partition(set(fault.members), set(fault.other_side))
    else:
        network.heal()


@dataclass
class _Armed:
    """A fault waiting for its event: checked at the end of every tick, so it acts in the
    tick the event happens (frames sent in that tick are still in flight, and a
    partition formed now cuts them)."""

    KINDS = frozenset({"crash-after-append", "cut-off-new-leader", "crash-after-commit"})

    kind: str
    until: int
    terms: dict[str, int]  # each member's term when armed
    commits: dict[str, int]  # each member's commit index when armed
    lasts: dict[str, int]  # each member's last log index when armed

    @classmethod
    def arm(cls, fault: Fault, members: dict[str, SimMember], until: int) -> _Armed:
        nodes = {name: m.node for name, m in members.items() if m.node is not None}
        return cls(
            fault.kind,
            until,
            {name: node.term for name, node in nodes.items()},
            {name: node.commit_index for name, node in nodes.items()},
            {name: node.log.last_index for name, node in nodes.items()},
        )

    def fire(self, members: dict[str, SimMember], network: SimNetwork) -> bool:
        """Acts if the event has come; says whether it did. The member dies before the
        frames it sent in this tick leave (they are cut off with it), as a process that
        dies between deciding and flushing its sockets."""
        ceiling = max(self.terms.values(), default=0)
        for name, member in members.items():
            node = member.node
            if node is None or node.role != Role.LEADER:
                continue
            if (
                (self.kind == "cut-off-new-leader" and node.term > ceiling)
                or (
                    self.kind == "crash-after-commit"
                    and node.commit_index > self.commits.get(name, 0)
                )
                or (
                    self.kind == "crash-after-append"
                    and node.log.last_index > self.lasts.get(name, 0)
                )
            ):
                network.partition({name}, set(members) - {name})
                member.crash()
                return True
        return False


def _leader(members: dict[str, SimMember]) -> str | None:
    """The up member that leads in the highest term (a deposed leader may not know yet)."""
    leaders = [
        (m.node.term, name)
        for name, m in members.items()
        if m.node is not None and m.node.role == Role.LEADER
    ]
    return max(leaders)[1] if leaders else None


def _recovering(members: list[SimMember]) -> bool:
    return any(m.node is not None and m.node.role == Role.RECOVERING for m in members)


def _complete(data_members: list[SimMember], total: int) -> bool:
    return all(sum(len(s) for s in m.kafka.globals.values()) >= total for m in data_members)
