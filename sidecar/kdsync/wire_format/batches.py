"""Origin batches (with their events) and log entries: the bulk of every encoding.

Append, Forward and RecoverReply messages and the stored Entry record all carry these;
every replicated event crosses ``take_batch`` at least once, so it is written for speed.
A batch keeps its encoding once made or read, so a batch sent on or stored again is not
encoded twice.
"""

from __future__ import annotations

import struct

from kdsync.ordering.configuration import Configuration
from kdsync.ordering.events import EVENT_OVERHEAD_BYTES, Header, OriginBatch, SourceEvent
from kdsync.ordering.log import Entry
from kdsync.wire_format.envelope import WireFormatError, bad_flag, bad_length

_ENTRY = struct.Struct(">qqB")
_BATCH = struct.Struct(">iqqBIII")
_EVENT = struct.Struct(">qqiiI")
_HEADER = struct.Struct(">Ii")
_CONFIG_HEAD = struct.Struct(">HHH")  # voters, witnesses, learners
_NAME = struct.Struct(">H")
# An entry's kind: a no-op, an origin batch, or a membership change (a configuration);
# one that carries members' addresses has its own kind (and marker, where optional), so
# everything written before addresses existed reads as it did.
_NO_OP, _BATCH_ENTRY, _CONFIG_ENTRY, _CONFIG_ADDRESSES_ENTRY = 0, 1, 2, 3
_HAS_CONFIG, _HAS_CONFIG_ADDRESSES = b"\x01", b"\x02"
# A NamedTuple's own constructor is a Python function; tuple.__new__ builds the same
# object about 3x faster, which counts once per event decoded.
new_tuple = tuple.__new__

# -- encoding ---------------------------------------------------------------------------
#
# Encoders append pieces to a list joined once at the end: payload bytes (values up to
# megabytes) are copied exactly once, into the result.


def put_batch(parts: list[bytes], batch: OriginBatch) -> None:
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


def put_entries(parts: list[bytes], entries: tuple[Entry, ...]) -> None:
    pack_entry = _ENTRY.pack
    for entry in entries:
        batch = entry.batch
        if batch is not None:
            parts.append(pack_entry(entry.index, entry.term, _BATCH_ENTRY))
            put_batch(parts, batch)
        elif entry.config is not None:
            kind = _CONFIG_ADDRESSES_ENTRY if entry.config.addresses else _CONFIG_ENTRY
            parts.append(pack_entry(entry.index, entry.term, kind))
            put_configuration(parts, entry.config)
        else:
            parts.append(pack_entry(entry.index, entry.term, _NO_OP))


def put_optional_configuration(parts: list[bytes], config: Configuration | None) -> None:
    """A configuration some messages and records may end with (earlier releases' end
    before it), after a marker byte: anything else there stays unexpected trailing data."""
    if config is not None:
        parts.append(_HAS_CONFIG_ADDRESSES if config.addresses else _HAS_CONFIG)
        put_configuration(parts, config)


def take_optional_configuration(data: bytes, pos: int) -> tuple[Configuration | None, int]:
    marker = data[pos : pos + 1]
    if marker == _HAS_CONFIG:
        return take_configuration(data, pos + 1)
    if marker == _HAS_CONFIG_ADDRESSES:
        return take_configuration(data, pos + 1, with_addresses=True)
    return None, pos


def put_configuration(parts: list[bytes], config: Configuration) -> None:
    """The names; then, when it has any (the caller marks which), the addresses."""
    witnesses = sorted(config.witnesses)
    parts.append(_CONFIG_HEAD.pack(len(config.voters), len(witnesses), len(config.learners)))
    for name in (*config.voters, *witnesses, *config.learners):
        _put_name(parts, name)
    if config.addresses:
        parts.append(_NAME.pack(len(config.addresses)))
        for member, address in config.addresses:
            _put_name(parts, member)
            _put_name(parts, address)


def _put_name(parts: list[bytes], name: str) -> None:
    encoded = name.encode()
    parts.append(_NAME.pack(len(encoded)))
    parts.append(encoded)


# -- decoding ---------------------------------------------------------------------------
#
# Readers take (data, pos) and return (value, new pos). They do not bounds-check each
# slice: a length that runs past the end makes a later ``unpack_from`` fail or leaves the
# final position beyond the end, and both are reported as truncation by ``envelope.decode``.
# Lengths are never negative (u32, or i32 checked against -1), so ``unpack_from`` never
# sees a negative offset, which it would count from the end.


