"""Peer messages (type tags 1-15): what members send each other, one per frame."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from kdsync.ordering.events import OriginBatch
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
from kdsync.wire_format.batches import (
    put_batch,
    put_entries,
    put_optional_configuration,
    take_batch,
    take_entries,
    take_optional_configuration,
)
from kdsync.wire_format.envelope import (
    FORMAT_VERSION,
    TAG_APPEND,
    TAG_APPEND_REPLY,
    TAG_FORWARD,
    TAG_PRE_VOTE_REPLY,
    TAG_PRE_VOTE_REQUEST,
    TAG_RECOVER_REPLY,
    TAG_RECOVER_REPLY_PART,
    TAG_RECOVER_REQUEST,
    TAG_RECOVER_REQUEST_AFTER,
    TAG_TIMEOUT_NOW,
    TAG_VOTE_REPLY,
    TAG_VOTE_REQUEST,
    bad_flag,
    decode,
    encode_error,
)

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
_RECOVER_REQUEST_AFTER = struct.Struct(">BBqqqq")
_RECOVER_REPLY_PART = struct.Struct(">BBqqqqqqBI")


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
    put_entries(parts, m.entries)
    put_optional_configuration(parts, m.config)
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
        put_batch(parts, batch)
    return b"".join(parts)


def _encode_timeout_now(m: TimeoutNow) -> bytes:
    return _TIMEOUT_NOW.pack(FORMAT_VERSION, TAG_TIMEOUT_NOW, m.term)


def _encode_recover_request(m: RecoverRequest) -> bytes:
    if m.after_index == 0 and m.after_term == 0:
        return _RECOVER_REQUEST.pack(FORMAT_VERSION, TAG_RECOVER_REQUEST, m.term, m.nonce)
    return _RECOVER_REQUEST_AFTER.pack(
        FORMAT_VERSION, TAG_RECOVER_REQUEST_AFTER, m.term, m.nonce, m.after_index, m.after_term
    )


def _encode_recover_reply(m: RecoverReply) -> bytes:
    whole = not m.more and (m.prev_index, m.prev_term) == (m.commit_index, m.commit_term)
    if whole:
        head = _RECOVER_REPLY.pack(
            FORMAT_VERSION,
            TAG_RECOVER_REPLY,
            m.term,
            m.nonce,
            m.commit_index,
            m.commit_term,
            len(m.entries),
        )
    else:
        head = _RECOVER_REPLY_PART.pack(
            FORMAT_VERSION,
            TAG_RECOVER_REPLY_PART,
            m.term,
            m.nonce,
            m.commit_index,
            m.commit_term,
            m.prev_index,
            m.prev_term,
            m.more,
            len(m.entries),
        )
    parts = [head]
    put_entries(parts, m.entries)
    put_optional_configuration(parts, m.config)
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


def encode_message(message: Message) -> bytes:
    """The encoding of a peer message; raises WireFormatError for out-of-range fields."""
    encoder = _MESSAGE_ENCODERS.get(type(message))
    if encoder is None:
        raise TypeError(f"not a peer message: {type(message).__name__}")
    try:
        return encoder(message)
    except (struct.error, UnicodeEncodeError) as exc:
        raise encode_error(type(message).__name__, exc) from exc


def _decode_vote_request(data: bytes) -> tuple[VoteRequest, int]:
    _, _, term, last_index, last_term, incarnation, transfer = _VOTE_REQUEST.unpack_from(data)
    if transfer > 1:
        raise bad_flag("'transfer'", transfer)
    request = VoteRequest(term, last_index, last_term, incarnation, bool(transfer))
    return request, _VOTE_REQUEST.size


def _decode_vote_reply(data: bytes) -> tuple[VoteReply, int]:
    _, _, term, granted, incarnation = _VOTE_REPLY.unpack_from(data)
    if granted > 1:
        raise bad_flag("'granted'", granted)
    return VoteReply(term, bool(granted), incarnation), _VOTE_REPLY.size


def _decode_append(data: bytes) -> tuple[Append, int]:
    _, _, term, prev_index, prev_term, commit, incarnation, all_durable, count = (
        _APPEND.unpack_from(data)
    )
    entries, pos = take_entries(data, _APPEND.size, count)
    config, pos = take_optional_configuration(data, pos)
    append = Append(term, prev_index, prev_term, entries, commit, incarnation, all_durable, config)
    return append, pos


def _decode_append_reply(data: bytes) -> tuple[AppendReply, int]:
    _, _, term, success, match, hint, rejected, incarnation, peer_incarnation, applied = (
        _APPEND_REPLY.unpack_from(data)
    )
    if success > 1:
        raise bad_flag("'success'", success)
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
        raise bad_flag("'granted'", granted)
    return PreVoteReply(term, bool(granted), incarnation), _PRE_VOTE_REPLY.size


def _decode_forward(data: bytes) -> tuple[Forward, int]:
    _, _, term, count = _FORWARD.unpack_from(data)
    pos = _FORWARD.size
    batches: list[OriginBatch] = []
    for _ in range(count):
        batch, pos = take_batch(data, pos)
        batches.append(batch)
    return Forward(term, tuple(batches)), pos


def _decode_timeout_now(data: bytes) -> tuple[TimeoutNow, int]:
    _, _, term = _TIMEOUT_NOW.unpack_from(data)
    return TimeoutNow(term), _TIMEOUT_NOW.size


def _decode_recover_request(data: bytes) -> tuple[RecoverRequest, int]:
    _, _, term, nonce = _RECOVER_REQUEST.unpack_from(data)
    return RecoverRequest(term, nonce), _RECOVER_REQUEST.size


def _decode_recover_request_after(data: bytes) -> tuple[RecoverRequest, int]:
    _, _, term, nonce, after_index, after_term = _RECOVER_REQUEST_AFTER.unpack_from(data)
    return RecoverRequest(term, nonce, after_index, after_term), _RECOVER_REQUEST_AFTER.size


def _decode_recover_reply(data: bytes) -> tuple[RecoverReply, int]:
    _, _, term, nonce, commit_index, commit_term, count = _RECOVER_REPLY.unpack_from(data)
    entries, pos = take_entries(data, _RECOVER_REPLY.size, count)
    config, pos = take_optional_configuration(data, pos)
    reply = RecoverReply(
        term, nonce, commit_index, commit_term, entries, commit_index, commit_term, False, config
    )
    return reply, pos


def _decode_recover_reply_part(data: bytes) -> tuple[RecoverReply, int]:
    _, _, term, nonce, commit_index, commit_term, prev_index, prev_term, more, count = (
        _RECOVER_REPLY_PART.unpack_from(data)
    )
    if more > 1:
        raise bad_flag("'more'", more)
    entries, pos = take_entries(data, _RECOVER_REPLY_PART.size, count)
    config, pos = take_optional_configuration(data, pos)
    reply = RecoverReply(
        term, nonce, commit_index, commit_term, entries, prev_index, prev_term, bool(more), config
    )
    return reply, pos


_MESSAGE_DECODERS: dict[int, Callable[[bytes], tuple[Message, int]]] = {
    TAG_VOTE_REQUEST: _decode_vote_request,
    TAG_VOTE_REPLY: _decode_vote_reply,
    TAG_APPEND: _decode_append,
    TAG_APPEND_REPLY: _decode_append_reply,
    TAG_FORWARD: _decode_forward,
    TAG_TIMEOUT_NOW: _decode_timeout_now,
    TAG_RECOVER_REQUEST: _decode_recover_request,
    TAG_RECOVER_REPLY: _decode_recover_reply,
    TAG_RECOVER_REQUEST_AFTER: _decode_recover_request_after,
    TAG_RECOVER_REPLY_PART: _decode_recover_reply_part,
    TAG_PRE_VOTE_REQUEST: _decode_pre_vote_request,
    TAG_PRE_VOTE_REPLY: _decode_pre_vote_reply,
}


def decode_message(data: bytes | bytearray | memoryview) -> Message:
    """The peer message encoded in ``data``; WireFormatError if it is not a valid one."""
    return decode(data, _MESSAGE_DECODERS, "peer message")
