"""Scenarios: a group shape, a workload and a schedule of faults, all drawn from a seed."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from kdsync.driver import DriverLimits
from kdsync.ordering import GroupSpec, Timing
from kdsync.simulation.member import SimCosts
from kdsync.simulation.network import LinkFaults


@dataclass(frozen=True, slots=True)
class Fault:
    at: int
    # "crash", "restart", "partition", "heal"; and, with their target chosen when they
    # happen, "crash-leader", "isolate-leader" (cut off from every other member) and
    # "restart-oldest" (the member down the longest). Three are armed at ``at`` and fire
    # on an event in the tick it happens, within ``TRIGGER_TICKS``: "crash-after-append"
    # (a leader dies once its log grew), "cut-off-new-leader" (the next leader elected
    # dies) and "crash-after-commit" (a leader dies once its commit index moved); each
    # before the frames it sent in that tick leave (it stays cut off until a heal).
    kind: str
    members: tuple[str, ...] = ()
    other_side: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MembershipStep:
    """From tick ``at`` on: "add-data" (a learner, then a voter), "add-witness" or
    "remove" ``member``; each step starts once the one before it is done."""

    at: int
    kind: str
    member: str


TRIGGER_TICKS = 200  # an armed fault whose event does not come by then is dropped
HALT_TRAFFIC_TICKS = 40  # ticks of traffic while a member is halted


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
    # Then this data member's T-global refuses every write for a while: it halts, and the
    # others must still deliver every event, its own included.
    halted: str | None = None
    halted_restart_at: int | None = None  # ... crashed at this tick of its traffic, restarted
    limits: DriverLimits = field(default_factory=DriverLimits)
    costs: dict[str, SimCosts] = field(default_factory=dict)  # by member; default: free
    burst: int = 1  # events per source partition each time one is produced
    shape: str = "faults"  # or "overload", "churn"
    membership: tuple[MembershipStep, ...] = ()
    # Members link as the sidecar's PeerLinks do (simulation.member); in half the campaign.
    product_links: bool = False

    def describe(self) -> str:
        witnesses = f" witnesses={sorted(self.group.witnesses)}" if self.group.witnesses else ""
        changes = "".join(f" {s.kind}={s.member}@{s.at}" for s in self.membership)
        return (
            f"seed={self.seed} {self.shape} members={len(self.group.members)}{witnesses}{changes} "
            f"faults={len(self.faults)} down-after={list(self.minority_down)} "
            f"halted-after={self.halted} restart-halted={self.halted_restart_at} "
            f"drop={self.link.drop:.2f} dup={self.link.duplicate:.2f} "
            f"reorder={self.link.reorder:.2f} delay<={self.link.max_delay}"
            + (" product-links" if self.product_links else "")
        )


def make_scenario(seed: int) -> Scenario:
    """Seven in ten scenarios stress faults (crashes, partitions, a bad network); two in
    ten stress load: a burst far above what the members can write, slow transactions,
    frame handling within a CPU budget and a member whose process stalls; one in ten
    churns leaders: whoever leads is crashed or cut off soon after its election, while
    entries of its term and the one before are only partly replicated."""
    rng = random.Random(seed)
    draw = rng.random()
    if draw < 0.2:
        scenario = _overload_scenario(seed, rng)
    elif draw < 0.3:
        scenario = _churn_scenario(seed, rng)
    else:
        scenario = _fault_scenario(seed, rng)
    # A restarted witness's recovery answers come in parts of at most this many bytes:
    # one entry each, a few, or whole. Drawn apart so the rest of each seed stays as it was.
    parts = random.Random(f"recover-{seed}").choice((1, 200, 1 << 24))
    # A data member keeps this much of its log in memory (none, a few entries, all) and
    # reads back this much at a time (a few entries, all): compacted committed
    # entries are read back from its ordering log to be applied or sent. A leader
    # admits batches while its uncommitted ones hold less than a few entries' or 64 MiB.
    memory = random.Random(f"log-memory-{seed}")
    timing = replace(
        scenario.timing,
        max_recover_bytes=parts,
        max_log_bytes=memory.choice((0, 2000, 1 << 26)),
        max_load_bytes=memory.choice((300, 1 << 24)),
        max_uncommitted_bytes=memory.choice((3000, 1 << 26)),
    )
    # In three in ten, a member halts once the group has healed (drawn apart, as above),
    # and in half of those it also restarts while halted.
    halt = random.Random(f"halt-{seed}")
    halted = halt.choice(scenario.group.data_members) if halt.random() < 0.3 else None
    restart_at = halt.randint(0, HALT_TRAFFIC_TICKS - 10) if halt.random() < 0.5 else None
    # In three in ten, members are added and removed during the faulty phase (drawn
    # apart, as above): the checks hold over every configuration the group goes through.
    changes = random.Random(f"membership-{seed}")
    membership: tuple[MembershipStep, ...] = ()
    settle = scenario.settle_ticks
    if changes.random() < 0.3:
        membership = _membership_plan(changes, scenario.group, scenario.fault_ticks)
        # Each change waits for an election or a catch-up at worst.
        settle += len(membership) * 40 * timing.election_ticks
    # In half, a member starts a T-global transaction at most every 1 or 3 ticks
    # (ordering.transactionIntervalMs; drawn apart, as above): a backlog is then written
    # one transaction per interval, each full or cut at a chunk's end (counted twice).
    interval = random.Random(f"transaction-interval-{seed}").choice((0, 0, 1, 3))
    if interval:
        ticks = scenario.fault_ticks + 40 + HALT_TRAFFIC_TICKS  # of traffic, at most
        partitions = _source_partitions(scenario.topics, scenario.group)
        per_tick = scenario.produce_rate * scenario.burst * partitions
        full = round(per_tick * ticks) // scenario.limits.max_events_per_transaction
        settle += interval * (2 * full + 1)
    # In half, members link as the sidecar's peer links do, refusing whom the handshake
    # refuses; in the others every pair is linked, which lets the core meet frames the
    # product's links keep from it (drawn apart, as above; docs/ordering.md).
    product_links = random.Random(f"links-{seed}").random() < 0.5
    return replace(
        scenario,
        product_links=product_links,
        timing=timing,
        halted=halted,
        halted_restart_at=restart_at,
        membership=membership,
        settle_ticks=settle,
        limits=replace(scenario.limits, transaction_interval_ticks=interval),
    )


def _source_partitions(topics: tuple[tuple[str, int], ...], group: GroupSpec) -> int:
    """Source partitions over the data members: where events are produced each tick."""
    return sum(count for _, count in topics) * len(group.data_members)


def _membership_plan(
    rng: random.Random, group: GroupSpec, fault_ticks: int
) -> tuple[MembershipStep, ...]:
    """One to three changes, each keeping at least two voters and more data voters than
    witnesses, the group at most 7 strong. New members are named on from the last."""
    voters = list(group.members)
    witnesses = set(group.witnesses)
    named = len(voters)
    steps: list[MembershipStep] = []
    for _ in range(rng.randint(1, 3)):
        data_voters = [m for m in voters if m not in witnesses]
        options: list[str] = []
        if len(voters) < 7:
            options.append("add-data")
            if len(witnesses) + 1 < len(data_voters):
                options.append("add-witness")
        removable = [
            m
            for m in voters
            if len(voters) > 2 and (m in witnesses or len(data_voters) - 1 > len(witnesses))
        ]
        if removable:
            options += ["remove", "remove"]
        kind = rng.choice(options)
        if kind == "remove":
            member = rng.choice(removable)
            voters.remove(member)
            witnesses.discard(member)
        else:
            member = f"m{named}"
            named += 1
            voters.append(member)
            if kind == "add-witness":
                witnesses.add(member)
        steps.append(MembershipStep(rng.randint(fault_ticks // 10, fault_ticks), kind, member))
    ats = sorted(step.at for step in steps)
    return tuple(replace(step, at=at) for step, at in zip(steps, ats, strict=True))


def _group(rng: random.Random, sizes: tuple[int, ...]) -> GroupSpec:
    size = rng.choice(sizes)
    names = tuple(f"m{i}" for i in range(size))
    witnesses: frozenset[str] = frozenset()
    if size == 3 and rng.random() < 0.4:
        witnesses = frozenset({names[-1]})  # the two-regions-plus-witness deployment
    elif size >= 5 and rng.random() < 0.3:
        witnesses = frozenset(names[-rng.randint(1, 2) :])
    return GroupSpec(names, witnesses)


def _fault_scenario(seed: int, rng: random.Random) -> Scenario:
    group = _group(rng, (2, 3, 3, 3, 5, 5, 7))
    names = group.members
    size = len(names)
    link = LinkFaults(
        max_delay=rng.choice((0, 1, 2, 4)),
        drop=rng.choice((0.0, 0.0, 0.02, 0.1, 0.25)),
        duplicate=rng.choice((0.0, 0.0, 0.05, 0.2)),
        reorder=rng.choice((0.0, 0.01, 0.1, 1.0)),
    )
    # As in any Raft deployment, the election timeout must exceed a round trip.
    # Heartbeats are most of the traffic; any interval well inside the timeout works.
    heartbeat = rng.choice((1, 2, 3))
    floor = max(4 + 2 * link.max_delay, 4 * heartbeat)
    election = rng.randint(floor, floor + 8)
    timing = Timing(
        heartbeat_ticks=heartbeat,
        election_ticks=election,
        witness_election_factor=rng.choice((1, 2, 3)),
        resend_ticks=election * rng.randint(2, 4),
        max_entries_per_append=rng.choice((2, 8, 64)),
        max_uncommitted=rng.choice((16, 256)),
        max_outbox=rng.choice((4, 32, 256)),
        max_forward=rng.choice((2, 4, 16)),
        max_unapplied=rng.choice((16, 64, 1024)),
        max_apply_bytes=rng.choice((2000, 1 << 26)),
        retained_applied=rng.choice((0, 3, 50)),
        witness_retained_bytes=rng.choice((0, 3000, 1 << 28)),
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
        max_events_per_transaction=rng.choice((4, 16, 64, 50_000)),
        halt_retry_ticks=4,
        retry_ticks=(1, 8),
        trim_ticks=rng.choice((1, 5, 25, 100)),
        # No margin at all half the time: correctness must not lean on the entries the
        # margin keeps for catching up (the driver trims only what every member stored).
        trim_margin=rng.choice((0, 4 * timing.retained_applied)),
    )
    costs = {
        name: SimCosts(
            persist_ticks=rng.choice((0, 0, 1, 2)),
            transaction_ticks=rng.choice((0, 0, 1, 2)),
            load_ticks=rng.choice((0, 1, 3)),
        )
        for name in names
    }
    produce_rate = rng.choice((0.05, 0.15, 0.4))
    # Events at most: each source partition of each data member, every tick of traffic.
    partitions = _source_partitions(topics, group)
    events = round(produce_rate * partitions * (fault_ticks + 40))
    slowest_write = 1 + max(c.persist_ticks for c in costs.values())
    return Scenario(
        seed=seed,
        group=group,
        timing=timing,
        link=link,
        topics=topics,
        produce_rate=produce_rate,
        fault_ticks=fault_ticks,
        # A member far behind receives a window of Appends per round trip, each
        # acknowledged once written.
        settle_ticks=_settle_ticks(timing, link, events * slowest_write),
        faults=faults,
        crash_in_ready=rng.choice((0.0, 0.0, 0.01, 0.05)),
        max_batch_events=rng.choice((1, 4, 16)),
        minority_down=minority,
        limits=limits,
        costs=costs,
    )


def _overload_scenario(seed: int, rng: random.Random) -> Scenario:
    group = _group(rng, (2, 3, 3, 5))
    names = group.members
    data = group.data_members
    link = LinkFaults(
        max_delay=rng.choice((0, 1, 2)),
        drop=rng.choice((0.0, 0.0, 0.01)),
        duplicate=0.0,
        reorder=rng.choice((0.0, 0.01)),
    )
    election = rng.randint(6 + 2 * link.max_delay, 12 + 2 * link.max_delay)
    timing = Timing(
        heartbeat_ticks=1,
        election_ticks=election,
        witness_election_factor=rng.choice((1, 2)),
        resend_ticks=election * rng.randint(2, 3),
        max_entries_per_append=rng.choice((8, 64)),
        max_uncommitted=rng.choice((16, 256)),
        max_outbox=rng.choice((64, 256)),
        max_forward=rng.choice((2, 8, 16)),
        max_unapplied=rng.choice((8, 32, 128)),
        max_apply_bytes=rng.choice((5000, 50_000)),
        retained_applied=rng.choice((3, 50)),
    )
    topics = (("t0", rng.randint(1, 2)),)
    burst_ticks = rng.randint(20, 50)
    burst = rng.randint(2, 8)  # events per source partition per tick while bursting
    # Transactions cost a fixed round trip plus time per event; one member is slower.
    slow = rng.choice(data)
    # Busy brokers: acknowledging a write (a vote, a term, entries) can take longer than
    # an election timeout, so a round of votes outlasts the timeout that started it.
    persist = rng.choice((0, 1, 2, election // 2, election, 2 * election))
    costs: dict[str, SimCosts] = {}
    for name in names:
        rate = rng.randint(2, 4) if name == slow else rng.randint(6, 30)
        stalls: tuple[tuple[int, int], ...] = ()
        if rng.random() < 0.5:
            begin = rng.randint(5, burst_ticks)
            stalls = ((begin, begin + rng.randint(2, 6) * election),)
        costs[name] = SimCosts(
            persist_ticks=rng.randint(persist // 2, persist),
            transaction_ticks=rng.randint(1, 4),
            events_per_tick=rate,
            load_ticks=rng.randint(1, 3),
            work_per_tick=rng.choice((30, 60, 200)),
            stalls=stalls,
        )
    partitions = topics[0][1]
    events = burst * burst_ticks * partitions * len(data)
    slowest = min(costs[n].events_per_tick for n in data)
    limits = DriverLimits(
        max_events_per_transaction=rng.choice((16, 64, 256)),
        halt_retry_ticks=4,
        retry_ticks=(1, 8),
        trim_ticks=25,
        trim_margin=4 * timing.retained_applied,
    )
    faults: tuple[Fault, ...] = ()
    if rng.random() < 0.3:
        victim = rng.choice(names)
        at = rng.randint(10, burst_ticks)
        faults = (
            Fault(at, "crash", (victim,)),
            Fault(at + rng.randint(5, 30), "restart", (victim,)),
        )
    return Scenario(
        seed=seed,
        group=group,
        timing=timing,
        link=link,
        topics=topics,
        produce_rate=1.0,
        burst=burst,
        fault_ticks=burst_ticks,
        # Everything must arrive within a few times what the slowest member needs to
        # write it, plus elections: a wedged group never does.
        # A round of commits waits for writes on both sides; at most max_uncommitted
        # entries (of up to max_batch_events) go into each round.
        settle_ticks=3 * events // slowest
        + 2 * events * (persist + 1) // timing.max_uncommitted
        + 60 * election * (1 + timing.witness_election_factor)
        + 400,
        faults=faults,
        max_batch_events=rng.choice((4, 16)),
        limits=limits,
        costs=costs,
        shape="overload",
    )


def _churn_scenario(seed: int, rng: random.Random) -> Scenario:
    """Leader changes at commit time, the ground of Raft's figure 8: an entry of an old
    term can reach a majority only after its leader died, carried by a later leader that
    dies in turn before an entry of its own term follows it. Small Appends (often one
    entry each) let an old entry travel without the new leader's no-op behind it."""
    group = _group(rng, (3, 3, 3, 5))
    names = group.members
    link = LinkFaults(
        max_delay=rng.choice((0, 1, 2)),
        drop=rng.choice((0.0, 0.0, 0.05)),
        duplicate=0.0,
        reorder=rng.choice((0.0, 0.1)),
    )
    election = rng.randint(4 + 2 * link.max_delay, 8 + 2 * link.max_delay)
    timing = Timing(
        heartbeat_ticks=1,
        election_ticks=election,
        witness_election_factor=rng.choice((1, 2)),
        resend_ticks=election * rng.randint(2, 4),
        max_entries_per_append=rng.choice((1, 1, 2, 8)),
        max_uncommitted=rng.choice((16, 256)),
        max_outbox=rng.choice((32, 256)),
        retained_applied=rng.choice((3, 50)),
    )
    topics = (("t0", rng.randint(1, 2)),)
    fault_ticks = rng.randint(150, 400)
    faults: list[Fault] = []
    at = rng.randint(2 * election, 4 * election)  # a first leader, then the churn
    while at < fault_ticks:
        if rng.random() < 0.8:
            at = _figure_8_cycle(rng, faults, at, election)
            continue
        kind = rng.choice(("crash-leader", "isolate-leader", "restart-oldest"))
        faults.append(Fault(at, kind))
        if kind == "isolate-leader":
            faults.append(Fault(at + rng.randint(1, 2 * election), "heal"))
        at += rng.randint(1, 3 * election)
    faults.sort(key=lambda f: f.at)
    limits = DriverLimits(
        max_events_per_transaction=rng.choice((4, 64)),
        halt_retry_ticks=4,
        retry_ticks=(1, 8),
        trim_ticks=rng.choice((1, 25)),
        trim_margin=rng.choice((0, 4 * timing.retained_applied)),
    )
    costs = {
        name: SimCosts(persist_ticks=rng.choice((0, 1)), transaction_ticks=rng.choice((0, 1)))
        for name in names
    }
    produce_rate = rng.choice((0.1, 0.3))
    partitions = _source_partitions(topics, group)
    events = round(produce_rate * partitions * (fault_ticks + 40))
    return Scenario(
        seed=seed,
        group=group,
        timing=timing,
        link=link,
        topics=topics,
        produce_rate=produce_rate,
        fault_ticks=fault_ticks,
        # Members left far behind catch up one after another (a witness that leads
        # serves only what it retains, so a data member must catch up and take over
        # before the last one is served), an Append at a time when Appends are small.
        settle_ticks=_settle_ticks(timing, link, events * 4),
        faults=tuple(faults),
        max_batch_events=rng.choice((1, 4)),
        limits=limits,
        costs=costs,
        shape="churn",
    )


