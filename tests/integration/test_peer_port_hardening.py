"""The peer port under attack, on loopback with real mutual TLS: garbage before and
after the TLS handshake, clients without a member certificate, oversized length
prefixes, slowloris connections before and after authentication, a flood of
half-open connections. Each is closed, counted in
``kdsync_peer_connections_refused_total{reason}``, and the real members keep talking.

Waits are on conditions with deadlines, never fixed sleeps; the timeouts under test are
configured short (fractions of a second) so the tests stay quick.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import ssl
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kdsync.pki import make_group_pki
from kdsync.transport import MemberTlsFiles, TcpTransportConfig
from kdsync.transport.framing import LENGTH_PREFIX, encode_frame
from kdsync.transport.tcp import TcpTransport
from kdsync.transport.tcp.refusals import RefusalReason
from kdsync.transport.tls import client_context
from kdsync.wire_format.envelope import WireFormatError
from kdsync.wire_format.messages import decode_message

GROUP = "orders"
DEADLINE_S = 20.0
SHORT_S = 0.5  # the handshake and frame timeouts under test


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, MemberTlsFiles]:
    return make_group_pki(GROUP, ["a", "b", "c", "mallory"], tmp_path_factory.mktemp("pki"))


@pytest.fixture(autouse=True)
def no_leaks_or_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No unclosed socket, no error logged (an attack is a warning, not a bug)."""
    caplog.set_level(logging.INFO)
    # Garbage left by earlier tests in the session is collected first, outside the
    # window: its unclosed sockets are not this test's (CI once blamed one on it).
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        yield
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def configs_for(pki: dict[str, MemberTlsFiles], **limits: Any) -> dict[str, TcpTransportConfig]:
    ports = {}
    sockets = []
    for name in ("a", "b"):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
        ports[name] = f"127.0.0.1:{sock.getsockname()[1]}"
    for sock in sockets:
        sock.close()
    settings: dict[str, Any] = {
        "backoff_initial_s": 0.02,
        "backoff_max_s": 0.2,
        "handshake_timeout_s": SHORT_S,
        "frame_timeout_s": SHORT_S,
        **limits,
    }
    # "c" is in every member's list but never runs: the raw test clients use its key.
    peers = {**ports, "c": "127.0.0.1:9"}
    return {
        name: TcpTransportConfig(
            group=GROUP, member=name, listen=ports[name], peers=peers, tls=pki[name], **settings
        )
        for name in ("a", "b")
    }


@contextlib.asynccontextmanager
async def group(
    pki: dict[str, MemberTlsFiles], **limits: Any
) -> AsyncIterator[tuple[TcpTransport, TcpTransport, int, CollectorRegistry]]:
    """Members a and b; yields them, a's port and a's metrics registry."""
    configs = configs_for(pki, **limits)
    registry = CollectorRegistry()
    a = TcpTransport(configs["a"], jitter=lambda: 0.0, registry=registry)
    b = TcpTransport(configs["b"], jitter=lambda: 0.0)
    try:
        await a.start()
        await b.start()
        yield a, b, a.listen_address[1], registry
    finally:
        await b.close()
        await a.close()


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {DEADLINE_S}s waiting until {what}")
        await asyncio.sleep(0.01)


async def still_delivers(sender: TcpTransport, receiver: TcpTransport, payload: bytes) -> None:
    assert sender.send(receiver.member, payload)
    async with asyncio.timeout(DEADLINE_S):
        frame = await receiver.receive()
    assert frame == (sender.member, payload)


