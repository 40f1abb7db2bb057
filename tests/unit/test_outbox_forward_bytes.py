"""An origin's Forward fits in one peer frame however much it holds.

A follower that had no leader for a while (cut off, an election) holds up to
``max_outbox_bytes`` (64 MiB) of batches; when a leader appears they used to travel in one
Forward of up to ``max_forward`` batches, which with large batches was over the 64 MiB
frame limit: the transport refused it and the sidecar stopped (``FrameTooLarge``). The
outbox now hands out at most ``max_forward_bytes`` per call (or one batch), and the rest
at the next calls, every batch once and in order."""

from __future__ import annotations

import itertools

from kdsync.ordering import OriginBatch, SourceEvent
from kdsync.ordering.group import Timing
from kdsync.ordering.messages import Forward
from kdsync.ordering.outbox import Outbox
from kdsync.transport.framing import DEFAULT_MAX_FRAME_BYTES
from kdsync.wire_format.messages import encode_message

MIB = 1024 * 1024


def _batch(index: int, event_bytes: int, events: int) -> OriginBatch:
    start = index * events
    return OriginBatch(
        "m1",
        "orders",
        0,
        start,
        start + events,
        index == 0,
        tuple(
            SourceEvent(start + i, b"k", b"v" * event_bytes, (), 1_700_000_000_000)
            for i in range(events)
        ),
    )


def _outbox(timing: Timing) -> Outbox:
    return Outbox(
        timing.max_outbox,
        timing.max_outbox_bytes,
        timing.max_forward,
        timing.resend_ticks,
        timing.max_forward_bytes,
    )


def test_a_full_outbox_leaves_in_forwards_that_each_fit_in_a_frame() -> None:
    timing = Timing()
    outbox = _outbox(timing)
    # 64 MiB held: 16 batches of 4 MiB (maxBatchBytes may be up to 16 MiB).
    batches = [_batch(i, 4 * MIB // 8, 8) for i in range(16)]
    for batch in batches:
        outbox.add(batch)
    assert not outbox.has_room()

    sent: list[OriginBatch] = []
    forwards: list[list[OriginBatch]] = []
    while len(sent) < len(batches):
        due = outbox.due(len(forwards))
        assert due, f"nothing due with {len(batches) - len(sent)} unsent"
        frame = encode_message(Forward(term=1, batches=tuple(due)))
        assert len(frame) <= DEFAULT_MAX_FRAME_BYTES, (len(due), len(frame))
        assert sum(b.size_bytes() for b in due) <= timing.max_forward_bytes
        sent.extend(due)
        forwards.append(due)
    assert sent == batches, "every batch once, in offer order"
    # No needless splitting: each Forward but the last had no room for the next batch.
    for forward, following in itertools.pairwise(forwards):
        taken = sum(b.size_bytes() for b in forward)
        assert taken + following[0].size_bytes() > timing.max_forward_bytes


def test_a_batch_larger_than_the_bound_still_goes_alone() -> None:
    outbox = Outbox(100, 1 << 30, 16, 40, max_forward_bytes=MIB)
    small, big, after = _batch(0, 100, 10), _batch(1, 3 * MIB, 1), _batch(2, 100, 10)
    for batch in (small, big, after):
        outbox.add(batch)
    assert outbox.due(0) == [small]
    assert outbox.due(0) == [big]
    assert outbox.due(0) == [after]
    assert outbox.due(0) == []


def test_small_batches_keep_travelling_together_up_to_the_window() -> None:
    """The bound changes nothing for ordinary traffic: 16 batches of 50 kB go at once."""
    timing = Timing()
    outbox = _outbox(timing)
    batches = [_batch(i, 100, 500) for i in range(20)]
    for batch in batches:
        outbox.add(batch)
    assert outbox.due(0) == batches[: timing.max_forward]
