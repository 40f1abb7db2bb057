"""Runs one scenario to completion and judges it."""

from __future__ import annotations

import random
from dataclasses import dataclass

from kdsync.ordering import OrderingNode, SourceEvent
from kdsync.simulation.checker import EventId, Violation, check_properties
from kdsync.simulation.member import NodeFactory, SimMember
from kdsync.simulation.network import LinkFaults, SimNetwork
from kdsync.simulation.scenario import Scenario


@dataclass(frozen=True)
class Outcome:
    scenario: Scenario
    violations: tuple[Violation, ...]
    events: int
    ticks: int
    messages: int
    settled_after: int | None  # ticks after healing until everything was delivered

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


def run_scenario(scenario: Scenario, factory: NodeFactory = OrderingNode) -> Outcome:
    rng = random.Random(scenario.seed ^ 0x5EED)
    network = SimNetwork(random.Random(rng.getrandbits(64)), scenario.link)
    members = {
        name: SimMember(
            name,
            scenario.group,
            scenario.timing,
            network,
            random.Random(rng.getrandbits(64)),
            factory,
            scenario.max_batch_events,
        )
        for name in scenario.group.members
    }
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
    now = 0
    end_of_faults = scenario.fault_ticks
    deadline = end_of_faults + scenario.settle_ticks
    settled_after: int | None = None
    order = list(members.values())
    while now < deadline:
        now += 1
        while faults and faults[0].at <= now:
            fault = faults.pop(0)
            if fault.kind == "crash":
                for name in fault.members:
                    members[name].crash()
            elif fault.kind == "restart":
                for name in fault.members:
                    if not members[name].up:
                        members[name].start()
            elif fault.kind == "partition":
                network.partition(set(fault.members), set(fault.other_side))
            else:
                network.heal()
        if now == end_of_faults:
            network.heal()
            network.faults = LinkFaults(max_delay=scenario.link.max_delay, reorder=0.01)
            for member in order:
                member.crash_in_ready = 0.0
                if not member.up:
                    member.start()
        if now <= end_of_faults:
            for member in data_members:
                for (topic, partition), events in member.kafka.sources.items():
                    if rng.random() < scenario.produce_rate:
                        key = (member.name, topic, partition)
                        offset = next_offset[key]
                        # Offsets skip now and then, as transaction markers make them do.
                        next_offset[key] = offset + rng.choice((1, 1, 1, 2))
                        event = SourceEvent(
                            offset,
                            None if rng.random() < 0.1 else f"k{offset % 5}".encode(),
                            None if rng.random() < 0.05 else rng.randbytes(rng.randint(0, 8)),
                            (("h", str(now).encode()),) if rng.random() < 0.3 else (),
                            now,
                        )
                        events.append(event)
                        sources[(member.name, topic, partition, offset)] = event
        for sender, receiver, message in network.due(now):
            target = members[receiver]
            if target.node is not None:
                target.node.receive(sender, message)
                target.process(now)
        for member in order:
            if member.node is not None:
                member.node.tick()
                member.read_sources()
                member.process(now)
        if now > end_of_faults and now % 10 == 0 and _complete(data_members, len(sources)):
            settled_after = now - end_of_faults
            break

    globals_by_member = {m.name: m.kafka.globals for m in data_members}
    violations = check_properties(globals_by_member, sources, require_complete=True)
    if settled_after is None and not violations:
        violations.append(
            Violation(
                "progress", "group", f"not complete {scenario.settle_ticks} ticks after healing"
            )
        )
    return Outcome(scenario, tuple(violations), len(sources), now, network.sent, settled_after)


def _complete(data_members: list[SimMember], total: int) -> bool:
    return all(sum(len(s) for s in m.kafka.globals.values()) >= total for m in data_members)
