"""A witness that leads hands leadership to a data member once one has caught up, even
while traffic goes on.

A witness leads only when no data member can (docs/ordering.md, "Witnesses"), and it
orders more slowly than a data member would: it holds new batches back whenever it must
hand over and nobody is caught up. That hold once also delayed the handover itself,
until the hold lapsed, when admission resumed and the log ran ahead of everyone again.
Under steady traffic the witness therefore never handed over, and admitted a few batches
every two election timeouts (simulator seed 500656: 315 events took 2,500 ticks to
settle, past the bound). Here it never handed over, and the scenario did not settle.
"""

from __future__ import annotations

from kdsync.driver import DriverLimits
from kdsync.ordering import GroupSpec, OrderingNode, Ready, RecoveredState, Timing
from kdsync.simulation import run_scenario
from kdsync.simulation.member import SimCosts
from kdsync.simulation.network import LinkFaults
from kdsync.simulation.scenario import Fault, Scenario

ELECTION_TICKS = 13
# Not a divisor of two election timeouts, the hold's length: the hold then lapses between
# heartbeats, and admission resumed before a heartbeat could hand over (with a heartbeat
# every tick, the handover went first).
HEARTBEAT_TICKS = 3
WITNESS = "w"
GROUP = GroupSpec(("m0", "m1", WITNESS), witnesses=frozenset({WITNESS}))


def _witness_must_lead() -> Scenario:
    """m0 restarts cut off from m1, so it falls behind m1 and the witness; then m1 dies.
    m0's log is behind the witness's, so only the witness can win, and it leads m0 up to
    date while m0's own events keep arriving one small batch at a time; m1 comes back
    behind, its backlog too."""
    timing = Timing(
        heartbeat_ticks=HEARTBEAT_TICKS,
        election_ticks=ELECTION_TICKS,
        witness_election_factor=1,
        max_entries_per_append=64,
        max_outbox=4,
        max_forward=2,
    )
    return Scenario(
        seed=3,
        group=GROUP,
        timing=timing,
        link=LinkFaults(max_delay=2),
        topics=(("t", 1),),
        produce_rate=0.5,
        fault_ticks=600,
        settle_ticks=3000,
        faults=(
            Fault(60, "crash", ("m0",)),
            Fault(100, "partition", ("m0",), ("m1",)),
            Fault(101, "restart", ("m0",)),
            Fault(160, "crash", ("m1",)),
            Fault(200, "restart", ("m1",)),
        ),
        max_batch_events=1,
        limits=DriverLimits(trim_ticks=25),
        costs={name: SimCosts(persist_ticks=1, transaction_ticks=1) for name in GROUP.members},
    )


class _Tenures:
    """Who led from which tick, from the nodes' own "leader" events. Each node counts
    its own ticks; one started at the group's tick N counts from N. (Exact while every
    node that is up ticks at every group tick: no stalls or CPU budgets here.)"""

    def __init__(self) -> None:
        self.starts: list[tuple[int, str]] = []  # (tick, member)
        self.clock = 0  # the group's ticks: the furthest any node has counted

    def factory(
        self,
        member: str,
        group: GroupSpec,
        timing: Timing,
        incarnation: int,
        recovered: RecoveredState | None,
    ) -> OrderingNode:
        tenures = self

        started = self.clock

        class Watched(OrderingNode):
            ticks = 0

            def tick(self) -> None:
                self.ticks += 1
                tenures.clock = max(tenures.clock, started + self.ticks)
                super().tick()

            def ready(self) -> Ready:
                ready = super().ready()
                for event in ready.events:
                    if event.kind == "leader":
                        tenures.starts.append((started + self.ticks, member))
                return ready

        return Watched(member, group, timing, incarnation, recovered)


def test_a_witness_leading_under_traffic_hands_over_to_a_caught_up_data_member() -> None:
    tenures = _Tenures()
    outcome = run_scenario(_witness_must_lead(), tenures.factory)
    assert outcome.ok, outcome.report()
    witness_won = [tick for tick, member in tenures.starts if member == WITNESS]
    assert witness_won, f"the scenario must make the witness lead; leaders: {tenures.starts}"
    for won in witness_won:
        after = [tick for tick, member in tenures.starts if tick > won and member != WITNESS]
        assert after, f"the witness, leader from its tick {won}, never handed over"
        # Catching m0 up takes a few round trips; the hold, then the handover, a few
        # election timeouts at most.
        assert after[0] - won <= 8 * ELECTION_TICKS, (
            f"the witness led for {after[0] - won} ticks under traffic before anyone "
            f"took over (leaders: {tenures.starts})"
        )
