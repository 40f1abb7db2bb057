"""The wire format: what sidecars send each other and what they keep in Kafka.

Every value must come back exactly as it went in (None stays None, b"" stays b"",
header order and duplicates stay), and any byte string that is not a valid encoding
must be rejected with WireFormatError and nothing else: a peer sending garbage, or a
record written by another kdsync version, must never crash the receiver.
"""

from __future__ import annotations

import contextlib
import random
import struct
from collections.abc import Callable

import pytest

from kdsync.ordering import Entry, HardState, LedgerState, OriginBatch, SourceEvent
from kdsync.ordering.events import Header
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
from kdsync.wire_format.envelope import FORMAT_VERSION, TAG_APPEND, TAG_ENTRY, WireFormatError
from kdsync.wire_format.messages import decode_message, encode_message
from kdsync.wire_format.records import (
    decode_entry,
    decode_hard_state,
    decode_ledger_state,
    encode_entry,
    encode_hard_state,
    encode_ledger_state,
)

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
INT32_MAX = 2**31 - 1

Decoder = Callable[[bytes], object]
DECODERS: tuple[Decoder, ...] = (
    decode_message,
    decode_entry,
    decode_hard_state,
    decode_ledger_state,
)


# -- sample values ----------------------------------------------------------------------


def event(
    offset: int = 0,
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    headers: tuple[Header, ...] = (),
    timestamp_ms: int = 1_700_000_000_000,
) -> SourceEvent:
    return SourceEvent(offset, key, value, headers, timestamp_ms)


def batch(
    *events: SourceEvent, origin: str = "a", topic: str = "t", opens: bool = True
) -> OriginBatch:
    start = events[0].offset if events else 0
    end = events[-1].offset + 1 if events else 0
    return OriginBatch(origin, topic, 2, start, end, opens, events)


EDGE_EVENTS = (
    event(0, None, None),  # a tombstone without a key
    event(1, b"", b""),  # empty, not None
    event(2, None, b"value", timestamp_ms=0),
    event(3, b"key", None, timestamp_ms=-1),  # Kafka's "no timestamp"
    event(INT64_MAX, b"\x00\xff" * 3, b"\x00", timestamp_ms=INT64_MAX),
    event(4, headers=(("h", None), ("h", b""), ("h", b"dup"), ("", b"\x00"))),
    event(5, headers=(("ünïcödé-头-🦀", "wert-🦀".encode()),)),
)

EDGE_BATCHES = (
    batch(*EDGE_EVENTS),
    batch(origin="mitglied-ü", topic="tópico.日本", opens=False),  # no events
    OriginBatch("", "", 0, INT64_MIN, INT64_MAX, False, (event(-5),)),
    OriginBatch("a", "t", INT32_MAX, 0, 1, True, (event(0),)),
    OriginBatch("a", "t", -1, 0, 1, True, (event(0),)),
)

EDGE_ENTRIES = (
    Entry(1, 1, None),  # a leader's no-op
    Entry(2, 1, EDGE_BATCHES[0]),
    Entry(3, 2, EDGE_BATCHES[1]),
    Entry(INT64_MAX, INT64_MAX, EDGE_BATCHES[2]),
    Entry(0, 0, EDGE_BATCHES[3]),
)