def refused(a: TcpTransport, reason: RefusalReason) -> Callable[[], bool]:
    baseline = a.refusals.value(reason)
    return lambda: a.refusals.value(reason) > baseline


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Read until the server closes; what it sent before."""
    got = b""
    with contextlib.suppress(OSError, ssl.SSLError):
        async with asyncio.timeout(DEADLINE_S):
            while chunk := await reader.read(65536):
                got += chunk
    return got


async def as_member_c(
    pki: dict[str, MemberTlsFiles], port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(pki["c"]))
    writer.write(encode_frame(b'{"kdsync":"hello","version":1,"group":"orders","member":"c"}'))
    await writer.drain()
    return reader, writer


async def hang_up(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await writer.wait_closed()


# -- tests --------------------------------------------------------------------------


def test_garbage_before_the_tls_handshake_is_refused_and_counted(
    pki: dict[str, MemberTlsFiles],
) -> None:
    async def main() -> None:
        async with group(pki) as (a, b, port, registry):
            counted = refused(a, RefusalReason.TLS_HANDSHAKE)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"\x16\x03\x01\xff\xff" + b"GET / HTTP/1.1\r\n\r\n" * 100)
            await closed_by_server(reader)  # a TLS alert at most
            await hang_up(writer)
            await wait_until(counted, "a counts the failed TLS handshake")
            await still_delivers(b, a, b"still here")
            metrics = generate_latest(registry).decode()
            assert 'kdsync_peer_connections_refused_total{reason="tls_handshake"} 1.0' in metrics

    asyncio.run(main())


def test_a_client_without_a_member_certificate_is_refused(
    pki: dict[str, MemberTlsFiles],
) -> None:
    async def main() -> None:
        async with group(pki) as (a, b, port, _):
            # Trusts the group CA, presents no certificate of its own.
            anonymous = ssl.create_default_context(cafile=str(pki["a"].ca_cert))
            anonymous.check_hostname = False
            counted = refused(a, RefusalReason.TLS_HANDSHAKE)
            with contextlib.suppress(OSError, ssl.SSLError):
                reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=anonymous)
                writer.write(encode_frame(b"injected"))
                assert await closed_by_server(reader) == b""
                await hang_up(writer)
            await wait_until(counted, "a counts the client without a certificate")
            # A certificate of the group's CA for a non-member gets through TLS only.
            stranger = refused(a, RefusalReason.NOT_A_MEMBER)
            with contextlib.suppress(OSError, ssl.SSLError):
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=client_context(pki["mallory"])
                )
                writer.write(encode_frame(b"injected"))
                assert await closed_by_server(reader) == b""
                await hang_up(writer)
            await wait_until(stranger, "a counts the non-member")
            assert sum(s.frames_received for s in a.peer_states().values()) == 0
            await still_delivers(b, a, b"sentinel")

    asyncio.run(main())


def test_garbage_after_the_tls_handshake_is_refused_or_dropped(
    pki: dict[str, MemberTlsFiles],
) -> None:
    async def main() -> None:
        async with group(pki) as (a, b, port, _):
            # Valid TLS as member c, then garbage instead of a hello.
            counted = refused(a, RefusalReason.BAD_HELLO)
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_context(pki["c"])
            )
            writer.write(encode_frame(b"\x00\xff not a hello") + b"\xde\xad" * 100)
            assert await closed_by_server(reader) == b""
            await hang_up(writer)
            await wait_until(counted, "a counts the bad hello")
            # A valid hello, then a well-formed frame holding garbage: the transport
            # passes bytes up; the codec refuses them (the sidecar counts it in
            # kdsync_peer_decode_errors_total and drops the frame).
            reader, writer = await as_member_c(pki, port)
            writer.write(encode_frame(b"\x01\x03garbage"))
            await writer.drain()
            async with asyncio.timeout(DEADLINE_S):
                frame = await a.receive()
            assert frame.peer == "c"
            with pytest.raises(WireFormatError):
                decode_message(frame.payload)
            await hang_up(writer)
            await still_delivers(b, a, b"sentinel")

    asyncio.run(main())


def test_a_1_gib_length_prefix_closes_the_link_without_reading_it(
    pki: dict[str, MemberTlsFiles],
) -> None:
    async def main() -> None:
        async with group(pki) as (a, b, port, _):
            counted = refused(a, RefusalReason.FRAME_TOO_LARGE)
            reader, writer = await as_member_c(pki, port)
            writer.write(LENGTH_PREFIX.pack(1 << 30) + b"\x00" * 4096)
            await writer.drain()
            await closed_by_server(reader)
            await hang_up(writer)
            await wait_until(counted, "a counts the oversized frame")
            assert a.peer_states()["c"].frames_received == 0
            assert a.peer_states()["c"].bytes_received == 0
            await still_delivers(b, a, b"sentinel")

    asyncio.run(main())


def test_slowloris_connections_are_closed_after_the_timeouts(
    pki: dict[str, MemberTlsFiles],
) -> None:
    """Ten connections announce a 16 KiB TLS ClientHello record and trickle it a byte
    every 50 ms, and member c
    sends half a frame and stalls: all are closed after the configured timeouts while
    a and b keep exchanging frames."""

    async def trickle(port: int) -> bool:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"\x16\x03\x01\x40\x00\x01")  # handshake record, ClientHello
        try:
            async with asyncio.timeout(DEADLINE_S):
                while not reader.at_eof():
                    writer.write(b"\x00")
                    await writer.drain()
                    await asyncio.sleep(0.05)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.001):
                            await reader.read(1)
            return True
        except OSError:
            return True  # reset by the server: closed too
        finally:
            writer.transport.abort()

    async def main() -> None:
        async with group(pki) as (a, b, port, _):
            handshakes = refused(a, RefusalReason.HANDSHAKE_TIMEOUT)
            stalled = refused(a, RefusalReason.FRAME_TIMEOUT)
            slow = [asyncio.create_task(trickle(port)) for _ in range(10)]
            reader, writer = await as_member_c(pki, port)
            writer.write(LENGTH_PREFIX.pack(100) + b"only part")
            await writer.drain()
            await still_delivers(b, a, b"during the attack")
            assert all(await asyncio.gather(*slow)), "every slow connection was closed"
            await closed_by_server(reader)
            await hang_up(writer)
            await wait_until(handshakes, "a counts handshake timeouts")
            await wait_until(stalled, "a counts the stalled frame")
            assert a.refusals.value(RefusalReason.HANDSHAKE_TIMEOUT) == 10
            assert a.peer_states()["c"].frames_received == 0
            await wait_until(
                lambda: a.pending_handshakes == 0 and not a.peer_states()["c"].inbound_connected,
                "a holds none of the attacking connections",
            )
            await still_delivers(b, a, b"after the attack")

    asyncio.run(main())


def test_connections_beyond_the_pending_handshake_cap_are_refused_at_once(
    pki: dict[str, MemberTlsFiles],
) -> None:
    async def main() -> None:
        async with group(pki, max_pending_handshakes=4, handshake_timeout_s=5.0) as (
            a,
            b,
            port,
            _,
        ):
            await still_delivers(b, a, b"linked")  # b's own link is authenticated
            counted = refused(a, RefusalReason.TOO_MANY_PENDING)
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(12)]
            await wait_until(
                lambda: a.refusals.value(RefusalReason.TOO_MANY_PENDING) >= 8,
                "a refuses the connections over its cap",
            )
            assert counted()
            for _, writer in idle:
                writer.transport.abort()
            # The idle ones time out or see the hang-up; the port accepts members again.
            await wait_until(lambda: a.pending_handshakes == 0, "pending handshakes drain")
            await still_delivers(b, a, b"after the flood")

    asyncio.run(main())
