"""T-global record layout: fidelity round trip, kdsync's headers, partitioning, errors."""

from __future__ import annotations

import random

import pytest

from kdsync.ordering.events import DeliveredEvent, Header, SourceEvent
from kdsync.record_format import (
    KDSYNC_HEADERS,
    GlobalRecord,
    RecordFormatError,
    from_global_record,
    global_partition,
    to_global_record,
)

MIB = 1024 * 1024


def _bytes(rng: random.Random, size: int) -> bytes:
    return rng.randbytes(size)


def _optional_bytes(rng: random.Random) -> bytes | None:
    choice = rng.randrange(6)
    if choice == 0:
        return None
    if choice == 1:
        return b""
    if choice == 2:
        return b"\xff\xfe\x00\x80not utf-8"
    if choice == 3:
        return "caf\u00e9 \u2603".encode()
    return _bytes(rng, rng.randrange(1, 300))


def _headers(rng: random.Random) -> tuple[Header, ...]:
    names = ["trace-id", "content-type", "kdsync.seq", "kdsync.offset", "dup", "", "\u00fcber"]
    headers: list[Header] = []
    for _ in range(rng.randrange(0, 8)):
        headers.append((rng.choice(names), _optional_bytes(rng)))
    return tuple(headers)


def random_event(rng: random.Random) -> DeliveredEvent:
    return DeliveredEvent(
        seq=rng.choice([0, 1, rng.randrange(2**63)]),
        origin=rng.choice(["us-east", "eu-west", "a"]),
        topic=rng.choice(["orders", "payments.eu", "t_1-x"]),
        partition=rng.choice([0, 1, 7, rng.randrange(100_000)]),
        event=SourceEvent(
            offset=rng.choice([0, 5, rng.randrange(2**62)]),
            key=_optional_bytes(rng),
            value=_optional_bytes(rng),
            headers=_headers(rng),
            timestamp_ms=rng.choice([1, 1_700_000_000_000, rng.randrange(2**41)]),
        ),
    )


def round_trip(delivered: DeliveredEvent, partitions: int = 1) -> GlobalRecord:
    record = to_global_record(delivered, "orders-global", partitions)
    back = from_global_record(record.key, record.value, record.headers, record.timestamp_ms)
    assert back == delivered
    return record


def test_round_trip_many_generated_events() -> None:
    rng = random.Random(20240611)
    for _ in range(3000):
        delivered = random_event(rng)
        partitions = rng.choice([1, 2, 3, 12])
        record = round_trip(delivered, partitions)
        event = delivered.event
        assert record.topic == "orders-global"
        assert record.partition == delivered.partition % partitions
        assert record.key == event.key
        assert record.value == event.value
        assert record.timestamp_ms == event.timestamp_ms
        # The user's headers come first, untouched; kdsync's five follow.
        assert tuple(record.headers[: len(event.headers)]) == event.headers
        assert [name for name, _ in record.headers[len(event.headers) :]] == list(KDSYNC_HEADERS)


def test_kdsync_headers_are_readable_text() -> None:
    delivered = DeliveredEvent(
        seq=42,
        origin="us-east",
        topic="orders",
        partition=3,
        event=SourceEvent(
            offset=1007, key=b"k", value=b"v", headers=(), timestamp_ms=1_700_000_000_123
        ),
    )
    record = to_global_record(delivered, "orders-global", 1)
    assert record.headers == [
        ("kdsync.seq", b"42"),
        ("kdsync.origin", b"us-east"),
        ("kdsync.topic", b"orders"),
        ("kdsync.partition", b"3"),
        ("kdsync.offset", b"1007"),
    ]
    assert record.timestamp_ms == 1_700_000_000_123


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (None, None),  # tombstone without key
        (b"k", None),  # tombstone
        (b"", b""),
        (None, b"\x00\xff" * 10),
        (b"big", bytes(range(256)) * (MIB // 256)),  # 1 MiB value
    ],
)
def test_fidelity_edge_cases(key: bytes | None, value: bytes | None) -> None:
    event = SourceEvent(offset=0, key=key, value=value, headers=(), timestamp_ms=0)
    record = round_trip(DeliveredEvent(seq=0, origin="a", topic="t", partition=0, event=event))
    assert record.value is value  # not copied or re-encoded


