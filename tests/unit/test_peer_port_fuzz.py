"""Property-based fuzzing of what a peer's bytes go through: framing, then the wire codec.

Whatever arrives, the decoder raises only ``WireFormatError`` and the frame reader only
``FrameTooLarge`` or ``IncompleteReadError``; the reader refuses an oversized length
prefix before reading (or allocating) the body; every valid message round-trips.

Example counts are modest so tests/unit stays fast. For a long run:
``hack/fuzz-peer-port --examples 20000`` (or ``KDSYNC_FUZZ_EXAMPLES=20000``).
"""

from __future__ import annotations

import asyncio
import os
import struct
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdsync.ordering import Entry, OriginBatch, SourceEvent
from kdsync.ordering.messages import (
    Append,
    AppendReply,
    Forward,
    Message,
    PreVoteReply,
    PreVoteRequest,
    RecoverReply,
    RecoverRequest,
    TimeoutNow,
    VoteReply,
    VoteRequest,
)
from kdsync.transport.base import FrameTooLarge
from kdsync.transport.framing import HEADER_BYTES, LENGTH_PREFIX, encode_frame, read_frame
from kdsync.wire_format.envelope import WireFormatError
from kdsync.wire_format.messages import decode_message, encode_message

_LONG_RUN = os.environ.get("KDSYNC_FUZZ_EXAMPLES")
settings.register_profile(
    "peer-port",
    max_examples=int(_LONG_RUN or "60"),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # tests/unit: the same examples every run (no flakes, no example database in the
    # tree); a long run explores fresh ones.
    derandomize=_LONG_RUN is None,
    database=None,
)
FUZZ = settings.get_profile("peer-port")

i64 = st.integers(-(2**63), 2**63 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
names = st.text(max_size=12)
small_bytes = st.binary(max_size=24)
events = st.builds(
    SourceEvent,
    offset=i64,
    key=st.none() | small_bytes,
    value=st.none() | small_bytes,
    headers=st.lists(st.tuples(names, st.none() | small_bytes), max_size=3).map(tuple),
    timestamp_ms=i64,
)
batches = st.builds(
    OriginBatch,
    origin=names,
    topic=names,
    partition=i32,
    start=i64,
    end=i64,
    opens=st.booleans(),
    events=st.lists(events, max_size=3).map(tuple),
)
entries = st.builds(Entry, index=i64, term=i64, batch=st.none() | batches)
entry_lists = st.lists(entries, max_size=3).map(tuple)
messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(VoteRequest, i64, i64, i64, i64, st.booleans()),
    st.builds(PreVoteRequest, i64, i64, i64, i64),
    st.builds(PreVoteReply, i64, st.booleans(), i64),
    st.builds(VoteReply, i64, st.booleans(), i64),
    st.builds(Append, i64, i64, i64, entry_lists, i64, i64, i64),
    st.builds(AppendReply, i64, st.booleans(), i64, i64, i64, i64, i64, i64),
    st.builds(Forward, i64, st.lists(batches, max_size=3).map(tuple)),
    st.builds(TimeoutNow, i64),
    st.builds(RecoverRequest, i64, i64),
    st.builds(RecoverReply, i64, i64, i64, i64, entry_lists),
)


def decodes_or_refuses(data: bytes) -> Message | None:
    """Decode, allowing only the documented error."""
    try:
        return decode_message(data)
    except WireFormatError:
        return None


