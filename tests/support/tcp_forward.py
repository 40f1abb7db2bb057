"""Forward local TCP ports to another host (tests that run in the RDMA guest reach the
host's Kafka brokers this way: the brokers advertise 127.0.0.1:<port>, and in the guest
that port leads to the host's loopback at 10.0.2.2)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Sequence


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _serve(ports: Sequence[int], host: str, ready: threading.Event) -> None:
    async def forward(
        port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    servers = [
        await asyncio.start_server(
            lambda r, w, p=port: forward(p, r, w), "127.0.0.1", port, reuse_address=True
        )
        for port in ports
    ]
    ready.set()
    await asyncio.gather(*(server.serve_forever() for server in servers))


@contextlib.contextmanager
def forwarded(ports: Sequence[int], host: str) -> Iterator[None]:
    """127.0.0.1:<port> -> <host>:<port> for each port, while the block runs."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    task: list[asyncio.Task[None]] = []

    def run() -> None:
        task.append(loop.create_task(_serve(ports, host, ready)))
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task[0])

    thread = threading.Thread(target=run, name="tcp-forward", daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError(f"could not listen on 127.0.0.1 ports {list(ports)}")
    try:
        yield
    finally:
        loop.call_soon_threadsafe(task[0].cancel)
        thread.join(10)
        loop.close()
