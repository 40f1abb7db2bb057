"""An attempt that gives way when an event says a fresh one would do better.

A dial to a peer can hang on an address the peer no longer has: a restarted pod's old IP
answers nothing, and the dial waits out its whole connect timeout (10 s by default)
while the peer, up again at a new address, already reached us. Its connection wakes the
dial loop, which then abandons the hanging attempt and dials afresh.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def until_woken(
    attempt: Coroutine[Any, Any, T],
    wake: asyncio.Event,
    discard: Callable[[T], Awaitable[None]],
) -> T | None:
    """``attempt``'s result, or None when ``wake`` is set first (the attempt is then
    cancelled, and how it ended no longer matters). An attempt that ends first by raising
    raises here. If this call is cancelled, so is the attempt, and a result it had already
    is released with ``discard`` (e.g. a connection closed)."""
    trying = asyncio.ensure_future(attempt)
    trying.add_done_callback(_observe)  # however this call ends, no error goes unread
    woken = asyncio.ensure_future(wake.wait())
    abandoned = True
    try:
        await asyncio.wait({trying, woken}, return_when=asyncio.FIRST_COMPLETED)
        if trying.done():
            abandoned = False
            return trying.result()
        trying.cancel()
        await asyncio.wait({trying})
        abandoned = False
        return trying.result() if _succeeded(trying) else None
    finally:
        woken.cancel()
        if abandoned:  # this call was cancelled
            trying.cancel()
            await asyncio.wait({trying})
            if _succeeded(trying):
                await discard(trying.result())
        await asyncio.wait({woken})


def _succeeded(task: asyncio.Future[Any]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None


def _observe(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