class ByteReader:
    """A ``FrameReader`` over bytes that records how much was asked for at once."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.largest_request = 0

    async def readexactly(self, n: int) -> bytes:
        self.largest_request = max(self.largest_request, n)
        chunk = self.data[self.pos : self.pos + n]
        self.pos += len(chunk)
        if len(chunk) < n:
            raise asyncio.IncompleteReadError(chunk, n)
        return chunk


# -- the codec ----------------------------------------------------------------------


@FUZZ
@given(messages)
def test_every_valid_message_round_trips(message: Message) -> None:
    encoded = encode_message(message)
    assert decode_message(encoded) == message
    assert encode_message(decode_message(encoded)) == encoded


@FUZZ
@given(st.binary(max_size=512))
def test_arbitrary_bytes_decode_or_raise_wire_format_error(data: bytes) -> None:
    decodes_or_refuses(data)


@FUZZ
@given(messages, st.data())
def test_every_truncation_of_a_message_is_refused(message: Message, data: st.DataObject) -> None:
    encoded = encode_message(message)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(WireFormatError):
        decode_message(encoded[:cut])


@FUZZ
@given(messages, st.binary(min_size=1, max_size=16))
def test_trailing_bytes_after_a_message_are_refused(message: Message, extra: bytes) -> None:
    with pytest.raises(WireFormatError):
        decode_message(encode_message(message) + extra)


@FUZZ
@given(messages, st.data())
def test_corrupted_messages_decode_or_raise_wire_format_error(
    message: Message, data: st.DataObject
) -> None:
    """Flipped bytes (lengths, counts, flags, tags) anywhere in a valid message."""
    encoded = bytearray(encode_message(message))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(encoded) - 1))
        encoded[at] = data.draw(st.integers(0, 255))
    decodes_or_refuses(bytes(encoded))


@FUZZ
@given(messages, st.sampled_from([0xFF, 0x7F, 0x80]), st.data())
def test_huge_counts_and_lengths_cost_no_more_than_the_input(
    message: Message, fill: int, data: st.DataObject
) -> None:
    """A count or length field pumped up to ~4 billion must not make the decoder
    allocate or loop beyond what the input's own size allows."""
    encoded = bytearray(encode_message(message))
    if len(encoded) < 6:
        return
    at = data.draw(st.integers(2, len(encoded) - 4))
    encoded[at : at + 4] = bytes([fill]) * 4
    tracemalloc.start()
    try:
        decodes_or_refuses(bytes(encoded))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 + 64 * len(encoded)


@FUZZ
@given(st.lists(messages, min_size=1, max_size=5), st.randoms(use_true_random=False))
def test_replayed_and_reordered_frames_each_decode_to_their_own_message(
    sent: list[Message], rng: object
) -> None:
    """Frames are self-contained: a replayed or reordered stream of them decodes,
    frame by frame, to exactly the messages they carried (what to do with a stale or
    duplicate one is the ordering core's business, not the codec's)."""
    frames = [encode_frame(encode_message(m)) for m in sent]
    stream_order = frames + frames[:2]  # replay the first two
    rng.shuffle(stream_order)  # type: ignore[attr-defined]
    reader = ByteReader(b"".join(stream_order))

    async def read_all() -> list[Message]:
        out = []
        for _ in stream_order:
            out.append(decode_message(await read_frame(reader, 1 << 20)))
        return out

    received = asyncio.run(read_all())
    by_frame = {frame: message for frame, message in zip(frames, sent, strict=True)}
    assert received == [by_frame[frame] for frame in stream_order]


# -- framing -------------------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=64), st.integers(1, 1 << 16))
def test_frame_reader_raises_only_its_documented_errors(data: bytes, limit: int) -> None:
    reader = ByteReader(data)

    async def drain() -> None:
        while True:
            await read_frame(reader, limit)

    with pytest.raises((FrameTooLarge, asyncio.IncompleteReadError)):
        asyncio.run(drain())
    # Never asked for more than one frame's limit, whatever the prefix said.
    assert reader.largest_request <= max(limit, HEADER_BYTES)


@FUZZ
@given(st.integers(1, 1 << 20), st.integers(0, 2**32 - 1))
def test_an_oversized_length_prefix_is_refused_before_the_body_is_read(
    limit: int, announced: int
) -> None:
    reader = ByteReader(LENGTH_PREFIX.pack(announced) + b"x" * 16)
    if announced <= limit:
        return
    with pytest.raises(FrameTooLarge):
        asyncio.run(read_frame(reader, limit))
    assert reader.pos == HEADER_BYTES


def test_a_1_gib_length_prefix_allocates_nothing() -> None:
    reader = ByteReader(struct.pack(">I", 1 << 30))
    tracemalloc.start()
    try:
        with pytest.raises(FrameTooLarge):
            asyncio.run(read_frame(reader, 64 * 1024 * 1024))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reader.largest_request == HEADER_BYTES
    assert peak < 1024 * 1024  # the event loop's own bookkeeping, not the announced GiB
