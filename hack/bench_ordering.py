"""Throughput of the ordering core alone (run through hack/bench-ordering).

All members of a group live in this one process, on one core. Messages go from one
node's ``Ready`` straight into the receiver's inbox (the same objects, no copying or
encoding); "persistence" appends to in-memory lists; nothing is written to Kafka. One
origin member offers batches of one event each, as fast as its outbox accepts them.

A batch counts as *ordered* once every data member has delivered it; the rate is taken
over a measurement window after a warm-up. This is the ceiling the protocol code puts
on a sidecar: the real one adds framing, the network and Kafka transactions.

  hack/bench-ordering [--seconds 3] [--warmup 1] [--profile] [--setups ...]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import sys
import time
from dataclasses import dataclass

from kdsync.ordering import (
    BatchVerdict,
    Entry,
    GroupSpec,
    HardState,
    LedgerState,
    Message,
    OrderingNode,
    OriginBatch,
    Ready,
    Role,
    SourceEvent,
    Timing,
)

GOAL = 50_000  # batches/s ordered, the project's target for one group

SETUPS: dict[str, tuple[GroupSpec, str]] = {
    # name: (group, which member offers: "follower" forwards to the leader, "leader" not)
    "3-data/follower-origin": (GroupSpec(("a", "b", "c")), "follower"),
    "3-data/leader-origin": (GroupSpec(("a", "b", "c")), "leader"),
    "2-data+witness/follower-origin": (
        GroupSpec(("a", "b", "w"), witnesses=frozenset({"w"})),
        "follower",
    ),
    "2-data+witness/leader-origin": (
        GroupSpec(("a", "b", "w"), witnesses=frozenset({"w"})),
        "leader",
    ),
}


@dataclass
class Counters:
    ordered: int  # batches delivered at every data member
    messages: int
    duplicates: int  # batches ordered twice (an origin resent one): wasted work
    readies: int
    busy: dict[str, float]  # seconds each member spent in its node and shell

    def minus(self, other: Counters) -> Counters:
        return Counters(
            self.ordered - other.ordered,
            self.messages - other.messages,
            self.duplicates - other.duplicates,
            self.readies - other.readies,
            {m: self.busy[m] - other.busy[m] for m in self.busy},
        )


class InMemoryGroup:
    """Every member of a group, driven the way a sidecar shell drives its node."""

    def __init__(self, group: GroupSpec, timing: Timing) -> None:
        self.group = group
        self.members = group.members
        self.data_members = group.data_members
        self.nodes = {
            m: OrderingNode(m, group, timing, incarnation=i + 1)
            for i, m in enumerate(group.members)
        }
        self.inbox: dict[str, list[tuple[str, Message]]] = {m: [] for m in group.members}
        self.hard_state: dict[str, HardState] = {}
        self.log: dict[str, list[Entry]] = {m: [] for m in group.members}  # entry i at i - 1
        self.ledger: dict[str, LedgerState] = {}
        self.delivered = dict.fromkeys(group.members, 0)
        self.duplicates = dict.fromkeys(group.members, 0)
        self.messages = 0
        self.readies = 0
        self.busy = dict.fromkeys(group.members, 0.0)
        self.next_offset = 0
        self.origin = ""

    # ------------------------------------------------------------ the shell

    def handle(self, member: str, node: OrderingNode, ready: Ready) -> None:
        self.readies += 1
        if member in self.data_members:
            if ready.hard_state is not None:
                self.hard_state[member] = ready.hard_state
            if ready.persist_from is not None:
                log = self.log[member]
                del log[ready.persist_from - 1 :]
                log.extend(ready.entries)
        if ready.messages:
            self.messages += len(ready.messages)
            inbox = self.inbox
            for out in ready.messages:
                inbox[out.to].append((member, out.message))
        if ready.loads:
            log = self.log[member]
            node.entries_loaded([e for first, last in ready.loads for e in log[first - 1 : last]])
        if ready.deliveries:
            assert ready.ledger is not None
            self.ledger[member] = ready.ledger
            delivered = 0
            duplicates = 0
            for delivery in ready.deliveries:
                if delivery.verdict is BatchVerdict.DELIVERED:
                    delivered += 1
                elif delivery.verdict is BatchVerdict.DUPLICATE:
                    duplicates += 1
            self.delivered[member] += delivered
            self.duplicates[member] += duplicates
            node.applied(ready.deliveries[-1].index)

    def step(self) -> None:
        """One round of the event loop: read sources, then every member's inbox and Ready."""
        if self.origin:
            self.read_source()
        self.exchange()

    def read_source(self) -> None:
        started = time.perf_counter()
        origin = self.nodes[self.origin]
        offset = self.next_offset
        while origin.offer(
            OriginBatch(
                self.origin,
                "t",
                0,
                offset,
                offset + 1,
                False,
                (SourceEvent(offset, None, b"x" * 16, (), offset),),
            )
        ):
            offset += 1
        self.next_offset = offset
        self.busy[self.origin] += time.perf_counter() - started

    def exchange(self) -> None:
        clock = time.perf_counter
        busy = self.busy
        for member, node in self.nodes.items():
            started = clock()
            inbox = self.inbox[member]
            if inbox:
                self.inbox[member] = []
                for sender, message in inbox:
                    node.receive(sender, message)
            ready = node.ready()
            if not ready.is_empty():
                self.handle(member, node, ready)
            busy[member] += clock() - started

    def tick(self) -> None:
        for node in self.nodes.values():
            node.tick()

    def elect(self, limit: int = 1000) -> str:
        for _ in range(limit):
            leaders = [n.member for n in self.nodes.values() if n.role is Role.LEADER]
            if leaders and all(n.leader == leaders[0] for n in self.nodes.values()):
                return leaders[0]
            self.tick()
            for _ in range(10):
                self.step()
        raise SystemExit(f"no leader after {limit} ticks")

    def counters(self) -> Counters:
        return Counters(
            min(self.delivered[m] for m in self.data_members),
            self.messages,
            max(self.duplicates[m] for m in self.data_members),
            self.readies,
            dict(self.busy),
        )

    def terms(self) -> set[int]:
        return {n.term for n in self.nodes.values()}


