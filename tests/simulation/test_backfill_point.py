"""A new data member's backfill point counts what a witness knows every data member stored.

``allDurable`` lives in memory: a data member that restarts forgets it (its ``/status``
still says where its log topic starts, ``trimmedBelow``). A witness that heard a higher
value before the data members restarted passes it on in its Appends once it leads, and
the data members then trim their logs up to it. A point chosen from the data members
alone fell below that: the entries the new member needed next were gone from every log,
and it never caught up (simulator seed 2017394). ``kdsync.backfill_point.choose_donor``
takes the floor over witnesses too; the simulator's operator calls it, as the product's
backfill does, and this scenario pins it.
"""

from __future__ import annotations

import pytest

from kdsync.driver import DriverLimits
from kdsync.ordering import (
    Configuration,
    DeliveredEvent,
    GroupSpec,
    LedgerState,
    OrderingNode,
    RecoveredState,
    SourceEvent,
    Timing,
)
from kdsync.simulation import run_scenario
from kdsync.simulation.member import SimCosts, SimKafka, SimMember
from kdsync.simulation.network import LinkFaults
from kdsync.simulation.scenario import MembershipStep, Scenario, make_scenario

GROUP = GroupSpec(("m0", "m1", "m2", "m3", "m4"), witnesses=frozenset({"m3", "m4"}))
NEW = "m5"


def _data_members_restart_before_an_addition() -> Scenario:
    """Seed 2017394 as the generator drew it: crashes after completed operations take the
    three data members down one after another, and m5 is added while the witness m4,
    which remembers the old ``allDurable``, leads."""
    costs = {
        "m0": SimCosts(persist_ticks=2, transaction_ticks=1, load_ticks=1),
        "m1": SimCosts(persist_ticks=1, transaction_ticks=2, load_ticks=1),
        "m2": SimCosts(persist_ticks=0, transaction_ticks=1, load_ticks=0),
        "m3": SimCosts(persist_ticks=0, transaction_ticks=2, load_ticks=1),
        "m4": SimCosts(persist_ticks=0, transaction_ticks=0, load_ticks=1),
    }
    return Scenario(
        seed=2017394,
        group=GROUP,
        timing=Timing(
            heartbeat_ticks=3,
            election_ticks=15,
            witness_election_factor=1,
            max_uncommitted_bytes=3000,
            max_outbox=4,
            max_recover_bytes=1,
            max_unapplied=16,
            max_apply_bytes=2000,
            retained_applied=0,
            max_log_bytes=0,
            max_load_bytes=300,
            witness_retained_bytes=0,
        ),
        link=LinkFaults(max_delay=2, drop=0.02, duplicate=0.05, reorder=0.01),
        topics=(("t0", 2),),
        produce_rate=0.15,
        fault_ticks=132,
        settle_ticks=2344,
        crash_in_ready=0.01,
        max_batch_events=16,
        limits=DriverLimits(
            max_events_per_transaction=16,
            halt_retry_ticks=4,
            retry_ticks=(1, 8),
            trim_ticks=100,
            trim_margin=0,
        ),
        costs=costs,
        membership=(MembershipStep(at=88, kind="add-data", member=NEW),),
    )


class _Nodes:
    """The node of each member that is up, and what the witnesses and the data members
    knew of ``allDurable`` when the new member started from its backfill point."""

    def __init__(self) -> None:
        self.latest: dict[str, OrderingNode] = {}
        self.seeded: list[tuple[int, int, int]] = []  # (point, witnesses', data members')

    def factory(
        self,
        member: str,
        group: GroupSpec,
        timing: Timing,
        incarnation: int,
        recovered: RecoveredState | None,
    ) -> OrderingNode:
        if member == NEW and recovered is not None:
            known = {m: n.all_durable for m, n in self.latest.items()}
            self.seeded.append(
                (
                    recovered.ledger.applied_index,
                    max((d for m, d in known.items() if m in GROUP.witnesses), default=0),
                    max((d for m, d in known.items() if m not in GROUP.witnesses), default=0),
                )
            )
        node = OrderingNode(member, group, timing, incarnation, recovered)
        self.latest[member] = node
        return node


def test_a_new_member_starts_at_or_past_what_any_member_knows_every_log_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = _Nodes()
    crash = SimMember.crash

    def crash_and_forget(member: SimMember) -> None:
        nodes.latest.pop(member.name, None)  # a crashed member knows nothing
        crash(member)

    monkeypatch.setattr(SimMember, "crash", crash_and_forget)
    outcome = run_scenario(_data_members_restart_before_an_addition(), nodes.factory)
    assert nodes.seeded, "the scenario must seed the new data member"
    point, witnesses_knew, data_members_knew = nodes.seeded[0]
    assert point >= max(witnesses_knew, data_members_knew), (
        f"{NEW} was seeded at {point}, below what a member knows every log stored "
        f"(witnesses: {witnesses_knew}, data members: {data_members_knew})"
    )
    assert outcome.ok, outcome.report()


def test_a_member_seeded_by_a_backfill_hands_on_its_seed_not_an_empty_ledger() -> None:
    """A data member added by a backfill is itself the donor of the next one before it
    applied anything of its own (it applied least: seed 6003422, two data members added
    back to back). It hands on the ledger it was seeded with, as the product's backfill
    does (it writes that ledger to the new member's ledger topic and reads the donor's
    latest). The simulator once kept a ledger history that started with an empty ledger
    for such a member, so the next one was seeded at index 0, below every trimmed log,
    and never caught up."""
    seed = Configuration(("m0", "m1", "m3"))
    event = SourceEvent(5, b"k", b"v", (), 0)
    stream = [DeliveredEvent(seq, "m0", "t0", 0, event) for seq in range(3)]
    donor = SimKafka(ledger=LedgerState(applied_index=24, applied_term=3, next_seq={"t0": 3}))
    donor.globals["t0"] = stream
    first = donor.backfill_copy(seed)
    second = first.backfill_copy(seed)
    assert second.ledger.applied_index == 24
    assert second.ledger.config == seed
    assert second.globals["t0"] == stream


def test_two_data_members_added_back_to_back_both_catch_up() -> None:
    """The scenario that showed it (outside CI's seed range), replayed."""
    scenario = make_scenario(6003422)
    kinds = [step.kind for step in scenario.membership]
    assert kinds[-2:] == ["add-data", "add-data"], scenario.membership  # what it must draw
    outcome = run_scenario(scenario)
    assert outcome.ok, outcome.report()
