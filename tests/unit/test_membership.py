"""Membership changes in the real OrderingNode: the one-at-a-time rule, majorities of the
configuration in force, a leader removing itself, and the configuration surviving a
restart through the ledger (docs/ordering.md, "Membership changes")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from kdsync.ordering import Configuration, GroupSpec, LedgerState, Role, change_problem
from kdsync.ordering.log import Entry, ReplicatedLog
from kdsync.ordering.messages import Append, RecoverReply, RecoverRequest, TimeoutNow
from kdsync.ordering.witness import RecoveredWitness, WitnessRecovery, recover_reply
from kdsync.wire_format.envelope import WireFormatError
from kdsync.wire_format.messages import decode_message, encode_message
from kdsync.wire_format.records import (
    decode_entry,
    decode_ledger_state,
    encode_entry,
    encode_ledger_state,
)
from tests.simulation.mutants import MUTANTS
from tests.unit.ordering_pump import ELECTION_DEADLINE, THREE, Disk, Pump

FIVE = GroupSpec(("a", "b", "c", "d", "e"))
ABC = Configuration(("a", "b", "c"))

# ---------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    ("proposed", "problem"),
    [
        (Configuration(("a", "b", "c", "d")), "joins as a learner first"),
        (Configuration(("a",)), "at least 2 voting members"),
        (Configuration(("a", "b", "c"), learners=("d", "e")), "changes 2 members"),
        (Configuration(("a",), learners=("d",)), "at least 2 voting members"),
        (Configuration(("a", "b")), None),
        (Configuration(("a", "b", "c"), learners=("d",)), None),
        (Configuration(("a", "b", "c", "w"), frozenset({"w"})), None),
        (Configuration(("a", "b", "c")), "in force already"),
    ],
)
def test_one_change_at_a_time_names_what_is_wrong(
    proposed: Configuration, problem: str | None
) -> None:
    found = change_problem(ABC, proposed)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_one_data_member_joins_at_a_time() -> None:
    """A second learner would deadlock both joins: each backfill needs every data member
    of the configuration to answer (``kdsync.backfill_point``), and a learner waiting for
    its own backfill runs no sidecar to answer (found by the simulator once its operator
    ran the product's choice of point: seed 1000125). A witness may still be added, and a
    second data member once the first votes or is removed."""
    joining = Configuration(ABC.voters, learners=("d",))
    problem = change_problem(joining, joining.with_learner("e"))
    assert problem is not None and "d is still joining as a learner: add e once it" in problem
    assert change_problem(joining, joining.with_witness("w")) is None
    assert change_problem(joining.promoted("d"), joining.promoted("d").with_learner("e")) is None
    assert change_problem(joining.without("d"), joining.without("d").with_learner("e")) is None


def test_a_witness_stays_a_witness_and_a_voter_is_not_made_a_learner() -> None:
    with_witness = Configuration(("a", "b", "c", "w"), frozenset({"w"}))
    recast = Configuration(("a", "b", "c", "w"))
    assert "between witness and data member" in (change_problem(with_witness, recast) or "")
    demoted = Configuration(("a", "b"), learners=("c",))
    assert "not made a learner" in (change_problem(ABC, demoted) or "")
    too_many_witnesses = Configuration(("a", "w", "v"), frozenset({"w", "v"}))
    assert "more voting data members than witnesses" in " ".join(too_many_witnesses.problems())


def _elect(pump: Pump) -> str:
    pump.run_until(lambda: pump.leader() is not None, ELECTION_DEADLINE, "election")
    leader = pump.leader()
    assert leader is not None
    # The leader's no-op commits, so it may propose changes.
    pump.run_until(
        lambda: pump.node(leader).commit_index >= pump.node(leader).log.last_index, 50, "no-op"
    )
    return leader


def _propose(pump: Pump, config: Configuration) -> None:
    leader = pump.leader()
    assert leader is not None
    assert pump.node(leader).propose_configuration(config) is None
    pump.run_until(lambda: not pump.node(leader).change_pending, 50, "the change to commit")


def test_only_the_leader_proposes_and_only_one_change_is_pending() -> None:
    pump = Pump(THREE)
    leader = _elect(pump)
    follower = next(m for m in THREE.members if m != leader)
    refused = pump.node(follower).propose_configuration(ABC)
    assert refused is not None and "only the leader" in refused
    node = pump.node(leader)
    with_learner = Configuration(ABC.voters, learners=("d",))
    pump.hold.update((leader, m) for m in THREE.members if m != leader)
    assert node.propose_configuration(with_learner) is None
    assert node.config == with_learner, "a change is in force where it is appended"
    assert node.change_pending
    second = Configuration(ABC.voters, learners=("d", "e"))
    refused = node.propose_configuration(second)
    assert refused is not None and "has not committed yet" in refused
    for peer in THREE.members:
        if peer != leader:
            pump.release(leader, peer)
    pump.run_until(lambda: not node.change_pending, 50, "the first change to commit")
    assert all(pump.node(m).config == with_learner for m in THREE.members)


def test_majorities_count_the_voters_in_force() -> None:
    """Five shrunk to three: two of the three go on alone, as a majority of three."""
    pump = Pump(FIVE)
    leader = _elect(pump)
    keep = [leader, *(m for m in FIVE.members if m != leader)][:3]
    config = Configuration(tuple(keep[:3]) + tuple(m for m in FIVE.members if m not in keep))
    for gone in [m for m in FIVE.members if m not in keep]:
        config = Configuration(tuple(m for m in config.voters if m != gone))
        _propose(pump, config)
    assert pump.node(leader).config.voters == tuple(keep)
    for gone in [m for m in FIVE.members if m not in keep] + [keep[2]]:
        pump.crash(gone)
    pump.produce(leader, 3)
    pump.run_until(
        lambda: len(pump.delivered(leader)) == 3 and len(pump.delivered(keep[1])) == 3,
        200,
        "two of three voters to deliver",
    )


def test_counting_the_startup_majority_stalls_a_shrunk_group() -> None:
    """The planted bug the simulator catches: with the startup file's majority (3 of 5),
    the two voters left of three deliver nothing."""
    pump = Pump(FIVE, node_class=MUTANTS["counts-startup-majority"])
    leader = _elect(pump)
    others = [m for m in FIVE.members if m != leader]
    config = Configuration(FIVE.members)
    for gone in others[2:]:
        config = Configuration(tuple(m for m in config.voters if m != gone))
        _propose(pump, config)
    for gone in [*others[2:], others[1]]:
        pump.crash(gone)
    pump.produce(leader, 3)
    for _ in range(200):
        pump.tick()
    assert pump.delivered(leader) == []


def test_a_leader_asked_to_remove_itself_hands_over_first() -> None:
    pump = Pump(THREE)
    leader = _elect(pump)
    without = Configuration(tuple(m for m in THREE.members if m != leader))
    answer = pump.node(leader).propose_configuration(without)
    assert answer is not None and "hands leadership over" in answer
    pump.run_until(lambda: pump.leader() not in (None, leader), ELECTION_DEADLINE, "a new leader")
    pump.run_until(
        lambda: (
            pump.node(pump.leader() or leader).commit_index
            >= pump.node(pump.leader() or leader).log.last_index
        ),
        50,
        "the new leader's no-op",
    )
    _propose(pump, without)
    new = pump.leader()
    assert new is not None and new != leader
    assert pump.node(new).config == without
    # The group goes on without the old leader, which never campaigns again.
    pump.crash(leader)
    pump.produce(new, 2)
    pump.run_until(lambda: len(pump.delivered(new)) == 2, 200, "delivery without it")


def test_a_learner_is_not_promoted_while_a_handover_is_under_way() -> None:
    """A leader that has sent TimeoutNow appends no promotion until the handover is over:
    the configuration entry would put its log, and the log of whoever it reaches, ahead
    of the target's, whose campaign would then lose (a6f21f7). The new leader promotes
    the learner instead."""
    pump = Pump(GroupSpec(("a", "b", "c", "d")))
    pump.crash("d")  # d joins later, as a learner, with nothing stored
    leader = _elect(pump)
    _propose(pump, pump.node(leader).config.without("d"))
    _propose(pump, pump.node(leader).config.with_learner("d"))
    others = [m for m in ("a", "b", "c") if m != leader]
    # d's answers wait, so the leader cannot see it caught up before the handover starts;
    # the leader's messages to the voters wait too, its TimeoutNow among them.
    pump.hold.update({("d", leader), *((leader, m) for m in others)})
    pump.disks["d"] = Disk()
    pump.start("d")
    term = pump.node(leader).term
    answer = pump.node(leader).propose_configuration(pump.node(leader).config.without(leader))
    assert answer is not None and "hands leadership over" in answer
    pump.pump()
    handed_to = [r for s, r, m in pump.held if s == leader and isinstance(m, TimeoutNow)]
    assert len(handed_to) == 1, pump.held
    target = handed_to[0]
    # d catches up in the leader's eyes while the handover is out.
    pump.release("d", leader)
    for _ in range(3 * pump.timing.heartbeat_ticks):
        pump.tick(leader, "d")
    assert pump.node(leader).config.learners == ("d",), "promoted during the handover"
    # The other voter hears the leader first: a promotion entry would reach it before
    # the target campaigns, and it would refuse its vote.
    for member in sorted(others, key=lambda m: m == target):
        pump.release(leader, member)
    pump.run_until(lambda: pump.leader() == target, ELECTION_DEADLINE, "the handover")
    assert pump.node(target).term == term + 1
    pump.run_until(
        lambda: "d" in pump.node(target).config.voters, 10 * ELECTION_DEADLINE, "d promoted"
    )


def test_a_restarted_member_takes_its_configuration_from_the_ledger() -> None:
    pump = Pump(THREE)
    leader = _elect(pump)
    with_learner = Configuration(ABC.voters, learners=("d",))
    _propose(pump, with_learner)
    pump.produce(leader, 2)
    follower = next(m for m in THREE.members if m != leader)
    pump.run_until(lambda: len(pump.delivered(follower)) == 2, 200, "delivery")
    ledger = pump.disks[follower].ledger
    assert ledger.config == with_learner and ledger.config_index > 0
    pump.disks[follower].log.clear()  # the entry was applied and trimmed away
    pump.crash(follower)
    pump.start(follower)
    assert pump.node(follower).config == with_learner
    assert pump.node(follower).role is not Role.LEADER


def test_a_removed_members_events_stay_out_of_the_order() -> None:
    """What it reads after its removal reaches no one: the others would hold events its
    own T-global misses (kdsync members remove drains it first)."""
    pump = Pump(THREE)
    leader = _elect(pump)
    gone, staying = (m for m in THREE.members if m != leader)
    pump.produce(gone, 2)
    pump.run_until(lambda: len(pump.delivered(staying)) == 2, 200, "its events before")
    _propose(pump, pump.node(leader).config.without(gone))
    pump.run_until(lambda: not pump.node(leader).change_pending, 50, "the removal")
    pump.produce(gone, 3)
    pump.produce(leader, 2)
    pump.run_until(lambda: len(pump.delivered(staying)) == 4, 200, "the leader's events")
    for _ in range(5 * ELECTION_DEADLINE):  # the removed member's outbox resends meanwhile
        pump.tick()
    for member in (leader, staying):
        assert [e[0] for e in pump.delivered(member)].count(gone) == 2, pump.describe()


# ---------------------------------------------------------------- on the wire


# The second carries the address of a member added at runtime (its own entry kind).
CONFIGURATIONS_ON_THE_WIRE = (
    Configuration(("a", "b", "w"), frozenset({"w"}), ("d",)),
    Configuration(("a", "b", "w"), frozenset({"w"}), ("d",), (("w", "10.0.0.9:7400"),)),
)


@pytest.mark.parametrize("config", CONFIGURATIONS_ON_THE_WIRE)
def test_configurations_cross_the_wire_and_storage_unchanged(config: Configuration) -> None:
    entry = Entry(7, 2, None, config)
    assert decode_entry(encode_entry(entry)) == entry
    state = LedgerState(7, 2, {("a", "t", 0): 5}, {"t": 4}, config, 7)
    assert decode_ledger_state(encode_ledger_state(state)) == state
    append = Append(2, 6, 2, (entry,), 7, 1, 6, config)
    assert decode_message(encode_message(append)) == append
    reply = RecoverReply(2, 9, 7, 2, (entry,), 7, 2, False, config)
    assert decode_message(encode_message(reply)) == reply


def test_a_ledger_record_of_an_earlier_release_has_no_configuration() -> None:
    old = LedgerState(3, 1, {}, {"t": 2})
    decoded = decode_ledger_state(encode_ledger_state(old))
    assert decoded.config is None and decoded.config_index == 0


@pytest.mark.parametrize("config", CONFIGURATIONS_ON_THE_WIRE)
def test_a_configuration_cut_short_is_rejected_and_none_is_an_earlier_release(
    config: Configuration,
) -> None:
    """The configuration some messages and records end with is optional (earlier releases
    end before it): cut anywhere inside it, the input is refused; cut right before it,
    it is the same thing without one."""
    append = Append(2, 6, 2, (), 7, 1, 6, config)
    reply = RecoverReply(2, 9, 7, 2, (), 7, 2, False, config)
    ledger = LedgerState(7, 2, {}, {"t": 4}, config, 7)
    cases: list[tuple[bytes, bytes, Callable[[bytes], object], object]] = [
        (
            encode_message(append),
            encode_message(replace(append, config=None)),
            decode_message,
            replace(append, config=None),
        ),
        (
            encode_message(reply),
            encode_message(replace(reply, config=None)),
            decode_message,
            replace(reply, config=None),
        ),
        (
            encode_ledger_state(ledger),
            encode_ledger_state(replace(ledger, config=None, config_index=0)),
            decode_ledger_state,
            replace(ledger, config=None, config_index=0),
        ),
    ]
    for encoded, bare, decode, without in cases:
        assert encoded.startswith(bare)
        assert decode(bare) == without
        for cut in range(len(bare) + 1, len(encoded)):
            with pytest.raises(WireFormatError):
                decode(encoded[:cut])
        with pytest.raises(WireFormatError, match="unexpected byte"):
            decode(encoded + b"\x00")


def test_a_recovering_witness_also_waits_for_voters_the_answers_name() -> None:
    """Its startup file names a and b; a's answer shows c was added since (c may hold
    the witness's vote), and d as a learner (who never votes): it asks c at once and
    concludes only once c has answered too."""
    log = ReplicatedLog()
    grown = Configuration(("a", "b", "c", "w"), frozenset({"w"}), ("d",))
    recovery = WitnessRecovery(("a", "b"), 7, "w")
    asked = dict(recovery.requests(1))
    assert list(asked) == ["a", "b"]

    def answer(request: RecoverRequest) -> RecoverReply:
        return recover_reply(3, log, 0, request, 1 << 20, grown)

    assert recovery.reply("a", answer(asked["a"]), 1) is None
    ((named, to_c),) = recovery.new_requests(1)
    assert named == "c"
    assert recovery.reply("b", answer(asked["b"]), 1) is None, "c has not answered yet"
    outcome = recovery.reply("c", answer(to_c), 1)
    assert isinstance(outcome, RecoveredWitness)
    assert outcome.config == grown and outcome.term == 3


def test_a_recovering_witness_waits_for_every_configuration_from_the_committed_one_up() -> None:
    """Two members' logs hold different uncommitted changes above the committed one:
    either may have been in force when the witness voted, so it waits for the voters of
    both (the newest by index alone would hide x or y)."""
    committed = Configuration(("a", "b", "w"), frozenset({"w"}), ("x", "y"))
    with_x = Configuration(("a", "b", "w", "x"), frozenset({"w"}), ("y",))
    with_y = Configuration(("a", "b", "w", "y"), frozenset({"w"}), ("x",))
    log_a, log_b = ReplicatedLog(), ReplicatedLog()
    for index in range(1, 21):
        log_a.append(Entry(index, 2 if index > 10 else 1, None, with_x if index == 20 else None))
    for index in range(1, 16):
        log_b.append(Entry(index, 3 if index > 10 else 1, None, with_y if index == 15 else None))
    recovery = WitnessRecovery(("a", "b"), 7, "w")
    asked = dict(recovery.requests(1))
    to_a = recover_reply(2, log_a, 10, asked["a"], 1 << 20, committed)
    to_b = recover_reply(3, log_b, 10, asked["b"], 1 << 20, committed)
    assert recovery.reply("a", to_a, 1) is None
    assert recovery.reply("b", to_b, 1) is None
    assert sorted(peer for peer, _ in recovery.new_requests(1)) == ["x", "y"]


def test_a_witness_started_before_its_addition_does_not_lead_the_group_its_file_lists() -> None:
    """A witness is started before it is proposed, with a startup file that lists it
    (here: as an operator replacing ``w`` by ``x`` writes it). Recovery answers of a group
    that never changed said no configuration, so it took that file's group for the
    group's; with the leader gone it won the vote of a member that did not count it, and
    led a configuration never committed (simulator seeds 1003770, 1007088). A member
    outside the configuration is now told the one in force: it waits as a non-voter."""
    group = GroupSpec(("a", "b", "w"), frozenset({"w"}))
    pump = Pump(group)
    _elect(pump)
    pump.start("x", GroupSpec(("a", "b", "x"), frozenset({"x"})))
    pump.run_until(lambda: pump.node("x").role != Role.RECOVERING, 100, "x to recover")
    in_force = pump.node("b").config
    assert pump.node("x").config == in_force
    assert not in_force.is_voter("x")
    # Only b and x up: x's file would make them a majority, the group's does not.
    pump.crash("a")
    pump.crash("w")
    for _ in range(ELECTION_DEADLINE):
        pump.tick()
    assert pump.leader() is None, pump.describe()
    assert "x" not in pump.leaders_by_term.values(), pump.leaders_by_term


def test_messages_carry_no_configuration_until_the_membership_changes() -> None:
    """A group that never changed speaks the previous release's encoding (a witness of
    that release refuses a configuration at the end of a message)."""
    group = GroupSpec(("a", "b", "w"), frozenset({"w"}))
    pump = Pump(group)
    seen: list[Append | RecoverReply] = []

    def record(sender: str, receiver: str, message: object) -> bool:
        if isinstance(message, Append | RecoverReply):
            seen.append(message)
        return False

    pump.drop = record
    leader = _elect(pump)
    pump.produce(next(m for m in group.data_members if m != leader) if leader == "w" else leader, 2)
    pump.crash("w")
    pump.start("w")  # recovers: RecoverReplies
    assert any(isinstance(m, RecoverReply) for m in seen)
    assert all(m.config is None for m in seen)
    seen.clear()
    leader = _elect(pump)
    _propose(pump, Configuration(group.members, group.witnesses, ("d",)))
    for _ in range(3):
        pump.tick()
    to_witness = [m for m in seen if isinstance(m, Append) and m.config is not None]
    assert to_witness, "Appends to the witness say the configuration once it changed"