EDGE_MESSAGES: tuple[Message, ...] = (
    VoteRequest(3, 10, 2, 1 << 61),
    VoteRequest(0, 0, 0, 0),
    VoteRequest(INT64_MAX, INT64_MAX, INT64_MAX, INT64_MIN),
    VoteReply(3, True, 42),
    VoteReply(3, False, 42),
    Append(3, 10, 2, (), 9, 7, 5),  # a heartbeat
    Append(3, 0, 0, EDGE_ENTRIES, 1, 1 << 62, 0),
    AppendReply(3, True, 12, 0, 0, 5, 6),
    AppendReply(3, False, 0, 4, 10, 5, INT64_MAX),
    Forward(3, ()),
    Forward(3, EDGE_BATCHES),
    TimeoutNow(0),
    TimeoutNow(INT64_MAX),
    RecoverRequest(4, 99),
    RecoverReply(4, 99, 10, 3, (), 10, 3),
    RecoverReply(4, 99, 10, 3, EDGE_ENTRIES, 10, 3),
    VoteRequest(4, 9, 3, 7, transfer=True),
    PreVoteRequest(5, 9, 3, 1 << 60),
    PreVoteReply(4, True, 7),
    PreVoteReply(INT64_MAX, False, INT64_MIN),
    AppendReply(3, True, 12, 0, 0, 5, 6, INT64_MAX),
    # Parts of a recovery answer (tags 11, 12), and a last part (more=False).
    RecoverRequest(4, 99, 17, 3),
    RecoverReply(4, 99, 10, 3, EDGE_ENTRIES, 17, 3, more=True),
    RecoverReply(4, 99, 10, 3, (), 17, 3),
)

EDGE_LEDGERS = (
    LedgerState(),
    LedgerState(
        17,
        4,
        {("a", "t", 0): 100, ("ü", "tópico", INT32_MAX): INT64_MAX, ("a", "t", 1): 0},
        {"t": 57, "tópico": 0, "": INT64_MAX},
    ),
)

EDGE_HARD_STATES = (HardState(), HardState(5, "b"), HardState(INT64_MAX, "mitglied-ü-🦀"))


# -- randomized values ------------------------------------------------------------------


NAME_ALPHABET = "abcxyz-._0123456789äöüßé日本語🦀"


def random_name(rng: random.Random, max_length: int = 12) -> str:
    return "".join(rng.choice(NAME_ALPHABET) for _ in range(rng.randint(0, max_length)))


def random_bytes(rng: random.Random, max_length: int = 64) -> bytes | None:
    choice = rng.random()
    if choice < 0.15:
        return None
    if choice < 0.25:
        return b""
    return rng.randbytes(rng.randint(1, max_length))


def random_int64(rng: random.Random) -> int:
    choice = rng.random()
    if choice < 0.1:
        return rng.choice((0, INT64_MAX, INT64_MIN, -1, 1))
    if choice < 0.4:
        return rng.randint(INT64_MIN, INT64_MAX)
    return rng.randint(0, 1 << rng.randint(1, 62))


def random_event(rng: random.Random) -> SourceEvent:
    headers = tuple(
        (random_name(rng), random_bytes(rng, 16)) for _ in range(rng.choice((0, 0, 1, 3)))
    )
    return SourceEvent(
        random_int64(rng), random_bytes(rng), random_bytes(rng), headers, random_int64(rng)
    )


def random_batch(rng: random.Random) -> OriginBatch:
    return OriginBatch(
        random_name(rng),
        random_name(rng),
        rng.randint(-(2**31), INT32_MAX),
        random_int64(rng),
        random_int64(rng),
        rng.random() < 0.5,
        tuple(random_event(rng) for _ in range(rng.randint(0, 6))),
    )


def random_entry(rng: random.Random) -> Entry:
    batch = random_batch(rng) if rng.random() < 0.8 else None
    return Entry(random_int64(rng), random_int64(rng), batch)


def random_entries(rng: random.Random) -> tuple[Entry, ...]:
    return tuple(random_entry(rng) for _ in range(rng.randint(0, 4)))


