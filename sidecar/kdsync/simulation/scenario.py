"""Scenarios: a group shape, a workload and a schedule of faults, all drawn from a seed."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kdsync.driver import DriverLimits
from kdsync.ordering import GroupSpec, Timing
from kdsync.simulation.member import SimCosts
from kdsync.simulation.network import LinkFaults


@dataclass(frozen=True, slots=True)
class Fault:
    at: int
    kind: str  # "crash", "restart", "partition", "heal"
    members: tuple[str, ...] = ()
    other_side: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scenario:
    seed: int
    group: GroupSpec
    timing: Timing
    link: LinkFaults
    topics: tuple[tuple[str, int], ...]  # (topic, partitions)
    produce_rate: float  # chance per tick per source partition of a new event
    fault_ticks: int  # length of the faulty phase; then everything heals
    settle_ticks: int  # progress bound once healed: everything must be delivered by then
    faults: tuple[Fault, ...] = field(default_factory=tuple)
    crash_in_ready: float = 0.0
    max_batch_events: int = 4
    # After healing, these stay down for a while (a minority): the rest must go on.
    minority_down: tuple[str, ...] = ()
    limits: DriverLimits = field(default_factory=DriverLimits)
    costs: dict[str, SimCosts] = field(default_factory=dict)  # by member; default: free

    def describe(self) -> str:
        witnesses = f" witnesses={sorted(self.group.witnesses)}" if self.group.witnesses else ""
        return (
            f"seed={self.seed} members={len(self.group.members)}{witnesses} "
            f"faults={len(self.faults)} down-after={list(self.minority_down)} "
            f"drop={self.link.drop:.2f} dup={self.link.duplicate:.2f} "
            f"reorder={self.link.reorder:.2f} delay<={self.link.max_delay}"
        )


def make_scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    size = rng.choice((2, 3, 3, 3, 5, 5, 7))
    names = tuple(f"m{i}" for i in range(size))
    witnesses: frozenset[str] = frozenset()
    if size == 3 and rng.random() < 0.4:
        witnesses = frozenset({names[-1]})  # the two-regions-plus-witness deployment
    elif size >= 5 and rng.random() < 0.3:
        witnesses = frozenset(names[-rng.randint(1, 2) :])
    group = GroupSpec(names, witnesses)
    link = LinkFaults(
        max_delay=rng.choice((0, 1, 2, 4)),
        drop=rng.choice((0.0, 0.0, 0.02, 0.1, 0.25)),
        duplicate=rng.choice((0.0, 0.0, 0.05, 0.2)),
        reorder=rng.choice((0.0, 0.01, 0.1, 1.0)),
    )
    # As in any Raft deployment, the election timeout must exceed a round trip.
    floor = 4 + 2 * link.max_delay
    election = rng.randint(floor, floor + 8)
    timing = Timing(
        heartbeat_ticks=1,
        election_ticks=election,
        witness_election_factor=rng.choice((1, 2, 3)),
        resend_ticks=election * rng.randint(2, 4),
        max_entries_per_append=rng.choice((2, 8, 64)),
        max_uncommitted=rng.choice((16, 256)),
        max_outbox=rng.choice((4, 32, 256)),
        retained_applied=rng.choice((0, 3, 50)),
    )
    topics = tuple((f"t{i}", rng.randint(1, 2)) for i in range(rng.randint(1, 2)))
    fault_ticks = rng.randint(60, 240)
    faults = _fault_schedule(rng, names, fault_ticks)
    minority: tuple[str, ...] = ()
    if size >= 3 and rng.random() < 0.5:
        minority = tuple(sorted(rng.sample(names, rng.randint(1, (size - 1) // 2))))
    # The driver groups deliveries into transactions and trims the durable log, as the
    # sidecar does, at sizes that make every boundary happen often.
    limits = DriverLimits(
        max_events_per_transaction=rng.choice((1, 8, 64, 50_000)),
        halt_retry_ticks=4,
        retry_ticks=(1, 8),
        trim_ticks=rng.choice((5, 25, 100)),
        trim_margin=4 * timing.retained_applied,
    )
    costs = {
        name: SimCosts(
            persist_ticks=rng.choice((0, 0, 1, 2)),
            transaction_ticks=rng.choice((0, 0, 1, 3)),
            load_ticks=rng.choice((0, 1, 3)),
        )
        for name in names
    }
    return Scenario(
        seed=seed,
        group=group,
        timing=timing,
        link=link,
        topics=topics,
        produce_rate=rng.choice((0.05, 0.15, 0.4)),
        fault_ticks=fault_ticks,
        # Catching up takes round trips, each up to max_delay ticks per hop on slow links.
        settle_ticks=40 * election * (1 + timing.witness_election_factor)
        + 400
        + 50 * link.max_delay,
        faults=faults,
        crash_in_ready=rng.choice((0.0, 0.0, 0.01, 0.05)),
        max_batch_events=rng.choice((1, 4, 16)),
        minority_down=minority,
        limits=limits,
        costs=costs,
    )


def _fault_schedule(rng: random.Random, names: tuple[str, ...], ticks: int) -> tuple[Fault, ...]:
    faults: list[Fault] = []
    for _ in range(rng.randint(0, 6)):
        at = rng.randint(0, ticks)
        kind = rng.choice(("crash", "crash", "partition"))
        if kind == "crash":
            victims = tuple(rng.sample(names, rng.randint(1, len(names))))
            faults.append(Fault(at, "crash", victims))
            faults.append(Fault(min(ticks, at + rng.randint(1, 60)), "restart", victims))
        else:
            shuffled = list(names)
            rng.shuffle(shuffled)
            cut = rng.randint(1, len(names) - 1)
            faults.append(Fault(at, "partition", tuple(shuffled[:cut]), tuple(shuffled[cut:])))
            faults.append(Fault(min(ticks, at + rng.randint(5, 80)), "heal"))
    faults.sort(key=lambda f: f.at)
    return tuple(faults)