@dataclass
class Result:
    setup: str
    origin: str
    leader: str
    seconds: float
    window: Counters
    elections: int

    @property
    def rate(self) -> float:
        return self.window.ordered / self.seconds if self.seconds else 0.0

    @property
    def busiest(self) -> tuple[str, float]:
        member = max(self.window.busy, key=self.window.busy.__getitem__)
        return member, self.window.busy[member]

    @property
    def rate_per_core(self) -> float:
        """Projected rate with one core per member: the busiest member sets the pace."""
        _, seconds = self.busiest
        return self.window.ordered / seconds if seconds else 0.0


def run_for(group: InMemoryGroup, seconds: float, tick_seconds: float) -> float:
    clock = time.perf_counter
    started = clock()
    next_tick = started + tick_seconds
    deadline = started + seconds
    step = group.step
    while True:
        step()
        now = clock()
        if now >= next_tick:
            group.tick()
            next_tick = now + tick_seconds
            if now >= deadline:
                return now - started


def bench(
    name: str,
    timing: Timing,
    seconds: float,
    warmup: float,
    tick_seconds: float,
    profiler: cProfile.Profile | None,
) -> Result:
    spec, origin_role = SETUPS[name]
    group = InMemoryGroup(spec, timing)
    leader = group.elect()
    followers = [m for m in spec.data_members if m != leader]
    if origin_role == "leader" and leader in spec.data_members:
        group.origin = leader
    else:
        group.origin = followers[0]
    run_for(group, warmup, tick_seconds)
    terms_before = group.terms()
    before = group.counters()
    gc.collect()
    if profiler is not None:
        profiler.enable()
    elapsed = run_for(group, seconds, tick_seconds)
    if profiler is not None:
        profiler.disable()
    window = group.counters().minus(before)
    elections = max(group.terms()) - max(terms_before)
    return Result(name, group.origin, leader, elapsed, window, elections)