def test_user_headers_named_like_kdsync_stay_the_users() -> None:
    user_headers: tuple[Header, ...] = (
        ("kdsync.seq", b"999"),
        ("kdsync.origin", None),
        ("x", None),
        ("x", b"again"),
        ("kdsync.offset", b"not a number"),
    )
    event = SourceEvent(offset=9, key=None, value=b"v", headers=user_headers, timestamp_ms=5)
    delivered = DeliveredEvent(seq=3, origin="eu-west", topic="orders", partition=1, event=event)
    record = round_trip(delivered)
    back = from_global_record(record.key, record.value, record.headers, record.timestamp_ms)
    assert back.seq == 3
    assert back.event.headers == user_headers


def test_reads_str_header_values_and_tuples() -> None:
    headers = (("u", "text"), *[(name, "1") for name in KDSYNC_HEADERS])
    back = from_global_record(None, None, headers, 7)
    assert back.event.headers == (("u", b"text"),)
    assert (back.seq, back.origin, back.topic, back.partition, back.event.offset) == (
        1,
        "1",
        "1",
        1,
        1,
    )


# -- partitioning ----------------------------------------------------------------------


def test_one_partition_takes_everything() -> None:
    assert {global_partition(p, 1) for p in range(50)} == {0}


def test_origin_partition_mod_p() -> None:
    assert [global_partition(p, 3) for p in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    rng = random.Random(7)
    for _ in range(200):
        delivered = random_event(rng)
        partitions = rng.randrange(1, 20)
        record = to_global_record(delivered, "x-global", partitions)
        assert record.partition == delivered.partition % partitions


def test_partition_rule_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="global_partitions"):
        global_partition(0, 0)
    with pytest.raises(ValueError, match="origin partition"):
        global_partition(-1, 3)


# -- errors ----------------------------------------------------------------------------


def _valid_headers() -> list[tuple[str, bytes | None]]:
    return [
        ("user", b"u"),
        ("kdsync.seq", b"10"),
        ("kdsync.origin", b"us-east"),
        ("kdsync.topic", b"orders"),
        ("kdsync.partition", b"2"),
        ("kdsync.offset", b"99"),
    ]


def test_valid_headers_parse() -> None:
    back = from_global_record(b"k", b"v", _valid_headers(), 1)
    assert (back.seq, back.origin, back.topic, back.partition, back.event.offset) == (
        10,
        "us-east",
        "orders",
        2,
        99,
    )
    assert back.event.headers == (("user", b"u"),)


def test_no_headers_at_all() -> None:
    with pytest.raises(RecordFormatError, match=r"kdsync\.offset is missing"):
        from_global_record(b"k", b"v", None, 1)


def test_missing_header_is_named() -> None:
    headers = _valid_headers()
    del headers[4]  # kdsync.partition
    with pytest.raises(RecordFormatError, match=r"kdsync\.partition is missing"):
        from_global_record(b"k", b"v", headers, 1)


def test_only_user_headers() -> None:
    with pytest.raises(RecordFormatError, match=r"kdsync\.offset is missing.*'user'"):
        from_global_record(b"k", b"v", [("user", b"u")], 1)


def test_kdsync_headers_must_come_last() -> None:
    headers = _valid_headers()
    headers.append(("user-after", b"x"))
    with pytest.raises(RecordFormatError, match=r"kdsync\.offset is missing"):
        from_global_record(b"k", b"v", headers, 1)


@pytest.mark.parametrize(
    ("index", "raw", "header"),
    [
        (1, b"12a", "kdsync.seq"),
        (1, b"-1", "kdsync.seq"),
        (1, b"007", "kdsync.seq"),
        (1, None, "kdsync.seq"),
        (1, b" 1", "kdsync.seq"),
        (2, b"\xff", "kdsync.origin"),
        (2, b"", "kdsync.origin"),
        (3, None, "kdsync.topic"),
        (4, b"0x2", "kdsync.partition"),
        (5, "\u0661".encode(), "kdsync.offset"),  # a non-ASCII digit
    ],
)
def test_garbled_header_is_named(index: int, raw: bytes | None, header: str) -> None:
    headers = _valid_headers()
    headers[index] = (headers[index][0], raw)
    with pytest.raises(RecordFormatError, match=rf"{header} is garbled"):
        from_global_record(b"k", b"v", headers, 1)


def test_negative_coordinates_are_not_written() -> None:
    event = SourceEvent(offset=-1, key=None, value=None, headers=(), timestamp_ms=0)
    with pytest.raises(ValueError, match="offset"):
        to_global_record(DeliveredEvent(0, "a", "t", 0, event), "t-global", 1)
