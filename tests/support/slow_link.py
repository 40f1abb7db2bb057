"""A loopback TCP relay that delays every byte by a fixed one-way latency, in both
directions: a WAN link between two members on one machine. It accepts a connection at
once and connects onward at once, so only what travels over it is slow (as behind a
load balancer or proxy); tests of dial races across slow links use it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


async def _carry(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, latency_s: float
) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``latency_s`` after it was read; the
    end of the stream arrives late too."""
    loop = asyncio.get_running_loop()
    in_flight: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, chunk = await in_flight.get()
            # The wire's latency itself, not a wait for something to happen.
            await asyncio.sleep(max(0.0, due - loop.time()))
            if not chunk:
                writer.close()
                return
            writer.write(chunk)
            await writer.drain()

    delivering = asyncio.create_task(deliver())
    try:
        with contextlib.suppress(OSError):
            while chunk := await reader.read(65536):
                in_flight.put_nowait((loop.time() + latency_s, chunk))
        in_flight.put_nowait((loop.time() + latency_s, b""))
        with contextlib.suppress(OSError):
            await delivering
    finally:
        delivering.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await delivering
        writer.close()


@contextlib.asynccontextmanager
async def slow_link(target_port: int, latency_s: float) -> AsyncIterator[int]:
    """A port on 127.0.0.1 that leads to 127.0.0.1:``target_port`` with ``latency_s``
    each way, while the block runs."""
    carriers: set[asyncio.Task[None]] = set()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        this = asyncio.current_task()
        assert this is not None
        carriers.add(this)  # the block's end cancels a relay still connecting onward
        this.add_done_callback(carriers.discard)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", target_port
            )
        except (OSError, asyncio.CancelledError):
            # Ending quietly even when cancelled: on 3.11 asyncio logs an error for a
            # connection callback's task that ends cancelled.
            writer.close()
            return
        for task in (
            asyncio.create_task(_carry(reader, upstream_writer, latency_s)),
            asyncio.create_task(_carry(upstream_reader, writer, latency_s)),
        ):
            carriers.add(task)
            task.add_done_callback(carriers.discard)

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        for task in list(carriers):
            task.cancel()
        await asyncio.gather(*carriers, return_exceptions=True)
        await server.wait_closed()