def random_message(rng: random.Random) -> Message:
    i = random_int64
    kind = rng.randrange(10)
    if kind == 0:
        return VoteRequest(i(rng), i(rng), i(rng), i(rng), rng.random() < 0.5)
    if kind == 1:
        return VoteReply(i(rng), rng.random() < 0.5, i(rng))
    if kind == 2:
        return Append(i(rng), i(rng), i(rng), random_entries(rng), i(rng), i(rng), i(rng))
    if kind == 3:
        return AppendReply(
            i(rng), rng.random() < 0.5, i(rng), i(rng), i(rng), i(rng), i(rng), i(rng)
        )
    if kind == 4:
        return Forward(i(rng), tuple(random_batch(rng) for _ in range(rng.randint(0, 3))))
    if kind == 5:
        return TimeoutNow(i(rng))
    if kind == 6:
        if rng.random() < 0.5:
            return RecoverRequest(i(rng), i(rng))
        return RecoverRequest(i(rng), i(rng), i(rng), i(rng))
    if kind == 7:
        return PreVoteRequest(i(rng), i(rng), i(rng), i(rng))
    if kind == 8:
        return PreVoteReply(i(rng), rng.random() < 0.5, i(rng))
    commit_index, commit_term = i(rng), i(rng)
    if rng.random() < 0.5:  # a whole answer
        return RecoverReply(
            i(rng),
            i(rng),
            commit_index,
            commit_term,
            random_entries(rng),
            commit_index,
            commit_term,
        )
    return RecoverReply(
        i(rng), i(rng), commit_index, commit_term, random_entries(rng), i(rng), i(rng),
        rng.random() < 0.5,
    )  # fmt: skip


def random_ledger(rng: random.Random) -> LedgerState:
    marks = {
        (random_name(rng), random_name(rng), rng.randint(0, INT32_MAX)): random_int64(rng)
        for _ in range(rng.randint(0, 5))
    }
    next_seq = {random_name(rng): random_int64(rng) for _ in range(rng.randint(0, 3))}
    return LedgerState(random_int64(rng), random_int64(rng), marks, next_seq)


def random_hard_state(rng: random.Random) -> HardState:
    return HardState(random_int64(rng), random_name(rng) if rng.random() < 0.7 else None)


# -- round trips ------------------------------------------------------------------------


def assert_same_message(decoded: Message, original: Message) -> None:
    assert decoded == original
    assert type(decoded) is type(original)
    # Dataclass equality says True == 1; the decoder must hand back real bools.
    for flag in ("granted", "success"):
        if hasattr(original, flag):
            assert type(getattr(decoded, flag)) is bool


