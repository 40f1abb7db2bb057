"""Stored records (type tags 16+): what a data member keeps in its internal topics.

Log entries go to the log topic, hard state (term and vote) and ledger snapshots to
theirs; a restarted member, possibly of another kdsync version, reads them back.
"""

from __future__ import annotations

import struct

from kdsync.ordering.events import OriginPartition
from kdsync.ordering.ledger import LedgerState
from kdsync.ordering.log import Entry
from kdsync.ordering.ready import HardState
from kdsync.wire_format.batches import (
    put_entries,
    put_optional_configuration,
    take_entries,
    take_optional_configuration,
)
from kdsync.wire_format.envelope import (
    FORMAT_VERSION,
    PREFIX,
    TAG_ENTRY,
    TAG_HARD_STATE,
    TAG_LEDGER_STATE,
    WireFormatError,
    bad_length,
    decode,
    encode_error,
)

_HARD_STATE = struct.Struct(">BBqi")
_LEDGER_HEAD = struct.Struct(">BBqq")
_COUNT = struct.Struct(">I")
_MARK = struct.Struct(">IIiq")
_SEQ = struct.Struct(">Iq")
# Optional at the end of a LedgerState (records of earlier releases end before it): the
# latest membership change applied, as the configuration and then its index.
_CONFIG_INDEX = struct.Struct(">q")


def encode_entry(entry: Entry) -> bytes:
    """The encoding of a log entry as stored in the log topic."""
    parts = [PREFIX.pack(FORMAT_VERSION, TAG_ENTRY)]
    try:
        put_entries(parts, (entry,))
    except (struct.error, UnicodeEncodeError) as exc:
        raise encode_error("Entry", exc) from exc
    return b"".join(parts)


def encode_hard_state(state: HardState) -> bytes:
    try:
        if state.voted_for is None:
            return _HARD_STATE.pack(FORMAT_VERSION, TAG_HARD_STATE, state.term, -1)
        voted_for = state.voted_for.encode()
        head = _HARD_STATE.pack(FORMAT_VERSION, TAG_HARD_STATE, state.term, len(voted_for))
    except (struct.error, UnicodeEncodeError) as exc:
        raise encode_error("HardState", exc) from exc
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
        put_optional_configuration(parts, state.config)
        if state.config is not None:
            parts.append(_CONFIG_INDEX.pack(state.config_index))
    except (struct.error, UnicodeEncodeError) as exc:
        raise encode_error("LedgerState", exc) from exc
    return b"".join(parts)


def _decode_entry(data: bytes) -> tuple[Entry, int]:
    entries, pos = take_entries(data, PREFIX.size, 1)
    return entries[0], pos


def _decode_hard_state(data: bytes) -> tuple[HardState, int]:
    _, _, term, voted_len = _HARD_STATE.unpack_from(data)
    pos = _HARD_STATE.size
    if voted_len == -1:
        return HardState(term, None), pos
    if voted_len < 0:
        raise bad_length("voted_for", voted_len)
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
    config, pos = take_optional_configuration(data, pos)
    config_index = 0
    if config is not None:
        (config_index,) = _CONFIG_INDEX.unpack_from(data, pos)
        pos += _CONFIG_INDEX.size
    return LedgerState(applied_index, applied_term, marks, next_seq, config, config_index), pos


_ENTRY_DECODERS = {TAG_ENTRY: _decode_entry}
_HARD_STATE_DECODERS = {TAG_HARD_STATE: _decode_hard_state}
_LEDGER_STATE_DECODERS = {TAG_LEDGER_STATE: _decode_ledger_state}


def decode_entry(data: bytes | bytearray | memoryview) -> Entry:
    return decode(data, _ENTRY_DECODERS, "Entry record")


def decode_hard_state(data: bytes | bytearray | memoryview) -> HardState:
    return decode(data, _HARD_STATE_DECODERS, "HardState record")


def decode_ledger_state(data: bytes | bytearray | memoryview) -> LedgerState:
    return decode(data, _LEDGER_STATE_DECODERS, "LedgerState record")
