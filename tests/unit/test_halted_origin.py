"""An origin that cannot write its own T-global still gets every one of its events
ordered (issue #13).

A halted member applies nothing, so what it learns about its own batches it must learn
when they commit: that one was skipped (a later batch of the same partition reached the
log first: applied, it will be a gap) and that the rest are in the ordered stream and
need not be kept or offered again.
"""

from __future__ import annotations

from kdsync.ordering import (
    Entry,
    Message,
    OrderingNode,
    OriginBatch,
    Ready,
    RecoveredState,
    SourceEvent,
    Timing,
)
from kdsync.ordering.messages import Append, Forward
from tests.unit.ordering_pump import (
    ELECTION_DEADLINE,
    THREE,
    Pump,
    assert_same_order_everywhere,
    halted_follower,
)


def _others_have_every_event(pump: Pump, halted: str) -> bool:
    wanted = pump.produced()
    return all(set(pump.delivered(m)) == wanted for m in THREE.data_members if m != halted)


def test_a_halted_origin_whose_forward_was_lost_offers_the_later_batch_again() -> None:
    # A halted member applies only what fits its apply window; the rest waits unapplied.
    pump, leader, origin = halted_follower(Timing(max_apply_bytes=60))
    lost: list[int] = []

    def lose_the_second_batch(sender: str, receiver: str, message: Message) -> bool:
        # A leader whose admission queue is full drops the batches of a Forward it
        # cannot hold; the same happens to a Forward lost with its connection.
        if sender != origin or not isinstance(message, Forward) or lost:
            return False
        if any(batch.start == 1 for batch in message.batches):
            lost.append(1)
            return True
        return False

    pump.drop = lose_the_second_batch
    pump.produce(leader, 5)  # fills the halted origin's apply window
    for _ in range(3):
        pump.produce(origin, 1)  # one batch each, forwarded at once
    assert lost, "the test did not lose the Forward it meant to"
    others = [m for m in THREE.data_members if m != origin]
    pump.run_until(
        lambda: _others_have_every_event(pump, origin),
        20 * Timing().resend_ticks,
        "the others deliver every event of the halted origin",
    )
    assert_same_order_everywhere(pump, others)
    assert not pump.disks[origin].delivered, "the origin stayed halted throughout"

    pump.resume(origin)
    pump.run_until(pump.all_delivered_everywhere, ELECTION_DEADLINE, "the origin catches up")
    assert_same_order_everywhere(pump, THREE.data_members)


def test_a_halted_origin_keeps_offering_far_more_than_its_outbox_holds() -> None:
    """Its outbox lets a batch go once the batch is committed in order, not once it is
    written: its events keep reaching the others however long it stays halted."""
    pump, _, origin = halted_follower(Timing(max_apply_bytes=60, max_outbox=4))
    for _ in range(10):
        pump.produce(origin, 4)  # a full outbox each time: ten outboxes' worth in all
        pump.tick()
    pump.run_until(
        lambda: _others_have_every_event(pump, origin),
        ELECTION_DEADLINE,
        "the others deliver every event of the halted origin",
    )
    assert len(pump.disks[origin].delivered) == 0
    assert pump.node(origin).outbox_size() == 0

    pump.resume(origin)
    pump.run_until(pump.all_delivered_everywhere, ELECTION_DEADLINE, "the origin catches up")
    assert_same_order_everywhere(pump, THREE.data_members)


def test_an_old_append_seen_again_after_a_gap_does_not_stop_the_batch_travelling() -> None:
    """A batch of ours committed as a gap travels again; a copy of the Append that first
    carried it (a duplicate on the link, a probe from a stale match) must not count as
    seeing it appended, even while this member has not applied that entry."""
    b = OrderingNode("b", THREE, Timing(max_apply_bytes=60), 1, RecoveredState())
    big = OriginBatch("a", "t", 0, 0, 1, True, (_event(0, 100),))
    first = OriginBatch("b", "t", 0, 0, 1, True, (_event(0),))
    second = OriginBatch("b", "t", 0, 1, 2, False, (_event(1),))
    # Leader a's first entry is committed; b applies it and, halted, never writes it:
    # its apply window stays full.
    b.receive("a", Append(1, 0, 0, (Entry(1, 1, big),), 1, 7, 0))
    b.ready()
    assert b.offer(first) and b.offer(second)
    b.ready()  # both forwarded; the leader admits only the second
    carrying_second = Append(1, 1, 1, (Entry(2, 1, second),), 1, 7, 0)
    b.receive("a", carrying_second)
    b.ready()
    b.receive("a", Append(1, 2, 1, (), 2, 7, 0))  # it commits: a gap, both travel again
    assert _forwarded(b.ready()) == [(0, 1), (1, 2)]
    assert b.ledger is not None and b.ledger.applied_index < b.commit_index
    b.receive("a", carrying_second)  # that Forward was lost; an old copy arrives
    b.ready()
    resent: list[tuple[int, int]] = []
    for _ in range(3 * b.timing.resend_ticks):
        b.tick()
        b.receive("a", Append(1, 2, 1, (), 2, 7, 0))
        resent += _forwarded(b.ready())
    assert (1, 2) in resent, resent


def _event(offset: int, size: int = 1) -> SourceEvent:
    return SourceEvent(offset, b"k" * size, b"v" * size, (), 0)


def _forwarded(ready: Ready) -> list[tuple[int, int]]:
    return [
        (batch.start, batch.end)
        for out in ready.messages
        if isinstance(out.message, Forward)
        for batch in out.message.batches
    ]
