"""Framing and the other socket-free pieces of the peer transport.

Streams here are ``asyncio.StreamReader``s fed by hand, so every byte boundary is
under the test's control.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from kdsync.transport.address import parse_address
from kdsync.transport.base import FrameTooLarge, PeerAuthenticationError, validate_member_name
from kdsync.transport.framing import (
    HEADER_BYTES,
    LENGTH_PREFIX,
    check_frame_size,
    encode_frame,
    encode_frames,
    read_frame,
)
from kdsync.transport.identity import member_uri, parse_member_uri
from kdsync.transport.tcp.backoff import ExponentialBackoff
from kdsync.transport.tcp_config import TcpTransportConfig
from kdsync.transport.tls import member_from_peercert


def run_with_reader(
    data: bytes, body: Callable[[asyncio.StreamReader], Awaitable[None]], *, eof: bool = True
) -> None:
    async def main() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        if eof:
            reader.feed_eof()
        await body(reader)

    asyncio.run(main())


def test_frame_round_trips_including_empty_and_binary() -> None:
    payloads = [b"", b"x", bytes(range(256)) * 3, b"\x00\x00\x00\x05"]

    async def body(reader: asyncio.StreamReader) -> None:
        for expected in payloads:
            assert await read_frame(reader, max_frame_bytes=1024) == expected

    run_with_reader(b"".join(encode_frame(p) for p in payloads), body)


def test_frames_split_across_arbitrary_chunks_reassemble() -> None:
    payloads = [b"alpha", b"", b"b" * 1000, b"gamma"]
    wire = b"".join(encode_frame(p) for p in payloads)

    async def main() -> None:
        reader = asyncio.StreamReader()

        async def feed() -> None:
            # One byte at a time, yielding between bytes, is the worst case for a reader.
            for index in range(len(wire)):
                reader.feed_data(wire[index : index + 1])
                await asyncio.sleep(0)
            reader.feed_eof()

        feeder = asyncio.create_task(feed())
        received = [await read_frame(reader, 4096) for _ in payloads]
        await feeder
        assert received == payloads

    asyncio.run(main())


def test_length_prefix_is_big_endian() -> None:
    assert encode_frame(b"abc")[:HEADER_BYTES] == b"\x00\x00\x00\x03"


def test_oversized_length_prefix_is_rejected_before_reading_payload() -> None:
    async def body(reader: asyncio.StreamReader) -> None:
        with pytest.raises(FrameTooLarge):
            await read_frame(reader, max_frame_bytes=1024)

    # Only the prefix is available and no EOF: a reader that tried to buffer the
    # payload would hang instead of raising.
    run_with_reader(LENGTH_PREFIX.pack(0xFFFFFFFF), body, eof=False)
    run_with_reader(LENGTH_PREFIX.pack(1025), body, eof=False)


def test_frame_at_exactly_the_limit_is_accepted() -> None:
    async def body(reader: asyncio.StreamReader) -> None:
        assert await read_frame(reader, max_frame_bytes=16) == b"z" * 16

    run_with_reader(encode_frame(b"z" * 16), body)


def test_encoding_checks_the_limit() -> None:
    with pytest.raises(FrameTooLarge):
        encode_frame(b"123", max_frame_bytes=2)
    with pytest.raises(FrameTooLarge):
        check_frame_size(2**32, max_frame_bytes=2**40)


def test_clean_eof_between_frames_has_empty_partial() -> None:
    async def body(reader: asyncio.StreamReader) -> None:
        assert await read_frame(reader, 64) == b"one"
        with pytest.raises(asyncio.IncompleteReadError) as caught:
            await read_frame(reader, 64)
        assert caught.value.partial == b""

    run_with_reader(encode_frame(b"one"), body)


def test_truncated_frame_reports_partial_data() -> None:
    async def body(reader: asyncio.StreamReader) -> None:
        with pytest.raises(asyncio.IncompleteReadError) as caught:
            await read_frame(reader, 64)
        assert caught.value.partial == b"trunc"

    run_with_reader(encode_frame(b"truncated")[: HEADER_BYTES + 5], body)


def test_encode_frames_coalesces_small_and_passes_large_through_uncopied() -> None:
    large = b"L" * (256 * 1024)
    payloads = [b"a", b"bb", large, b"", b"c" * 70_000, b"d"]
    buffers = encode_frames(payloads)
    assert any(buffer is large for buffer in buffers)
    # Fewer buffers than frames: small ones were joined.
    assert len(buffers) < 2 * len(payloads)

    async def body(reader: asyncio.StreamReader) -> None:
        for expected in payloads:
            assert await read_frame(reader, 1024 * 1024) == expected

    run_with_reader(b"".join(buffers), body)


def test_backoff_doubles_to_the_cap_with_injected_jitter() -> None:
    backoff = ExponentialBackoff(initial=0.1, maximum=1.0, jitter=lambda: 0.0)
    delays = [backoff.next_delay() for _ in range(6)]
    # jitter 0 gives half the ceiling: ceilings 0.1, 0.2, 0.4, 0.8, 1.0, 1.0.
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.5, 0.5])
    backoff.reset()
    assert backoff.next_delay() == pytest.approx(0.05)

    highest = ExponentialBackoff(initial=0.1, maximum=1.0, jitter=lambda: 0.999)
    for _ in range(10_000):  # long outages must not overflow
        delay = highest.next_delay()
    assert 0.99 < delay < 1.0


def test_member_uri_round_trip_and_rejects() -> None:
    assert member_uri("orders", "eu-west") == "kdsync://orders/eu-west"
    assert parse_member_uri("kdsync://orders/eu-west") == ("orders", "eu-west")
    for bad in [
        "https://orders/eu-west",
        "kdsync://orders",
        "kdsync://orders/eu/west",
        "kdsync:///eu-west",
        "kdsync://orders/",
    ]:
        assert parse_member_uri(bad) is None, bad
    with pytest.raises(ValueError):
        member_uri("orders", "a/b")
    with pytest.raises(ValueError):
        validate_member_name("-leading-dash")


def test_member_from_peercert() -> None:
    def cert(*uris: str) -> dict[str, object]:
        return {
            "subject": ((("commonName", "x"),),),
            "subjectAltName": (*(("URI", uri) for uri in uris), ("DNS", "ignored")),
        }

    assert member_from_peercert(cert("kdsync://g/a"), "g") == "a"
    assert member_from_peercert(cert("spiffe://elsewhere/x", "kdsync://g/a"), "g") == "a"
    with pytest.raises(PeerAuthenticationError, match="group"):
        member_from_peercert(cert("kdsync://other/a"), "g")
    with pytest.raises(PeerAuthenticationError, match="several"):
        member_from_peercert(cert("kdsync://g/a", "kdsync://g/b"), "g")
    with pytest.raises(PeerAuthenticationError, match="no kdsync member"):
        member_from_peercert(cert(), "g")
    with pytest.raises(PeerAuthenticationError):
        member_from_peercert(None, "g")


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert parse_address("kdsync-b.ns.svc:1") == ("kdsync-b.ns.svc", 1)
    assert parse_address("[::1]:9400") == ("::1", 9400)
    for bad in ["nohost", ":9400", "host:", "host:port", "host:70000"]:
        with pytest.raises(ValueError):
            parse_address(bad)


def test_config_requires_explicit_security_choice() -> None:
    peers = {"a": "127.0.0.1:1", "b": "127.0.0.1:2"}
    with pytest.raises(ValueError, match="insecure"):
        TcpTransportConfig(group="g", member="a", listen="127.0.0.1:1", peers=peers)
    config = TcpTransportConfig(
        group="g", member="a", listen="127.0.0.1:1", peers=peers, insecure=True
    )
    assert config.other_members() == ["b"]
    with pytest.raises(ValueError, match="besides"):
        TcpTransportConfig(
            group="g", member="a", listen="127.0.0.1:1", peers={"a": "x:1"}, insecure=True
        )
    with pytest.raises(ValueError, match="queue"):
        TcpTransportConfig(
            group="g",
            member="a",
            listen="127.0.0.1:1",
            peers=peers,
            insecure=True,
            max_frame_bytes=1024,
            max_queue_bytes=512,
        )
