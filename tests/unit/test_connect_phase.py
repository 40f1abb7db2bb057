"""A dial's TCP connect: it tries a name's addresses in order, gives way when the peer
reaches us first, and never leaks a socket."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator, Sequence

import pytest

from kdsync.transport.tcp.connect_phase import (
    AddressInfo,
    open_socket,
    system_resolver,
    until_woken,
)


async def _never() -> str:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def _nothing_to_discard(_: str) -> None:
    raise AssertionError("nothing to discard")


def test_an_attempt_that_ends_first_gives_its_result_or_its_error() -> None:
    async def main() -> None:
        async def dial() -> str:
            return "link"

        async def refused() -> str:
            raise ConnectionRefusedError("refused")

        assert await until_woken(dial(), asyncio.Event(), _nothing_to_discard) == "link"
        with pytest.raises(ConnectionRefusedError):
            await until_woken(refused(), asyncio.Event(), _nothing_to_discard)

    asyncio.run(main())


def test_a_wake_abandons_a_hanging_attempt() -> None:
    async def main() -> None:
        wake = asyncio.Event()
        cancelled = asyncio.Event()

        async def hanging() -> str:
            try:
                return await _never()
            except asyncio.CancelledError:
                cancelled.set()
                raise

        attempt = until_woken(hanging(), wake, _nothing_to_discard)
        waiting = asyncio.ensure_future(attempt)
        await asyncio.sleep(0)
        wake.set()
        assert await asyncio.wait_for(waiting, 5) is None
        assert cancelled.is_set()

    asyncio.run(main())


def test_a_woken_attempt_still_gets_its_patience() -> None:
    """The peer reached us a moment after our dial began: the dial's handshake keeps
    its time (a SYN resent after 1 s gets through), and one that takes longer gives
    way."""

    async def main() -> None:
        wake = asyncio.Event()
        wake.set()
        answered = asyncio.Event()

        async def dial() -> str:
            await answered.wait()
            return "link"

        attempt = until_woken(dial(), wake, _nothing_to_discard, patience_s=60.0)
        waiting = asyncio.ensure_future(attempt)
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done()
        answered.set()
        assert await asyncio.wait_for(waiting, 5) == "link"

        assert await until_woken(_never(), wake, _nothing_to_discard, patience_s=0.01) is None

    asyncio.run(main())


@pytest.mark.parametrize("turns", range(8))
def test_a_result_is_never_lost_however_late_the_caller_is_cancelled(turns: int) -> None:
    """The dial loop cancelled (a connect timeout, the transport closing) some loop
    turns after the socket connected: the caller either has the socket or it is
    released, never neither."""

    async def main() -> None:
        discarded: list[str] = []
        connected = asyncio.Event()

        async def dial() -> str:
            await connected.wait()
            return "link"

        attempt = until_woken(dial(), asyncio.Event(), discarded.append)
        caller = asyncio.ensure_future(attempt)
        await asyncio.sleep(0)
        connected.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        caller.cancel()
        got: list[str | None] = []
        with contextlib.suppress(asyncio.CancelledError):
            got.append(await caller)
        assert [*got, *discarded] == ["link"]

    asyncio.run(main())


def test_an_address_is_taken_as_it_is_and_a_name_is_looked_up() -> None:
    async def main() -> None:
        assert await system_resolver("127.0.0.1", 7) == [
            (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", 7))
        ]
        assert await system_resolver("::1", 7) == [
            (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("::1", 7, 0, 0))
        ]
        found = await system_resolver("localhost", 7)
        assert found and all(info[4][1] == 7 for info in found)

    asyncio.run(main())


def test_a_result_got_while_the_caller_is_cancelled_is_discarded() -> None:
    """The dial loop cancelled (a connect timeout, or the transport closing) just as the
    connection came up: the socket is released, not left open."""

    async def main() -> None:
        discarded: list[str] = []

        async def dial() -> str:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                return "link"  # it was up by the time the cancellation reached it
            raise AssertionError("unreachable")

        attempt = until_woken(dial(), asyncio.Event(), discarded.append)
        caller = asyncio.ensure_future(attempt)
        await asyncio.sleep(0)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert discarded == ["link"]

    asyncio.run(main())


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock
    sock.close()


def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _addresses(*ports: int) -> Sequence[AddressInfo]:
    return [
        (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", p))
        for p in ports
    ]


def test_the_first_address_that_answers_is_connected(listener: socket.socket) -> None:
    refused, answering = _closed_port(), int(listener.getsockname()[1])

    async def main() -> None:
        sock = await open_socket("peer.test", _addresses(refused, answering))
        try:
            assert sock.getpeername() == ("127.0.0.1", answering)
            assert not sock.getblocking()
        finally:
            sock.close()

    asyncio.run(main())


def test_a_failure_names_its_cause_and_every_address() -> None:
    first, second = _closed_port(), _closed_port()

    async def main() -> None:
        with pytest.raises(ConnectionRefusedError):
            await open_socket("peer.test", _addresses(first))
        with pytest.raises(OSError, match=r"every address of peer\.test failed") as failed:
            await open_socket("peer.test", _addresses(first, second))
        assert str(first) in str(failed.value) and str(second) in str(failed.value)
        with pytest.raises(OSError, match=r"peer\.test resolved to no address"):
            await open_socket("peer.test", _addresses())

    asyncio.run(main())