@pytest.mark.parametrize("message", EDGE_MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_type_round_trips(message: Message) -> None:
    encoded = encode_message(message)
    assert encoded[0] == FORMAT_VERSION
    assert_same_message(decode_message(encoded), message)


def test_every_message_type_is_covered() -> None:
    kinds = {type(m) for m in EDGE_MESSAGES}
    assert kinds == {
        VoteRequest,
        VoteReply,
        Append,
        AppendReply,
        Forward,
        TimeoutNow,
        RecoverRequest,
        RecoverReply,
        PreVoteRequest,
        PreVoteReply,
    }


def test_none_and_empty_stay_distinct() -> None:
    decoded = decode_message(encode_message(Forward(1, (batch(*EDGE_EVENTS),))))
    assert isinstance(decoded, Forward)
    events = decoded.batches[0].events
    assert events[0].key is None and events[0].value is None
    assert events[1].key == b"" and events[1].value == b""
    assert events[5].headers == (("h", None), ("h", b""), ("h", b"dup"), ("", b"\x00"))
    assert all(type(e.key) in (bytes, type(None)) for e in events)


def test_batch_flag_comes_back_as_bool() -> None:
    decoded = decode_entry(encode_entry(EDGE_ENTRIES[1]))
    assert decoded.batch is not None
    assert decoded.batch.opens is True


@pytest.mark.parametrize("entry", EDGE_ENTRIES, ids=lambda e: f"entry-{e.index}")
def test_entries_round_trip(entry: Entry) -> None:
    assert decode_entry(encode_entry(entry)) == entry


@pytest.mark.parametrize("state", EDGE_HARD_STATES, ids=repr)
def test_hard_state_round_trips(state: HardState) -> None:
    assert decode_hard_state(encode_hard_state(state)) == state


@pytest.mark.parametrize("state", EDGE_LEDGERS, ids=lambda s: f"applied-{s.applied_index}")
def test_ledger_state_round_trips_keeping_dict_order(state: LedgerState) -> None:
    decoded = decode_ledger_state(encode_ledger_state(state))
    assert decoded == state
    assert list(decoded.marks) == list(state.marks)
    assert list(decoded.next_seq) == list(state.next_seq)


def test_randomized_values_round_trip() -> None:
    rng = random.Random(20240611)
    for _ in range(1500):
        message = random_message(rng)
        assert_same_message(decode_message(encode_message(message)), message)
    for _ in range(300):
        entry = random_entry(rng)
        assert decode_entry(encode_entry(entry)) == entry
        ledger = random_ledger(rng)
        assert decode_ledger_state(encode_ledger_state(ledger)) == ledger
        hard_state = random_hard_state(rng)
        assert decode_hard_state(encode_hard_state(hard_state)) == hard_state


def test_megabyte_values_round_trip() -> None:
    rng = random.Random(7)
    big = rng.randbytes(1 << 20)
    events = (
        event(0, big, big),
        event(1, None, big[:-1], headers=(("big", big),)),
        event(2, b"", big + b"!"),
    )
    message = Append(1, 0, 0, (Entry(1, 1, batch(*events)),), 0, 1, 0)
    encoded = encode_message(message)
    assert len(encoded) > 5 * (1 << 20)
    assert decode_message(encoded) == message


def test_accepts_bytearray_and_memoryview() -> None:
    message = EDGE_MESSAGES[6]
    encoded = encode_message(message)
    decoded = decode_message(memoryview(encoded))
    assert decoded == message
    assert isinstance(decoded, Append)
    first = decoded.entries[1].batch
    assert first is not None
    assert type(first.events[4].key) is bytes
    assert decode_message(bytearray(encoded)) == message


def test_layout_is_pinned() -> None:
    """A change here breaks peers and stored records of version 1: bump the version."""
    assert encode_message(VoteRequest(1, 2, 3, 4)) == bytes.fromhex(
        "0101"
        + "0000000000000001"
        + "0000000000000002"
        + "0000000000000003"
        + "0000000000000004"
        + "00"
    )
    assert encode_message(VoteReply(5, True, -1)) == bytes.fromhex(
        "0102" + "0000000000000005" + "01" + "ffffffffffffffff"
    )
    entry = Entry(
        9, 8, OriginBatch("o", "t", 7, 6, 7, True, (event(6, None, b"v", (("h", None),), 5),))
    )
    assert encode_entry(entry) == bytes.fromhex(
        "0110"  # version 1, Entry record
        + "0000000000000009" + "0000000000000008" + "01"  # index, term, has a batch
        + "00000007" + "0000000000000006" + "0000000000000007"  # partition, start, end
        + "01"  # opens
        + "00000001" + "00000001" + "00000001" + "6f" + "74"  # 1 event, "o", "t"
        + "0000000000000006" + "0000000000000005"  # offset, timestamp
        + "ffffffff" + "00000001" + "00000001" + "76"  # key None, value "v", 1 header
        + "00000001" + "ffffffff" + "68"  # header "h": None
    )  # fmt: skip
    assert encode_hard_state(HardState(2, None)) == bytes.fromhex(
        "0111" + "0000000000000002" + "ffffffff"
    )
    # A recovery answer that fits in one message keeps the form of the previous release
    # (tags 7 and 8), so a witness of either release recovers from members of the other.
    assert encode_message(RecoverRequest(1, 2)) == bytes.fromhex(
        "0107" + "0000000000000001" + "0000000000000002"
    )
    assert encode_message(RecoverReply(1, 2, 3, 4, (), 3, 4)) == bytes.fromhex(
        "0108" + "0000000000000001" + "0000000000000002" + "0000000000000003"
        + "0000000000000004" + "00000000"
    )  # fmt: skip
    assert encode_message(RecoverRequest(1, 2, 5, 4)) == bytes.fromhex(
        "010b" + "0000000000000001" + "0000000000000002" + "0000000000000005"
        + "0000000000000004"
    )  # fmt: skip
    assert encode_message(RecoverReply(1, 2, 3, 4, (), 5, 4, more=True)) == bytes.fromhex(
        "010c" + "0000000000000001" + "0000000000000002" + "0000000000000003"
        + "0000000000000004" + "0000000000000005" + "0000000000000004" + "01" + "00000000"
    )  # fmt: skip


# -- rejection --------------------------------------------------------------------------


def samples() -> list[tuple[bytes, Decoder]]:
    """Valid encodings of every kind, small enough to cut at every byte."""
    small_batch = batch(*EDGE_EVENTS[:2], EDGE_EVENTS[5], EDGE_EVENTS[6])
    found: list[tuple[bytes, Decoder]] = [
        (encode_message(m), decode_message)
        for m in (
            *EDGE_MESSAGES[:6],
            Append(3, 0, 0, (Entry(1, 1, None), Entry(2, 1, small_batch)), 1, 2, 0),
            *EDGE_MESSAGES[7:10],
            Forward(3, (small_batch, EDGE_BATCHES[1])),
            *EDGE_MESSAGES[11:15],
            RecoverReply(4, 99, 10, 3, (Entry(11, 3, small_batch), Entry(12, 3, None)), 10, 3),
        )
    ]
    found.append((encode_entry(Entry(2, 1, small_batch)), decode_entry))
    found.append((encode_entry(Entry(2, 1, None)), decode_entry))
    found.extend((encode_hard_state(s), decode_hard_state) for s in EDGE_HARD_STATES)
    found.extend((encode_ledger_state(s), decode_ledger_state) for s in EDGE_LEDGERS)
    return found


def test_truncation_at_every_cut_point_is_rejected() -> None:
    for encoded, decode in samples():
        for cut in range(len(encoded)):
            with pytest.raises(WireFormatError):
                decode(encoded[:cut])


def test_truncation_says_what_is_wrong() -> None:
    encoded = encode_message(EDGE_MESSAGES[6])
    with pytest.raises(WireFormatError, match="truncated Append message"):
        decode_message(encoded[:-1])
    with pytest.raises(WireFormatError, match="too short"):
        decode_message(b"")


def test_trailing_bytes_are_rejected() -> None:
    for encoded, decode in samples():
        with pytest.raises(WireFormatError, match="unexpected byte"):
            decode(encoded + b"\x00")


@pytest.mark.parametrize("version", [0, 2, 255])
def test_unknown_version_is_rejected(version: int) -> None:
    for encoded, decode in samples():
        with pytest.raises(WireFormatError, match=f"unsupported wire format version {version}"):
            decode(bytes([version]) + encoded[1:])


@pytest.mark.parametrize("tag", [0, 13, 15, 19, 255])
def test_unknown_type_tag_is_rejected(tag: int) -> None:
    for decode in DECODERS:
        with pytest.raises(WireFormatError, match=f"unknown type tag {tag}"):
            decode(bytes([FORMAT_VERSION, tag]) + bytes(64))


def test_a_record_is_not_a_message_and_the_reverse() -> None:
    with pytest.raises(WireFormatError, match="got an Entry record"):
        decode_message(encode_entry(EDGE_ENTRIES[0]))
    with pytest.raises(WireFormatError, match="got an Append message"):
        decode_entry(encode_message(EDGE_MESSAGES[5]))
    with pytest.raises(WireFormatError, match="got a LedgerState record"):
        decode_hard_state(encode_ledger_state(EDGE_LEDGERS[0]))


def test_invalid_flags_are_rejected() -> None:
    vote_reply = bytearray(encode_message(VoteReply(1, True, 2)))
    vote_reply[10] = 2
    with pytest.raises(WireFormatError, match="'granted' must be 0 or 1"):
        decode_message(bytes(vote_reply))
    noop = bytearray(encode_entry(Entry(1, 1, None)))
    noop[-1] = 7
    kinds = r"entry kind must be 0 \(no-op\), 1 \(batch\), 2 or 3"
    with pytest.raises(WireFormatError, match=kinds):
        decode_entry(bytes(noop))


def test_negative_lengths_other_than_none_are_rejected() -> None:
    # One event with key None: its key length is the first 0xffffffff after the batch.
    encoded = encode_entry(Entry(1, 1, batch(event(0, None, b"v"))))
    at = encoded.index(b"\xff\xff\xff\xff")
    broken = encoded[:at] + struct.pack(">i", -2) + encoded[at + 4 :]
    with pytest.raises(WireFormatError, match="key length must be >= -1"):
        decode_entry(broken)


def test_invalid_utf8_names_are_rejected() -> None:
    encoded = encode_entry(Entry(1, 1, batch(origin="ORIGIN")))
    broken = encoded.replace(b"ORIGIN", b"\xffRIGIN")
    with pytest.raises(WireFormatError, match="invalid UTF-8"):
        decode_entry(broken)


def test_duplicate_ledger_keys_are_rejected() -> None:
    encoded = encode_ledger_state(LedgerState(1, 1, {}, {"t": 1, "u": 2}))
    with pytest.raises(WireFormatError, match="twice"):
        decode_ledger_state(encoded.replace(b"u", b"t"))


def test_random_garbage_raises_only_wire_format_error() -> None:
    rng = random.Random(99)
    for _ in range(20_000):
        # Mostly a valid prefix, so the garbage reaches the body decoders.
        head = bytes([FORMAT_VERSION, rng.randint(0, 20)]) if rng.random() < 0.9 else b""
        garbage = head + rng.randbytes(rng.randint(0, 80))
        for decode in DECODERS:
            with contextlib.suppress(WireFormatError):
                decode(garbage)


def test_corrupted_valid_encodings_raise_only_wire_format_error() -> None:
    rng = random.Random(1234)
    originals = samples()
    for _ in range(20_000):
        encoded, decode = rng.choice(originals)
        data = bytearray(encoded)
        for _ in range(rng.randint(1, 4)):
            where = rng.randrange(len(data))
            mutation = rng.random()
            if mutation < 0.6:
                data[where] = rng.randrange(256)
            elif mutation < 0.8:
                del data[where]
            else:
                data[where:where] = rng.randbytes(rng.randint(1, 4))
        with contextlib.suppress(WireFormatError):
            decode(bytes(data))


# -- encoding limits --------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        VoteRequest(2**63, 0, 0, 0),
        TimeoutNow(INT64_MIN - 1),
        Forward(1, (OriginBatch("a", "t", 2**31, 0, 1, True, ()),)),
        Forward(1, (batch(event(0), topic="\ud800"),)),  # a lone surrogate is not UTF-8
        Forward(1, (batch(event(0, headers=(("\udfff", None),))),)),
    ],
    ids=["int64-overflow", "int64-underflow", "partition-overflow", "topic", "header"],
)
def test_unrepresentable_values_raise_wire_format_error(message: Message) -> None:
    with pytest.raises(WireFormatError, match="cannot encode"):
        encode_message(message)


def test_encoding_something_else_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="not a peer message"):
        encode_message(Entry(1, 1, None))  # type: ignore[arg-type]


def test_tags_are_distinct_bytes() -> None:
    assert encode_message(EDGE_MESSAGES[5])[1] == TAG_APPEND
    assert encode_entry(EDGE_ENTRIES[0])[1] == TAG_ENTRY


def test_a_decoded_batch_knows_its_size_as_if_it_had_counted_its_events() -> None:
    # take_batch sums size_bytes while decoding; the bounds on memory count by it, so it
    # must equal what a batch built from the same events counts (multi-byte header names
    # included).
    rng = random.Random(20261126)
    entries = [*EDGE_ENTRIES, *(random_entry(rng) for _ in range(300))]
    checked = 0
    for entry in entries:
        decoded = decode_entry(encode_entry(entry)).batch
        if decoded is None:
            continue
        fresh = OriginBatch(
            decoded.origin,
            decoded.topic,
            decoded.partition,
            decoded.start,
            decoded.end,
            decoded.opens,
            decoded.events,
        )
        assert decoded.size_bytes() == fresh.size_bytes()
        checked += 1
    assert checked > 100
