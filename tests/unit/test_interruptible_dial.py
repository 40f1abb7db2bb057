"""A dial attempt gives way when the peer reaches us first, and never leaks what it got."""

from __future__ import annotations

import asyncio

import pytest

from kdsync.transport.tcp.interruptible import until_woken


async def _never() -> str:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def test_an_attempt_that_ends_first_gives_its_result_or_its_error() -> None:
    async def main() -> None:
        async def dial() -> str:
            return "link"

        async def refused() -> str:
            raise ConnectionRefusedError("refused")

        async def keep(_: str) -> None:
            raise AssertionError("nothing to discard")

        assert await until_woken(dial(), asyncio.Event(), keep) == "link"
        with pytest.raises(ConnectionRefusedError):
            await until_woken(refused(), asyncio.Event(), keep)

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

        async def keep(_: str) -> None:
            raise AssertionError("nothing to discard")

        waiting = asyncio.ensure_future(until_woken(hanging(), wake, keep))
        await asyncio.sleep(0)
        wake.set()
        assert await asyncio.wait_for(waiting, 5) is None
        assert cancelled.is_set()

    asyncio.run(main())


def test_a_result_got_while_the_caller_is_cancelled_is_discarded() -> None:
    """The dial loop cancelled (a connect timeout, or the transport closing) just as the
    connection came up: the connection is released, not left open."""

    async def main() -> None:
        discarded: list[str] = []

        async def dial() -> str:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                return "link"  # it was up by the time the cancellation reached it
            raise AssertionError("unreachable")

        async def discard(link: str) -> None:
            discarded.append(link)

        caller = asyncio.ensure_future(until_woken(dial(), asyncio.Event(), discard))
        await asyncio.sleep(0)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert discarded == ["link"]

    asyncio.run(main())