def pin(cpu: int | None) -> str:
    if cpu is None:
        return "one thread, not pinned"
    if not hasattr(os, "sched_setaffinity"):
        return "one thread, not pinned (no sched_setaffinity here)"
    os.sched_setaffinity(0, {cpu})
    return f"one thread, pinned to CPU {cpu}"


def print_table(results: list[Result]) -> None:
    header = (
        f"{'setup':<31} {'origin':>6} {'leader':>6} {'batches/s':>9} {'of goal':>7} "
        f"{'msgs/batch':>10} {'readies/batch':>13} {'dups':>4} {'elections':>9} "
        f"{'busiest member':>14} {'1 core/member':>13}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        ordered = max(r.window.ordered, 1)
        member, seconds = r.busiest
        print(
            f"{r.setup:<31} {r.origin:>6} {r.leader:>6} {r.rate:>9,.0f} "
            f"{r.rate / GOAL:>7.1%} {r.window.messages / ordered:>10.3f} "
            f"{r.window.readies / ordered:>13.3f} {r.window.duplicates:>4} {r.elections:>9} "
            f"{member + f' {seconds / r.seconds:.0%}':>14} {r.rate_per_core:>13,.0f}"
        )
    print(
        "\nbatches/s: ordered (delivered at every data member) with the whole group on one core."
        "\nbusiest member: the member that used the most of that core, and its share."
        "\n1 core/member: projected batches/s if each member had its own core (as sidecars do)."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/bench-ordering", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement window per setup")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured run before it")
    parser.add_argument("--tick-ms", type=float, default=10.0, help="wall time per core tick")
    parser.add_argument(
        "--setups", default=",".join(SETUPS), help="comma-separated, of: " + ", ".join(SETUPS)
    )
    # The core's defaults are well above what throttles this loop; larger windows measured
    # slower (more memory touched per round, longer outbox scans), not faster.
    defaults = Timing()
    parser.add_argument(
        "--max-entries-per-append", type=int, default=defaults.max_entries_per_append
    )
    parser.add_argument("--max-uncommitted", type=int, default=defaults.max_uncommitted)
    parser.add_argument("--max-outbox", type=int, default=defaults.max_outbox)
    parser.add_argument("--profile", action="store_true", help="cProfile the measured windows")
    parser.add_argument("--top", type=int, default=20, help="profile lines to print")
    parser.add_argument("--cpu", type=int, help="pin the process to this CPU")
    args = parser.parse_args(argv)

    names = [n.strip() for n in args.setups.split(",") if n.strip()]
    unknown = [n for n in names if n not in SETUPS]
    if unknown:
        parser.error(f"unknown setups {unknown}; choose from {list(SETUPS)}")
    timing = Timing(
        max_entries_per_append=args.max_entries_per_append,
        max_uncommitted=args.max_uncommitted,
        max_outbox=args.max_outbox,
    )
    pinned = pin(args.cpu)
    print(
        f"ordering core, in-process, one origin offering 1-event batches; {pinned}; "
        f"python {sys.version.split()[0]}; warm-up {args.warmup:g} s, window {args.seconds:g} s, "
        f"tick {args.tick_ms:g} ms"
    )
    print(
        f"timing: max_entries_per_append={timing.max_entries_per_append} "
        f"max_uncommitted={timing.max_uncommitted} max_outbox={timing.max_outbox} "
        f"resend_ticks={timing.resend_ticks}"
    )
    profiler = cProfile.Profile() if args.profile else None
    results = []
    for name in names:
        result = bench(name, timing, args.seconds, args.warmup, args.tick_ms / 1000, profiler)
        results.append(result)
    print()
    print_table(results)
    print(f"goal: {GOAL:,} batches/s ordered")
    if profiler is not None:
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats(pstats.SortKey.TIME).print_stats(args.top)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
