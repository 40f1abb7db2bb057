"""The RDMA frame stream without a device: frames cut into messages under credits and
rebuilt on the other side, whatever the frame and buffer sizes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdsync.transport import FrameTooLarge
from kdsync.transport.framing import encode_frame
from kdsync.transport.rdma.stream import FrameAssembler, Outgoing


@settings(max_examples=300, deadline=None)
@given(
    frames=st.lists(st.binary(max_size=300), max_size=30),
    message_bytes=st.integers(min_value=5, max_value=64),
    slots=st.integers(min_value=1, max_value=4),
    credits=st.integers(min_value=1, max_value=6),
    batches=st.integers(min_value=1, max_value=5),
)
def test_frames_arrive_whole_and_in_order_and_credits_are_never_overdrawn(
    frames: list[bytes], message_bytes: int, slots: int, credits: int, batches: int
) -> None:
    outgoing = Outgoing(message_bytes, slots, credits)
    assembler = FrameAssembler(max_frame_bytes=1000)
    posted = credits  # receive buffers the receiver has posted for this sender
    received: list[bytes] = []
    step = max(1, len(frames) // batches)
    for start in range(0, len(frames) + 1, step):
        outgoing.add_frames(frames[start : start + step])
        while outgoing.pending_bytes:
            sent = []
            while (message := outgoing.next_message()) is not None:
                slot, data = message
                assert len(data) <= message_bytes
                assert posted > 0, "a message was sent without a buffer posted for it"
                posted -= 1
                sent.append(slot)
                received += assembler.feed(data)
            assert sent, "stuck: pending bytes but nothing could be sent"
            for slot in sent:  # the sends complete, the receiver re-posts and grants
                outgoing.sent(slot)
            outgoing.grant(len(sent))
            posted += len(sent)
    assert outgoing.pending_bytes == 0
    assert received == frames
    assert not assembler.partial


def test_messages_carry_exactly_the_encoded_frames() -> None:
    outgoing = Outgoing(message_bytes=8, slots=10, credits=10)
    outgoing.add_frames([b"abc", b"", b"0123456789"])
    messages = []
    while (message := outgoing.next_message()) is not None:
        messages.append(message[1])
    assert b"".join(messages) == encode_frame(b"abc") + encode_frame(b"") + encode_frame(
        b"0123456789"
    )
    assert [len(m) for m in messages] == [8, 8, 8, 1]
    assert outgoing.credits == 6


def test_no_credit_or_no_free_slot_stops_the_sender() -> None:
    outgoing = Outgoing(message_bytes=8, slots=1, credits=2)
    outgoing.add_frames([bytes(30)])
    first = outgoing.next_message()
    assert first is not None
    assert outgoing.next_message() is None  # the one slot is in flight
    outgoing.sent(first[0])
    assert outgoing.next_message() is not None
    outgoing.sent(0)
    assert outgoing.next_message() is None  # both credits spent
    outgoing.grant(1)
    assert outgoing.next_message() is not None


def test_a_frame_split_over_messages_is_partial_until_its_last_byte() -> None:
    assembler = FrameAssembler(max_frame_bytes=100)
    encoded = encode_frame(b"x" * 20)
    assert assembler.feed(encoded[:2]) == [] and assembler.partial
    assert assembler.feed(encoded[2:10]) == [] and assembler.partial
    assert assembler.feed(encoded[10:]) == [b"x" * 20]
    assert not assembler.partial


def test_an_oversized_length_prefix_is_refused_before_its_payload() -> None:
    assembler = FrameAssembler(max_frame_bytes=100)
    with pytest.raises(FrameTooLarge):
        assembler.feed((101).to_bytes(4, "big"))