def take_batch(data: bytes, pos: int) -> tuple[OriginBatch, int]:
    first = pos
    partition, start, end, opens, count, origin_len, topic_len = _BATCH.unpack_from(data, pos)
    if opens > 1:
        raise bad_flag("batch 'opens'", opens)
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
    size = 0  # OriginBatch.size_bytes, summed here rather than in a second pass
    for _ in range(count):
        offset, timestamp_ms, key_len, value_len, header_count = unpack_event(data, pos)
        pos += event_size
        size += EVENT_OVERHEAD_BYTES
        key: bytes | None
        value: bytes | None
        if key_len >= 0:
            key = data[pos : pos + key_len]
            pos += key_len
            size += key_len
        elif key_len == -1:
            key = None
        else:
            raise bad_length("key", key_len)
        if value_len >= 0:
            value = data[pos : pos + value_len]
            pos += value_len
            size += value_len
        elif value_len == -1:
            value = None
        else:
            raise bad_length("value", value_len)
        headers: tuple[Header, ...] = ()
        if header_count:
            header_list: list[Header] = []
            for _ in range(header_count):
                name_len, header_len = unpack_header(data, pos)
                pos += header_size
                name = data[pos : pos + name_len].decode()
                pos += name_len
                size += len(name)
                if header_len >= 0:
                    header_list.append((name, data[pos : pos + header_len]))
                    pos += header_len
                    size += header_len
                elif header_len == -1:
                    header_list.append((name, None))
                else:
                    raise bad_length("header value", header_len)
            headers = tuple(header_list)
        append(new_tuple(SourceEvent, (offset, key, value, headers, timestamp_ms)))
    batch = OriginBatch(origin, topic, partition, start, end, bool(opens), tuple(events))
    # Sending or storing this batch again re-uses these bytes instead of re-encoding.
    object.__setattr__(batch, "_encoded", bytes(data[first:pos]))
    object.__setattr__(batch, "_size", size)
    return batch, pos


def take_entries(data: bytes, pos: int, count: int) -> tuple[tuple[Entry, ...], int]:
    unpack_entry = _ENTRY.unpack_from
    entry_size = _ENTRY.size
    entries: list[Entry] = []
    for _ in range(count):
        index, term, kind = unpack_entry(data, pos)
        pos += entry_size
        if kind == _BATCH_ENTRY:
            batch, pos = take_batch(data, pos)
            entries.append(Entry(index, term, batch))
        elif kind == _NO_OP:
            entries.append(Entry(index, term, None))
        elif kind in (_CONFIG_ENTRY, _CONFIG_ADDRESSES_ENTRY):
            with_addresses = kind == _CONFIG_ADDRESSES_ENTRY
            config, pos = take_configuration(data, pos, with_addresses=with_addresses)
            entries.append(Entry(index, term, None, config))
        else:
            raise WireFormatError(
                f"entry kind must be 0 (no-op), 1 (batch), 2 or 3 (membership change), got {kind}"
            )
    return tuple(entries), pos


def take_configuration(
    data: bytes, pos: int, *, with_addresses: bool = False
) -> tuple[Configuration, int]:
    counts = _CONFIG_HEAD.unpack_from(data, pos)
    pos += _CONFIG_HEAD.size
    groups: list[tuple[str, ...]] = []
    for count in counts:
        names: list[str] = []
        for _ in range(count):
            name, pos = _take_name(data, pos)
            names.append(name)
        groups.append(tuple(names))
    voters, witnesses, learners = groups
    addresses: list[tuple[str, str]] = []
    if with_addresses:
        (count,) = _NAME.unpack_from(data, pos)
        pos += _NAME.size
        for _ in range(count):
            member, pos = _take_name(data, pos)
            address, pos = _take_name(data, pos)
            addresses.append((member, address))
    return Configuration(voters, frozenset(witnesses), learners, tuple(addresses)), pos


def _take_name(data: bytes, pos: int) -> tuple[str, int]:
    (length,) = _NAME.unpack_from(data, pos)
    pos += _NAME.size
    return data[pos : pos + length].decode(), pos + length