def _figure_8_cycle(rng: random.Random, faults: list[Fault], at: int, election: int) -> int:
    """One try at Raft's figure 8, with jittered timing. The leader A, cut off, appends an
    entry nobody else gets and dies; the next leader C dies in the tick it wins, its
    no-op unheard; A comes back first, is elected with its old entry and dies in the tick
    its commit index moves; then C comes back, and its log outranks A's old entry on the
    member that voted for both. Returns the tick the next try may start."""
    faults.append(Fault(at, "isolate-leader"))
    faults.append(Fault(at, "crash-after-append"))
    faults.append(Fault(at + rng.randint(0, election), "cut-off-new-leader"))
    at += rng.randint(3 * election, 6 * election)  # an election among the others
    faults.append(Fault(at, "heal"))
    faults.append(Fault(at, "restart-oldest"))
    faults.append(Fault(at, "crash-after-commit"))
    at += rng.randint(3 * election, 6 * election)
    faults.append(Fault(at, "restart-oldest"))
    at += rng.randint(3 * election, 6 * election)
    faults.append(Fault(at, "heal"))
    faults.append(Fault(at, "restart-oldest"))
    return at + rng.randint(2 * election, 6 * election)


def _settle_ticks(timing: Timing, link: LinkFaults, entry_writes: int) -> int:
    """The progress bound once healed: elections (longer with witnesses), then catching
    up ``entry_writes`` entry-writes' worth, a round trip of up to ``max_delay`` ticks per
    hop for each Append."""
    return (
        40 * timing.election_ticks * (1 + timing.witness_election_factor)
        + 400
        + 50 * link.max_delay
        + entry_writes * (1 + link.max_delay) // timing.max_entries_per_append
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
