"""How a delivered event becomes a ``T-global`` record, and how to read one back.

A ``T-global`` record keeps the source record's key, value (``None`` stays ``None``:
tombstones survive), CreateTime timestamp and headers exactly, in order, duplicates and
``None`` values included. kdsync appends five headers of its own **after** the user's:

| header | value |
|---|---|
| ``kdsync.seq`` | the event's position in the topic's global stream, decimal |
| ``kdsync.origin`` | the member whose ``T`` the event was written to, UTF-8 |
| ``kdsync.topic`` | the source topic ``T``, UTF-8 |
| ``kdsync.partition`` | the source partition, decimal |
| ``kdsync.offset`` | the offset in the source partition, decimal |

Decimal values are ASCII digits without sign or leading zeros, so any tool shows them
and Spark SQL can ``CAST(... AS BIGINT)`` them. Reading takes kdsync's headers from the
**end**: a user header that happens to be named ``kdsync.seq`` stays the user's.

Partitioning: with ``P`` partitions, an event goes to partition ``origin partition mod P``.
Every event of one origin partition lands in one ``T-global`` partition, in offset order,
and the choice is the same in every member cluster. With ``P = 1`` (the default) the
whole topic is one strictly ordered partition.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from kdsync.ordering.events import DeliveredEvent, Header, SourceEvent

SEQ_HEADER = "kdsync.seq"
ORIGIN_HEADER = "kdsync.origin"
TOPIC_HEADER = "kdsync.topic"
PARTITION_HEADER = "kdsync.partition"
OFFSET_HEADER = "kdsync.offset"
# In the order they are appended, after every user header.
KDSYNC_HEADERS: tuple[str, ...] = (
    SEQ_HEADER,
    ORIGIN_HEADER,
    TOPIC_HEADER,
    PARTITION_HEADER,
    OFFSET_HEADER,
)

_DECIMAL = re.compile(rb"0|[1-9][0-9]*")


class RecordFormatError(ValueError):
    """A ``T-global`` record whose kdsync headers are missing or garbled."""


@dataclass(frozen=True, slots=True)
class GlobalRecord:
    """A record to produce to ``T-global`` (fields as confluent-kafka's ``produce`` takes)."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    timestamp_ms: int


def global_partition(origin_partition: int, global_partitions: int) -> int:
    """The ``T-global`` partition for events of ``origin_partition``."""
    if global_partitions < 1:
        raise ValueError(f"global_partitions must be >= 1, got {global_partitions}")
    if origin_partition < 0:
        raise ValueError(f"origin partition must be >= 0, got {origin_partition}")
    return origin_partition % global_partitions


def _decimal(value: int, what: str) -> bytes:
    if value < 0:
        raise ValueError(f"{what} must be >= 0, got {value}")
    return str(value).encode("ascii")


OriginHeaders = tuple[Header, Header, Header]


def origin_headers(origin: str, topic: str, partition: int) -> OriginHeaders:
    """kdsync's ``origin``, ``topic`` and ``partition`` headers: the same for every event of
    one origin partition, so the writer makes them once per batch, not per event."""
    return (
        (ORIGIN_HEADER, origin.encode("utf-8")),
        (TOPIC_HEADER, topic.encode("utf-8")),
        (PARTITION_HEADER, _decimal(partition, "partition")),
    )


def global_headers(event: SourceEvent, seq: int, origin: OriginHeaders) -> list[Header]:
    """All headers of ``event``'s ``T-global`` record: the user's, then kdsync's in order.

    ``seq`` and ``event.offset`` are never negative here (the ledger counts up from 0;
    Kafka offsets are not negative), so they are formatted without the check."""
    return [
        *event.headers,
        (SEQ_HEADER, b"%d" % seq),
        *origin,
        (OFFSET_HEADER, b"%d" % event.offset),
    ]


def to_global_record(
    delivered: DeliveredEvent, global_topic: str, global_partitions: int
) -> GlobalRecord:
    """The ``T-global`` record for ``delivered``: the source record plus kdsync's headers."""
    event = delivered.event
    _decimal(delivered.seq, "seq")
    _decimal(event.offset, "offset")
    return GlobalRecord(
        topic=global_topic,
        partition=global_partition(delivered.partition, global_partitions),
        key=event.key,
        value=event.value,
        headers=global_headers(
            event,
            delivered.seq,
            origin_headers(delivered.origin, delivered.topic, delivered.partition),
        ),
        timestamp_ms=event.timestamp_ms,
    )


def _parse_decimal(name: str, raw: bytes | None) -> int:
    if raw is None or not _DECIMAL.fullmatch(raw):
        raise RecordFormatError(f"header {name} is garbled: {raw!r} is not a decimal number")
    return int(raw)


def _parse_text(name: str, raw: bytes | None) -> str:
    if raw is None or not raw:
        raise RecordFormatError(f"header {name} is garbled: {raw!r} is empty")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RecordFormatError(f"header {name} is garbled: {raw!r} is not UTF-8") from None


def from_global_record(
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | str | None]] | None,
    timestamp_ms: int,
) -> DeliveredEvent:
    """Read a ``T-global`` record back into the event kdsync delivered.

    ``headers`` as confluent-kafka's ``Message.headers()`` returns them (``None`` when
    the record has none). kdsync's headers are taken from the end; the rest are the
    user's, returned unchanged in the event.
    """
    all_headers: list[Header] = [
        (name, raw.encode("utf-8") if isinstance(raw, str) else raw)
        for name, raw in (headers or ())
    ]
    count = len(KDSYNC_HEADERS)
    tail_start = len(all_headers) - count
    order = ", ".join(KDSYNC_HEADERS)
    # Match from the end, so the message names the header that is actually absent.
    for back, name in enumerate(reversed(KDSYNC_HEADERS), start=1):
        if back > len(all_headers):
            raise RecordFormatError(
                f"header {name} is missing: the record has {len(all_headers)} header(s); "
                f"a T-global record ends with {order}"
            )
        found = all_headers[-back][0]
        if found != name:
            raise RecordFormatError(
                f"header {name} is missing: found {found!r} in its place; "
                f"a T-global record ends with {order}"
            )
    tail = all_headers[tail_start:]
    values = dict(zip(KDSYNC_HEADERS, (raw for _, raw in tail), strict=True))
    return DeliveredEvent(
        seq=_parse_decimal(SEQ_HEADER, values[SEQ_HEADER]),
        origin=_parse_text(ORIGIN_HEADER, values[ORIGIN_HEADER]),
        topic=_parse_text(TOPIC_HEADER, values[TOPIC_HEADER]),
        partition=_parse_decimal(PARTITION_HEADER, values[PARTITION_HEADER]),
        event=SourceEvent(
            offset=_parse_decimal(OFFSET_HEADER, values[OFFSET_HEADER]),
            key=key,
            value=value,
            headers=tuple(all_headers[:tail_start]),
            timestamp_ms=timestamp_ms,
        ),
    )
