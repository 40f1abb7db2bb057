"""The binary encoding of peer messages and of the records kdsync keeps in Kafka.

One codec serves two purposes: messages between sidecars (each one TCP frame, see
``kdsync.transport.framing``) and the records a data member writes to its internal
topics (log entries, hard state, ledger snapshots). Both outlive a single process:
during a rolling upgrade, peers and stored records may come from another kdsync
version. Every encoding therefore starts with a format version, and a decoder that
meets a version or type it does not know fails with a clear ``WireFormatError``
instead of misreading the bytes.

Layout (all integers big-endian; ``i64`` signed, ``u32`` unsigned)::

    encoding   = version:u8 (=1)  tag:u8  body          (nothing may follow the body)
    names      = UTF-8; each length (u32, in bytes) sits in the fixed part before it
    opt-bytes  = len:i32 bytes[len]                     (len -1 means None)
    bool       = u8, 0 or 1

    tag  body
    1    VoteRequest     term last_index last_term incarnation (4 x i64) transfer (u8)
    2    VoteReply       term:i64 granted:bool incarnation:i64
    3    Append          term prev_index prev_term commit incarnation all_durable
                         (6 x i64)  count:u32  entry[count]
    4    AppendReply     term:i64 success:bool match_index hint_index rejected_index
                         incarnation peer_incarnation applied_index (6 x i64)
    5    Forward         term:i64 count:u32 batch[count]
    6    TimeoutNow      term:i64
    7    RecoverRequest  term:i64 nonce:i64
    8    RecoverReply    term nonce commit_index commit_term (4 x i64) count:u32
                         entry[count]
    9    PreVoteRequest  term last_index last_term incarnation (4 x i64)
    10   PreVoteReply    term:i64 granted:bool incarnation:i64
    16   Entry record    entry
    17   HardState       term:i64 voted_for:opt-str (as opt-bytes, UTF-8)
    18   LedgerState     applied_index:i64 applied_term:i64
                         marks:u32 (origin_len:u32 topic_len:u32 partition:i32
                                    mark:i64 origin topic)[marks]
                         seqs:u32 (topic_len:u32 next_seq:i64 topic)[seqs]

    entry   = index:i64 term:i64 has_batch:bool batch?
    batch   = partition:i32 start:i64 end:i64 opens:bool events:u32
              origin_len:u32 topic_len:u32 origin topic event[events]
    event   = offset:i64 timestamp_ms:i64 key_len:i32 value_len:i32 headers:u32
              key value (name_len:u32 value_len:i32 name value)[headers]

Fixed-size fields come first in each group so that one precompiled ``struct`` call
reads them all; the decoder is on the hot path (every event crosses it at least twice).
Peer messages (tags 1-15) and stored records (tags 16+) use separate tag ranges so a
record handed to the message decoder (or the reverse) is reported as such.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kdsync.ordering.events import Header, OriginBatch, OriginPartition, SourceEvent
from kdsync.ordering.ledger import LedgerState
from kdsync.ordering.log import Entry
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
from kdsync.ordering.ready import HardState

FORMAT_VERSION = 1

TAG_VOTE_REQUEST = 1
TAG_VOTE_REPLY = 2
TAG_APPEND = 3
TAG_APPEND_REPLY = 4
TAG_FORWARD = 5
TAG_TIMEOUT_NOW = 6
TAG_RECOVER_REQUEST = 7
TAG_RECOVER_REPLY = 8
TAG_PRE_VOTE_REQUEST = 9
TAG_PRE_VOTE_REPLY = 10
TAG_ENTRY = 16
TAG_HARD_STATE = 17
TAG_LEDGER_STATE = 18

_TAG_NAMES: dict[int, str] = {
    TAG_VOTE_REQUEST: "VoteRequest message",
    TAG_VOTE_REPLY: "VoteReply message",
    TAG_APPEND: "Append message",
    TAG_APPEND_REPLY: "AppendReply message",
    TAG_FORWARD: "Forward message",
    TAG_TIMEOUT_NOW: "TimeoutNow message",
    TAG_RECOVER_REQUEST: "RecoverRequest message",
    TAG_RECOVER_REPLY: "RecoverReply message",
    TAG_PRE_VOTE_REQUEST: "PreVoteRequest message",
    TAG_PRE_VOTE_REPLY: "PreVoteReply message",
    TAG_ENTRY: "Entry record",
    TAG_HARD_STATE: "HardState record",
    TAG_LEDGER_STATE: "LedgerState record",
}

_PREFIX = struct.Struct(">BB")
_VOTE_REQUEST = struct.Struct(">BBqqqqB")
_VOTE_REPLY = struct.Struct(">BBqBq")
_APPEND = struct.Struct(">BBqqqqqqI")
_APPEND_REPLY = struct.Struct(">BBqBqqqqqq")
_PRE_VOTE_REQUEST = struct.Struct(">BBqqqq")
_PRE_VOTE_REPLY = struct.Struct(">BBqBq")
_FORWARD = struct.Struct(">BBqI")
_TIMEOUT_NOW = struct.Struct(">BBq")
_RECOVER_REQUEST = struct.Struct(">BBqq")
_RECOVER_REPLY = struct.Struct(">BBqqqqI")
_HARD_STATE = struct.Struct(">BBqi")
_LEDGER_HEAD = struct.Struct(">BBqq")
_COUNT = struct.Struct(">I")
_MARK = struct.Struct(">IIiq")
_SEQ = struct.Struct(">Iq")
_ENTRY = struct.Struct(">qqB")
_BATCH = struct.Struct(">iqqBIII")
_EVENT = struct.Struct(">qqiiI")
_HEADER = struct.Struct(">Ii")

_T = TypeVar("_T")


class WireFormatError(ValueError):
    """Bytes that are not a valid encoding (truncated, corrupt, unknown version or type),
    or a value that this format cannot represent."""


# -- encoding ---------------------------------------------------------------------------
#
# Encoders append pieces to a list joined once at the end: payload bytes (values up to
# megabytes) are copied exactly once, into the result.


def _put_batch(parts: list[bytes], batch: OriginBatch) -> None:
    encoded = batch._encoded
    if encoded is None:
        fresh: list[bytes] = []
        _encode_batch(fresh, batch)
        encoded = b"".join(fresh)
        object.__setattr__(batch, "_encoded", encoded)
    parts.append(encoded)


def _encode_batch(parts: list[bytes], batch: OriginBatch) -> None:
    append = parts.append
    origin = batch.origin.encode()
    topic = batch.topic.encode()
    events = batch.events
    append(
        _BATCH.pack(
            batch.partition,
            batch.start,
            batch.end,
            batch.opens,
            len(events),
            len(origin),
            len(topic),
        )
    )
    append(origin)
    append(topic)
    pack_event = _EVENT.pack
    pack_header = _HEADER.pack
    for event in events:
        key = event.key
        value = event.value
        headers = event.headers
        append(
            pack_event(
                event.offset,
                event.timestamp_ms,
                -1 if key is None else len(key),
                -1 if value is None else len(value),
                len(headers),
            )
        )
        if key:
            append(key)
        if value:
            append(value)
        for name, header_value in headers:
            name_bytes = name.encode()
            if header_value is None:
                append(pack_header(len(name_bytes), -1))
                append(name_bytes)
            else:
                append(pack_header(len(name_bytes), len(header_value)))
                append(name_bytes)
                append(header_value)


def _put_entries(parts: list[bytes], entries: tuple[Entry, ...]) -> None:
    pack_entry = _ENTRY.pack
    for entry in entries:
        batch = entry.batch
        if batch is None:
            parts.append(pack_entry(entry.index, entry.term, 0))
        else:
            parts.append(pack_entry(entry.index, entry.term, 1))
            _put_batch(parts, batch)


def _encode_vote_request(m: VoteRequest) -> bytes:
    return _VOTE_REQUEST.pack(
        FORMAT_VERSION,
        TAG_VOTE_REQUEST,
        m.term,
        m.last_index,
        m.last_term,
        m.incarnation,
        m.transfer,
    )


def _encode_vote_reply(m: VoteReply) -> bytes:
    return _VOTE_REPLY.pack(FORMAT_VERSION, TAG_VOTE_REPLY, m.term, m.granted, m.incarnation)


def _encode_append(m: Append) -> bytes:
    parts = [
        _APPEND.pack(
            FORMAT_VERSION,
            TAG_APPEND,
            m.term,
            m.prev_index,
            m.prev_term,
            m.commit,
            m.incarnation,
            m.all_durable,
            len(m.entries),
        )
    ]
    _put_entries(parts, m.entries)
    return b"".join(parts)


def _encode_append_reply(m: AppendReply) -> bytes:
    return _APPEND_REPLY.pack(
        FORMAT_VERSION,
        TAG_APPEND_REPLY,
        m.term,
        m.success,
        m.match_index,
        m.hint_index,
        m.rejected_index,
        m.incarnation,
        m.peer_incarnation,
        m.applied_index,
    )


def _encode_pre_vote_request(m: PreVoteRequest) -> bytes:
    return _PRE_VOTE_REQUEST.pack(
        FORMAT_VERSION, TAG_PRE_VOTE_REQUEST, m.term, m.last_index, m.last_term, m.incarnation
    )


def _encode_pre_vote_reply(m: PreVoteReply) -> bytes:
    return _PRE_VOTE_REPLY.pack(
        FORMAT_VERSION, TAG_PRE_VOTE_REPLY, m.term, m.granted, m.incarnation
    )


def _encode_forward(m: Forward) -> bytes:
    parts = [_FORWARD.pack(FORMAT_VERSION, TAG_FORWARD, m.term, len(m.batches))]
    for batch in m.batches:
        _put_batch(parts, batch)
    return b"".join(parts)


def _encode_timeout_now(m: TimeoutNow) -> bytes:
    return _TIMEOUT_NOW.pack(FORMAT_VERSION, TAG_TIMEOUT_NOW, m.term)


def _encode_recover_request(m: RecoverRequest) -> bytes:
    return _RECOVER_REQUEST.pack(FORMAT_VERSION, TAG_RECOVER_REQUEST, m.term, m.nonce)


def _encode_recover_reply(m: RecoverReply) -> bytes:
    parts = [
        _RECOVER_REPLY.pack(
            FORMAT_VERSION,
            TAG_RECOVER_REPLY,
            m.term,
            m.nonce,
            m.commit_index,
            m.commit_term,
            len(m.entries),
        )
    ]
    _put_entries(parts, m.entries)
    return b"".join(parts)


# Keyed by the exact class: dispatch is one dict lookup per message.
_MESSAGE_ENCODERS: dict[type, Callable[[Any], bytes]] = {
    VoteRequest: _encode_vote_request,
    VoteReply: _encode_vote_reply,
    Append: _encode_append,
    AppendReply: _encode_append_reply,
    Forward: _encode_forward,
    TimeoutNow: _encode_timeout_now,
    RecoverRequest: _encode_recover_request,
    RecoverReply: _encode_recover_reply,
    PreVoteRequest: _encode_pre_vote_request,
    PreVoteReply: _encode_pre_vote_reply,
}


def _encode_error(what: str, exc: Exception) -> WireFormatError:
    if isinstance(exc, UnicodeEncodeError):
        return WireFormatError(f"cannot encode {what}: a name is not valid Unicode ({exc})")
    # struct.error: a field out of its range (an int64 field beyond 2**63, a partition
    # beyond int32, a value of 2 GiB or more) or of the wrong type.
    return WireFormatError(f"cannot encode {what}: {exc}")


def encode_message(message: Message) -> bytes:
    """The encoding of a peer message; raises WireFormatError for out-of-range fields."""
    encoder = _MESSAGE_ENCODERS.get(type(message))
    if encoder is None:
        raise TypeError(f"not a peer message: {type(message).__name__}")
    try:
        return encoder(message)
    except (struct.error, UnicodeEncodeError) as exc:
        raise _encode_error(type(message).__name__, exc) from exc


def encode_entry(entry: Entry) -> bytes:
    """The encoding of a log entry as stored in the log topic."""
    parts = [_PREFIX.pack(FORMAT_VERSION, TAG_ENTRY)]
    try:
        _put_entries(parts, (entry,))
    except (struct.error, UnicodeEncodeError) as exc:
        raise _encode_error("Entry", exc) from exc
    return b"".join(parts)


def encode_hard_state(state: HardState) -> bytes:
    try:
        if state.voted_for is None:
            return _HARD_STATE.pack(FORMAT_VERSION, TAG_HARD_STATE, state.term, -1)
        voted_for = state.voted_for.encode()
        head = _HARD_STATE.pack(FORMAT_VERSION, TAG_HARD_STATE, state.term, len(voted_for))
    except (struct.error, UnicodeEncodeError) as exc:
        raise _encode_error("HardState", exc) from exc
    return head + voted_for


def encode_ledger_state(state: LedgerState) -> bytes:
    """The encoding of a ledger snapshot; dict order is kept as it is."""
    try:
        parts = [
            _LEDGER_HEAD.pack(
                FORMAT_VERSION, TAG_LEDGER_STATE, state.applied_index, state.applied_term
            ),
            _COUNT.pack(len(state.marks)),
        ]
        for (origin, topic, partition), mark in state.marks.items():
            origin_bytes = origin.encode()
            topic_bytes = topic.encode()
            parts.append(_MARK.pack(len(origin_bytes), len(topic_bytes), partition, mark))
            parts.append(origin_bytes)
            parts.append(topic_bytes)
        parts.append(_COUNT.pack(len(state.next_seq)))
        for topic, seq in state.next_seq.items():
            topic_bytes = topic.encode()
            parts.append(_SEQ.pack(len(topic_bytes), seq))
            parts.append(topic_bytes)
    except (struct.error, UnicodeEncodeError) as exc:
        raise _encode_error("LedgerState", exc) from exc
    return b"".join(parts)


# -- decoding ---------------------------------------------------------------------------
#
# Readers take (data, pos) and return (value, new pos). They do not bounds-check each
# slice: a length that runs past the end makes a later ``unpack_from`` fail or leaves the
# final position beyond the end, and both are reported as truncation by ``_decode``.
# Lengths are never negative (u32, or i32 checked against -1), so ``unpack_from`` never
# sees a negative offset, which it would count from the end.


def _bad_flag(what: str, value: int) -> WireFormatError:
    return WireFormatError(f"{what} must be 0 or 1, got {value}")


def _bad_length(what: str, value: int) -> WireFormatError:
    return WireFormatError(f"{what} length must be >= -1, got {value}")


def _take_batch(data: bytes, pos: int) -> tuple[OriginBatch, int]:
    first = pos
    partition, start, end, opens, count, origin_len, topic_len = _BATCH.unpack_from(data, pos)
    if opens > 1:
        raise _bad_flag("batch 'opens'", opens)
    pos += _BATCH.size
    origin = data[pos : pos + origin_len].decode()
    pos += origin_len
    topic = data[pos : pos + topic_len].decode()
    pos += topic_len
    unpack_event = _EVENT.unpack_from
    unpack_header = _HEADER.unpack_from
    event_size = _EVENT.size
    header_size = _HEADER.size
    events: list[SourceEvent] = []
    append = events.append
    for _ in range(count):
        offset, timestamp_ms, key_len, value_len, header_count = unpack_event(data, pos)
        pos += event_size
        key: bytes | None
        value: bytes | None
        if key_len >= 0:
            key = data[pos : pos + key_len]
            pos += key_len
        elif key_len == -1:
            key = None
        else:
            raise _bad_length("key", key_len)
        if value_len >= 0:
            value = data[pos : pos + value_len]
            pos += value_len
        elif value_len == -1:
            value = None
        else:
            raise _bad_length("value", value_len)
        headers: tuple[Header, ...] = ()
        if header_count:
            header_list: list[Header] = []
            for _ in range(header_count):
                name_len, header_len = unpack_header(data, pos)
                pos += header_size
                name = data[pos : pos + name_len].decode()
                pos += name_len
                if header_len >= 0:
                    header_list.append((name, data[pos : pos + header_len]))
                    pos += header_len
                elif header_len == -1:
                    header_list.append((name, None))
                else:
                    raise _bad_length("header value", header_len)
            headers = tuple(header_list)
        append(SourceEvent(offset, key, value, headers, timestamp_ms))
    batch = OriginBatch(origin, topic, partition, start, end, bool(opens), tuple(events))
    # Sending or storing this batch again re-uses these bytes instead of re-encoding.
    object.__setattr__(batch, "_encoded", bytes(data[first:pos]))
    return batch, pos


def _take_entries(data: bytes, pos: int, count: int) -> tuple[tuple[Entry, ...], int]:
    unpack_entry = _ENTRY.unpack_from
    entry_size = _ENTRY.size
    entries: list[Entry] = []
    for _ in range(count):
        index, term, has_batch = unpack_entry(data, pos)
        pos += entry_size
        if has_batch == 1:
            batch, pos = _take_batch(data, pos)
            entries.append(Entry(index, term, batch))
        elif has_batch == 0:
            entries.append(Entry(index, term, None))
        else:
            raise _bad_flag("entry 'has_batch'", has_batch)
    return tuple(entries), pos


def _decode_vote_request(data: bytes) -> tuple[VoteRequest, int]:
    _, _, term, last_index, last_term, incarnation, transfer = _VOTE_REQUEST.unpack_from(data)
    if transfer > 1:
        raise _bad_flag("'transfer'", transfer)
    request = VoteRequest(term, last_index, last_term, incarnation, bool(transfer))
    return request, _VOTE_REQUEST.size


def _decode_vote_reply(data: bytes) -> tuple[VoteReply, int]:
    _, _, term, granted, incarnation = _VOTE_REPLY.unpack_from(data)
    if granted > 1:
        raise _bad_flag("'granted'", granted)
    return VoteReply(term, bool(granted), incarnation), _VOTE_REPLY.size


def _decode_append(data: bytes) -> tuple[Append, int]:
    _, _, term, prev_index, prev_term, commit, incarnation, all_durable, count = (
        _APPEND.unpack_from(data)
    )
    entries, pos = _take_entries(data, _APPEND.size, count)
    return Append(term, prev_index, prev_term, entries, commit, incarnation, all_durable), pos


def _decode_append_reply(data: bytes) -> tuple[AppendReply, int]:
    _, _, term, success, match, hint, rejected, incarnation, peer_incarnation, applied = (
        _APPEND_REPLY.unpack_from(data)
    )
    if success > 1:
        raise _bad_flag("'success'", success)
    reply = AppendReply(
        term, bool(success), match, hint, rejected, incarnation, peer_incarnation, applied
    )
    return reply, _APPEND_REPLY.size


def _decode_pre_vote_request(data: bytes) -> tuple[PreVoteRequest, int]:
    _, _, term, last_index, last_term, incarnation = _PRE_VOTE_REQUEST.unpack_from(data)
    return PreVoteRequest(term, last_index, last_term, incarnation), _PRE_VOTE_REQUEST.size


def _decode_pre_vote_reply(data: bytes) -> tuple[PreVoteReply, int]:
    _, _, term, granted, incarnation = _PRE_VOTE_REPLY.unpack_from(data)
    if granted > 1:
        raise _bad_flag("'granted'", granted)
    return PreVoteReply(term, bool(granted), incarnation), _PRE_VOTE_REPLY.size


def _decode_forward(data: bytes) -> tuple[Forward, int]:
    _, _, term, count = _FORWARD.unpack_from(data)
    pos = _FORWARD.size
    batches: list[OriginBatch] = []
    for _ in range(count):
        batch, pos = _take_batch(data, pos)
        batches.append(batch)
    return Forward(term, tuple(batches)), pos


def _decode_timeout_now(data: bytes) -> tuple[TimeoutNow, int]:
    _, _, term = _TIMEOUT_NOW.unpack_from(data)
    return TimeoutNow(term), _TIMEOUT_NOW.size


def _decode_recover_request(data: bytes) -> tuple[RecoverRequest, int]:
    _, _, term, nonce = _RECOVER_REQUEST.unpack_from(data)
    return RecoverRequest(term, nonce), _RECOVER_REQUEST.size


def _decode_recover_reply(data: bytes) -> tuple[RecoverReply, int]:
    _, _, term, nonce, commit_index, commit_term, count = _RECOVER_REPLY.unpack_from(data)
    entries, pos = _take_entries(data, _RECOVER_REPLY.size, count)
    return RecoverReply(term, nonce, commit_index, commit_term, entries), pos


_MESSAGE_DECODERS: dict[int, Callable[[bytes], tuple[Message, int]]] = {
    TAG_VOTE_REQUEST: _decode_vote_request,
    TAG_VOTE_REPLY: _decode_vote_reply,
    TAG_APPEND: _decode_append,
    TAG_APPEND_REPLY: _decode_append_reply,
    TAG_FORWARD: _decode_forward,
    TAG_TIMEOUT_NOW: _decode_timeout_now,
    TAG_RECOVER_REQUEST: _decode_recover_request,
    TAG_RECOVER_REPLY: _decode_recover_reply,
    TAG_PRE_VOTE_REQUEST: _decode_pre_vote_request,
    TAG_PRE_VOTE_REPLY: _decode_pre_vote_reply,
}


def _decode_entry(data: bytes) -> tuple[Entry, int]:
    entries, pos = _take_entries(data, _PREFIX.size, 1)
    return entries[0], pos


def _decode_hard_state(data: bytes) -> tuple[HardState, int]:
    _, _, term, voted_len = _HARD_STATE.unpack_from(data)
    pos = _HARD_STATE.size
    if voted_len == -1:
        return HardState(term, None), pos
    if voted_len < 0:
        raise _bad_length("voted_for", voted_len)
    voted_for = data[pos : pos + voted_len].decode()
    return HardState(term, voted_for), pos + voted_len


def _decode_ledger_state(data: bytes) -> tuple[LedgerState, int]:
    _, _, applied_index, applied_term = _LEDGER_HEAD.unpack_from(data)
    pos = _LEDGER_HEAD.size
    (count,) = _COUNT.unpack_from(data, pos)
    pos += _COUNT.size
    marks: dict[OriginPartition, int] = {}
    for _ in range(count):
        origin_len, topic_len, partition, mark = _MARK.unpack_from(data, pos)
        pos += _MARK.size
        origin = data[pos : pos + origin_len].decode()
        pos += origin_len
        topic = data[pos : pos + topic_len].decode()
        pos += topic_len
        marks[(origin, topic, partition)] = mark
    if len(marks) != count:
        raise WireFormatError("the same origin partition appears twice in the marks")
    (count,) = _COUNT.unpack_from(data, pos)
    pos += _COUNT.size
    next_seq: dict[str, int] = {}
    for _ in range(count):
        topic_len, seq = _SEQ.unpack_from(data, pos)
        pos += _SEQ.size
        topic = data[pos : pos + topic_len].decode()
        pos += topic_len
        next_seq[topic] = seq
    if len(next_seq) != count:
        raise WireFormatError("the same topic appears twice in next_seq")
    return LedgerState(applied_index, applied_term, marks, next_seq), pos


def _a(name: str) -> str:
    return f"an {name}" if name[0] in "AEIOU" else f"a {name}"


def _decode(
    data: bytes | bytearray | memoryview,
    decoders: Mapping[int, Callable[[bytes], tuple[_T, int]]],
    expected: str,
) -> _T:
    if not isinstance(data, bytes):
        # Slices of a memoryview or bytearray would not be the bytes the events hold.
        data = bytes(data)
    if len(data) < _PREFIX.size:
        raise WireFormatError(f"{len(data)} byte(s) is too short for {_a(expected)}")
    version, tag = _PREFIX.unpack_from(data)
    if version != FORMAT_VERSION:
        raise WireFormatError(
            f"unsupported wire format version {version} (this kdsync reads version "
            f"{FORMAT_VERSION}); is a peer or a stored record from another kdsync release?"
        )
    decoder = decoders.get(tag)
    if decoder is None:
        known = _TAG_NAMES.get(tag)
        if known is not None:
            raise WireFormatError(f"expected {_a(expected)}, got {_a(known)} (type tag {tag})")
        raise WireFormatError(f"unknown type tag {tag} for {_a(expected)}")
    what = _TAG_NAMES[tag]
    try:
        value, pos = decoder(data)
    except struct.error as exc:
        raise WireFormatError(f"truncated {what} ({len(data)} bytes): {exc}") from exc
    except UnicodeDecodeError as exc:
        raise WireFormatError(f"invalid UTF-8 in a name in {_a(what)}: {exc}") from exc
    except WireFormatError as exc:
        raise WireFormatError(f"malformed {what}: {exc}") from exc
    if pos != len(data):
        if pos > len(data):
            raise WireFormatError(
                f"truncated {what}: a length field runs to byte {pos} "
                f"but the input has {len(data)} bytes"
            )
        raise WireFormatError(f"{len(data) - pos} unexpected byte(s) after {_a(what)}")
    return value


def decode_message(data: bytes | bytearray | memoryview) -> Message:
    """The peer message encoded in ``data``; WireFormatError if it is not a valid one."""
    return _decode(data, _MESSAGE_DECODERS, "peer message")


_ENTRY_DECODERS = {TAG_ENTRY: _decode_entry}
_HARD_STATE_DECODERS = {TAG_HARD_STATE: _decode_hard_state}
_LEDGER_STATE_DECODERS = {TAG_LEDGER_STATE: _decode_ledger_state}


def decode_entry(data: bytes | bytearray | memoryview) -> Entry:
    return _decode(data, _ENTRY_DECODERS, "Entry record")


def decode_hard_state(data: bytes | bytearray | memoryview) -> HardState:
    return _decode(data, _HARD_STATE_DECODERS, "HardState record")


def decode_ledger_state(data: bytes | bytearray | memoryview) -> LedgerState:
    return _decode(data, _LEDGER_STATE_DECODERS, "LedgerState record")
