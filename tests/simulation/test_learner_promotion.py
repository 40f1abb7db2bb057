"""A new data member becomes a voter while traffic goes on, even when its log writes are
slower than the voters'.

A leader used to promote a learner only once its position was within one Append
(``max_entries_per_append``) of the commit index. Under steady traffic a learner whose
writes take a few times longer than the voters' trails by its write time's worth of
entries, more than one Append, at nearly every heartbeat: it stayed a learner until the
traffic stopped (1,927 and 3,407 ticks after the change was asked at tick 100, with the
learner's writes 4 and 8 times as slow and traffic until tick 2,000). This is the likely
cause of a CI failure of the data member join test: on a loaded machine, at about 1,400
entries a second, ``kdsync members add`` gave up after m4 had been a learner for 567 s.
Now a learner that holds what was committed an election timeout ago counts as caught up
(docs/ordering.md, "Membership changes").
"""

from __future__ import annotations

import pytest

from kdsync.ordering import GroupSpec, Timing
from kdsync.simulation import run_scenario
from kdsync.simulation.member import SimCosts
from kdsync.simulation.network import LinkFaults
from kdsync.simulation.scenario import MembershipStep, Scenario

ELECTION_TICKS = 20
ASKED_AT = 100
TRAFFIC_UNTIL = 1000


def _joins_under_traffic(learner_persist_ticks: int) -> Scenario:
    voters = SimCosts(persist_ticks=1, transaction_ticks=2)
    learner = SimCosts(persist_ticks=learner_persist_ticks, transaction_ticks=2)
    return Scenario(
        seed=7,
        group=GroupSpec(("m0", "m1", "m2")),
        timing=Timing(heartbeat_ticks=2, election_ticks=ELECTION_TICKS, max_entries_per_append=16),
        link=LinkFaults(max_delay=1),
        topics=(("t", 4),),
        produce_rate=0.5,  # several entries committed per tick: more than one Append per write
        fault_ticks=TRAFFIC_UNTIL,  # no faults: traffic until here, then settling
        settle_ticks=2000,
        membership=(MembershipStep(ASKED_AT, "add-data", "m3"),),
        costs={"m0": voters, "m1": voters, "m2": voters, "m3": learner},
    )


@pytest.mark.parametrize("learner_persist_ticks", [1, 4, 8])
def test_a_learner_with_slower_log_writes_becomes_a_voter_under_traffic(
    learner_persist_ticks: int,
) -> None:
    outcome = run_scenario(_joins_under_traffic(learner_persist_ticks))
    assert outcome.ok, outcome.report()
    done = {(step.kind, step.member): tick for step, tick in outcome.membership_done}
    assert ("add-data", "m3") in done, outcome.report()
    # Started, seeded and promoted within a few election timeouts of being asked, long
    # before the traffic stops.
    took = done[("add-data", "m3")] - ASKED_AT
    assert took <= 5 * ELECTION_TICKS, f"m3 became a voter {took} ticks after it was asked"
