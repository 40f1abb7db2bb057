"""DeliveryLedger: the exactly-once decision taken when a committed entry is applied.

Every data member runs the same ledger over the same committed log, so what is checked
here is what every member's ``T-global`` ends up holding: which events of a batch are
written, under which global sequence number, and which batches are dropped.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from kdsync.ordering import (
    BatchVerdict,
    DeliveredEvent,
    Delivery,
    DeliveryLedger,
    Entry,
    LedgerState,
    OriginBatch,
    SourceEvent,
)


def event(offset: int, value: bytes | None = b"v", key: bytes | None = b"k") -> SourceEvent:
    return SourceEvent(offset, key, value, (), 1_700_000_000_000 + offset)


def batch(
    start: int,
    end: int,
    *,
    offsets: Iterable[int] | None = None,
    opens: bool = False,
    origin: str = "a",
    topic: str = "t",
    partition: int = 0,
) -> OriginBatch:
    """A batch [start, end); by default one event per offset in the range."""
    chosen = range(start, end) if offsets is None else offsets
    return OriginBatch(origin, topic, partition, start, end, opens, tuple(event(o) for o in chosen))


class Applier:
    """Feeds batches to a ledger as consecutive committed entries (term 1)."""

    def __init__(self, ledger: DeliveryLedger | None = None) -> None:
        self.ledger = ledger or DeliveryLedger()

    def apply(self, item: OriginBatch | None, term: int = 1) -> Delivery:
        return self.ledger.apply(Entry(self.ledger.applied_index + 1, term, item))


def offsets_of(delivery: Delivery) -> list[int]:
    return [d.event.offset for d in delivery.events]


def seqs_of(delivery: Delivery) -> list[int]:
    return [d.seq for d in delivery.events]


# ---------------------------------------------------------------- sequence numbers


def test_sequence_numbers_are_contiguous_per_topic_and_start_at_zero() -> None:
    log = Applier()
    seqs: dict[str, list[int]] = {"t": [], "u": []}
    for item in [
        batch(0, 3, opens=True),  # a/t/0
        batch(0, 2, opens=True, partition=1),  # a/t/1
        batch(10, 12, opens=True, origin="b"),  # b/t/0: another origin, same topic
        batch(0, 4, opens=True, topic="u"),  # a/u/0: another topic, its own numbering
        batch(3, 5),  # a/t/0 again
    ]:
        delivery = log.apply(item)
        assert delivery.verdict is BatchVerdict.DELIVERED
        assert all(d.topic == item.topic for d in delivery.events)
        seqs[item.topic].extend(seqs_of(delivery))
    assert seqs["t"] == list(range(9)), "one gap-free sequence over every origin of topic t"
    assert seqs["u"] == list(range(4)), "topic u numbers its events from 0 on its own"
    assert log.ledger.next_seq == {"t": 9, "u": 4}


def test_delivered_events_carry_their_origin_coordinates() -> None:
    log = Applier()
    delivery = log.apply(batch(5, 7, opens=True, origin="b", topic="orders", partition=3))
    assert delivery.origin_partition == ("b", "orders", 3)
    assert [(d.origin, d.topic, d.partition, d.event.offset) for d in delivery.events] == [
        ("b", "orders", 3, 5),
        ("b", "orders", 3, 6),
    ]
    assert (delivery.index, delivery.term) == (1, 1)


def test_same_partition_of_different_origins_are_separate_chains() -> None:
    log = Applier()
    assert log.apply(batch(0, 3, opens=True, origin="a")).verdict is BatchVerdict.DELIVERED
    # b's offsets 0..2 of t/0 are different events from a's, not duplicates of them.
    second = log.apply(batch(0, 3, opens=True, origin="b"))
    assert second.verdict is BatchVerdict.DELIVERED
    assert seqs_of(second) == [3, 4, 5]
    assert log.ledger.marks == {("a", "t", 0): 3, ("b", "t", 0): 3}


# ---------------------------------------------------------------- opening a chain


def test_first_batch_of_a_partition_is_accepted_only_if_it_opens() -> None:
    log = Applier()
    rejected = log.apply(batch(0, 3))
    assert rejected.verdict is BatchVerdict.GAP
    assert rejected.events == ()
    assert log.ledger.marks == {}, "a rejected batch sets no mark"
    assert log.ledger.next_seq == {}, "a rejected batch consumes no sequence numbers"

    accepted = log.apply(batch(0, 3, opens=True))
    assert accepted.verdict is BatchVerdict.DELIVERED
    assert seqs_of(accepted) == [0, 1, 2]
    assert log.ledger.marks == {("a", "t", 0): 3}


def test_an_opening_batch_may_start_anywhere() -> None:
    # A source consumer that starts from a committed position far into the partition.
    log = Applier()
    delivery = log.apply(batch(1000, 1002, opens=True))
    assert delivery.verdict is BatchVerdict.DELIVERED
    assert offsets_of(delivery) == [1000, 1001]
    assert seqs_of(delivery) == [0, 1]
    assert log.ledger.marks[("a", "t", 0)] == 1002


def test_opens_does_not_reset_an_existing_chain() -> None:
    log = Applier()
    log.apply(batch(0, 3, opens=True))
    # After a restart an origin opens again, but the ordered stream already has a mark:
    # the batch is judged against it, so it can neither skip ahead nor replay.
    assert log.apply(batch(5, 6, opens=True)).verdict is BatchVerdict.GAP
    assert log.apply(batch(0, 3, opens=True)).verdict is BatchVerdict.DUPLICATE
    assert log.ledger.marks == {("a", "t", 0): 3}


# ---------------------------------------------------------------- re-offers and duplicates


def test_reoffered_batch_after_restart_delivers_only_the_new_events() -> None:
    log = Applier()
    log.apply(batch(0, 3, opens=True))
    # The origin restarted from an older committed position (1) and read further (to 5).
    delivery = log.apply(batch(1, 5, opens=True))
    assert delivery.verdict is BatchVerdict.DELIVERED
    assert offsets_of(delivery) == [3, 4], "events below the mark were delivered already"
    assert seqs_of(delivery) == [3, 4], "sequence numbers continue without a hole"
    assert log.ledger.marks[("a", "t", 0)] == 5


def test_reoffer_with_offset_holes_drops_exactly_the_events_below_the_mark() -> None:
    # Kafka offsets have holes (transaction markers, compaction): positions, not counts.
    log = Applier()
    log.apply(batch(0, 4, offsets=[0, 2], opens=True))  # position 4: offset 3 was a marker
    delivery = log.apply(batch(0, 9, offsets=[0, 2, 4, 6, 8], opens=True))
    assert offsets_of(delivery) == [4, 6, 8]
    assert seqs_of(delivery) == [2, 3, 4]
    assert log.ledger.marks[("a", "t", 0)] == 9


def test_full_duplicate_delivers_nothing() -> None:
    log = Applier()
    log.apply(batch(0, 3, opens=True))
    log.apply(batch(3, 6))
    before = log.ledger.snapshot()
    for dup in (batch(0, 3), batch(3, 6), batch(1, 6), batch(0, 6, opens=True)):
        delivery = log.apply(dup)
        assert delivery.verdict is BatchVerdict.DUPLICATE, dup
        assert delivery.events == ()
        assert delivery.origin_partition == ("a", "t", 0)
    after = log.ledger.snapshot()
    assert after.marks == before.marks
    assert after.next_seq == before.next_seq
    assert after.applied_index == before.applied_index + 4, "duplicates still use their index"


def test_covers_tells_whether_every_event_of_a_batch_was_delivered() -> None:
    ledger = DeliveryLedger()
    assert not ledger.covers(batch(0, 1)), "nothing delivered yet"
    Applier(ledger).apply(batch(0, 3, opens=True))
    assert ledger.covers(batch(0, 3))
    assert ledger.covers(batch(1, 2))
    assert not ledger.covers(batch(2, 4)), "offset 3 is new"
    assert not ledger.covers(batch(0, 3, partition=1)), "another partition"
    assert not ledger.covers(batch(0, 3, origin="b")), "another origin"


# ---------------------------------------------------------------- gaps


def test_gap_is_rejected_and_a_later_in_order_batch_is_accepted() -> None:
    log = Applier()
    log.apply(batch(0, 3, opens=True))
    gap = log.apply(batch(5, 7))  # [3, 5) has not been ordered yet
    assert gap.verdict is BatchVerdict.GAP
    assert gap.events == ()
    assert gap.origin_partition == ("a", "t", 0)
    assert log.ledger.marks[("a", "t", 0)] == 3
    assert log.ledger.next_seq["t"] == 3

    filled = log.apply(batch(3, 5))
    assert filled.verdict is BatchVerdict.DELIVERED
    assert seqs_of(filled) == [3, 4]

    # The origin offers the rejected batch again after the missing one.
    again = log.apply(batch(5, 7))
    assert again.verdict is BatchVerdict.DELIVERED
    assert offsets_of(again) == [5, 6]
    assert seqs_of(again) == [5, 6]


def test_a_gap_in_one_partition_does_not_hold_back_another() -> None:
    log = Applier()
    log.apply(batch(0, 1, opens=True, partition=0))
    log.apply(batch(0, 1, opens=True, partition=1))
    assert log.apply(batch(2, 3, partition=0)).verdict is BatchVerdict.GAP
    other = log.apply(batch(1, 2, partition=1))
    assert other.verdict is BatchVerdict.DELIVERED
    assert seqs_of(other) == [2]


# ---------------------------------------------------------------- fidelity


def test_null_key_value_headers_and_timestamps_pass_through_untouched() -> None:
    events = (
        SourceEvent(0, None, b"payload", (), 0),  # null key
        SourceEvent(1, b"k", None, (), -1),  # tombstone, "no timestamp" (-1)
        SourceEvent(
            2,
            b"\x00\xff",
            b"",  # empty, not null
            (("trace", b"1"), ("trace", b"2"), ("empty", b""), ("null", None)),
            1_700_000_000_123,
        ),
        SourceEvent(3, None, None, (("\u00e9t\u00e9", b"\xc3\xa9"),), 2**62),
    )
    item = OriginBatch("a", "t", 0, 0, 4, True, events)
    delivery = Applier().apply(item)
    assert [d.event for d in delivery.events] == list(events)
    for delivered, original in zip(delivery.events, events, strict=True):
        # The very same object: nothing re-encoded, reordered or stripped.
        assert delivered.event is original
    tombstone = delivery.events[1].event
    assert tombstone.key == b"k"
    assert tombstone.value is None
    assert delivery.events[2].event.value == b""
    assert delivery.events[2].event.headers[0:2] == (("trace", b"1"), ("trace", b"2"))
    assert delivery.events[2].event.headers[3] == ("null", None)


def test_partially_delivered_batch_keeps_the_remaining_events_untouched() -> None:
    events = tuple(
        SourceEvent(o, None if o % 2 else b"k", None, (("h", str(o).encode()),), o)
        for o in range(4)
    )
    log = Applier()
    log.apply(OriginBatch("a", "t", 0, 0, 2, True, events[:2]))
    delivery = log.apply(OriginBatch("a", "t", 0, 0, 4, True, events))
    assert [d.event for d in delivery.events] == [events[2], events[3]]
    assert delivery.events[0].event is events[2]


# ---------------------------------------------------------------- no-ops


def test_noop_entries_consume_an_index_but_no_sequence_numbers() -> None:
    log = Applier()
    noop = log.apply(None, term=2)
    assert noop == Delivery(1, 2, BatchVerdict.NOOP, (), None)
    assert log.ledger.next_seq == {}
    assert (log.ledger.applied_index, log.ledger.applied_term) == (1, 2)

    first = log.apply(batch(0, 2, opens=True), term=2)
    assert first.index == 2
    assert seqs_of(first) == [0, 1]
    log.apply(None, term=3)
    log.apply(None, term=3)
    after = log.apply(batch(2, 3), term=3)
    assert after.index == 5
    assert seqs_of(after) == [2], "no-ops leave no hole in the sequence"
    assert (log.ledger.applied_index, log.ledger.applied_term) == (5, 3)


def test_entries_must_be_applied_in_index_order() -> None:
    ledger = DeliveryLedger()
    with pytest.raises(AssertionError):
        ledger.apply(Entry(2, 1, None))
    ledger.apply(Entry(1, 1, None))
    with pytest.raises(AssertionError):
        ledger.apply(Entry(1, 1, None))


# ---------------------------------------------------------------- snapshot / restore


def history() -> list[OriginBatch | None]:
    return [
        None,
        batch(0, 3, opens=True),
        batch(0, 2, opens=True, origin="b", topic="u"),
        batch(5, 6),  # gap
        batch(3, 5),
        batch(0, 4),  # duplicate
        None,
        batch(2, 4, origin="b", topic="u"),
    ]


def future() -> list[OriginBatch | None]:
    return [
        batch(5, 8),
        batch(4, 6, origin="b", topic="u"),  # partly new
        batch(0, 1, opens=True, partition=7),
        None,
        batch(9, 10),  # gap
    ]


def describe(delivery: Delivery) -> tuple[object, ...]:
    return (delivery.index, delivery.term, delivery.verdict, delivery.events)


def test_snapshot_restore_round_trips() -> None:
    original = Applier()
    for item in history():
        original.apply(item)
    state = original.ledger.snapshot()
    assert state == LedgerState(
        applied_index=8,
        applied_term=1,
        marks={("a", "t", 0): 5, ("b", "u", 0): 4},
        next_seq={"t": 5, "u": 4},
    )

    restored = Applier(DeliveryLedger(state))
    assert restored.ledger.snapshot() == state
    # The restored ledger decides every later entry exactly as the original does.
    for item in future():
        assert describe(restored.apply(item)) == describe(original.apply(item))
    assert restored.ledger.snapshot() == original.ledger.snapshot()


def test_snapshot_is_a_copy_that_later_applies_do_not_change() -> None:
    log = Applier()
    log.apply(batch(0, 1, opens=True))
    state = log.ledger.snapshot()
    log.apply(batch(1, 2))
    assert state.marks == {("a", "t", 0): 1}
    assert state.next_seq == {"t": 1}
    assert state.applied_index == 1

    # ... and a ledger restored from a state does not write through to it either.
    restored = DeliveryLedger(state)
    Applier(restored).apply(batch(1, 5))
    assert state.marks == {("a", "t", 0): 1}
    assert state.next_seq == {"t": 1}


def test_empty_ledger_starts_before_index_one() -> None:
    ledger = DeliveryLedger()
    assert ledger.snapshot() == LedgerState()
    assert (ledger.applied_index, ledger.applied_term) == (0, 0)


def test_delivered_event_sequence_is_stable_under_reapplication_elsewhere() -> None:
    # Two members applying the same committed log get identical deliveries.
    one, two = Applier(), Applier()
    outputs: list[list[tuple[DeliveredEvent, ...]]] = [[], []]
    for item in history() + future():
        outputs[0].append(one.apply(item).events)
        outputs[1].append(two.apply(item).events)
    assert outputs[0] == outputs[1]
