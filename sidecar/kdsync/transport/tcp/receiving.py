"""The receiving side of a peer link: frames read until the link ends, each frame's
payload within ``frame_timeout_s`` of its length prefix; and the close of a link the other
end only listens on."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from kdsync.transport.base import FrameTimeout, ReceivedFrame
from kdsync.transport.framing import HEADER_BYTES, frame_size
from kdsync.transport.tcp.flow import InboundBuffer
from kdsync.transport.tcp.handshake import HandshakeError
from kdsync.transport.tcp.peer import Peer


async def receive_frames(
    peer: Peer,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    inbound: InboundBuffer,
    *,
    max_frame_bytes: int,
    frame_timeout_s: float,
) -> None:
    """Put ``peer``'s frames into ``inbound`` until the link ends (a clean close between
    frames returns; anything else raises)."""
    # An idle link may wait for a frame indefinitely; once a frame's length prefix
    # arrived, its payload must arrive within frame_timeout_s, else a trickling
    # sender holds the link. (A stalled prefix holds at most 3 bytes, no more than
    # an idle link.) A watchdog checks twice per timeout: a per-frame
    # asyncio.timeout cost ~40% of small-frame throughput in hack/bench-transport.
    clock = _FrameClock()
    watchdog = asyncio.create_task(
        _watch_frame_progress(clock, writer, frame_timeout_s),
        name=f"kdsync-frame-watch-{peer.name}",
    )
    loop = asyncio.get_running_loop()
    try:
        while True:
            try:
                size = frame_size(await reader.readexactly(HEADER_BYTES), max_frame_bytes)
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    return  # clean close between frames
                raise
            payload = b""
            if size:
                clock.started_at = loop.time()
                try:
                    payload = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, OSError):
                    if clock.stalled:
                        raise frame_timeout(peer.name, frame_timeout_s) from None
                    raise
                clock.started_at = None
            peer.frames_received += 1
            peer.bytes_received += len(payload)
            await inbound.put(ReceivedFrame(peer.name, payload))
    finally:
        watchdog.cancel()
        await asyncio.gather(watchdog, return_exceptions=True)


def frame_timeout(member: str, frame_timeout_s: float) -> FrameTimeout:
    return FrameTimeout(
        f"member {member} started a frame and did not finish it within {frame_timeout_s:g} s"
    )


async def _watch_frame_progress(
    clock: _FrameClock, writer: asyncio.StreamWriter, limit: float
) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(limit / 2)
        started = clock.started_at
        if started is not None and loop.time() - started > limit:
            clock.stalled = True
            writer.transport.abort()  # the receiver's read ends; it reports the timeout
            return


@dataclass
class _FrameClock:
    """When the frame being read began (loop time; None between frames)."""

    started_at: float | None = None
    stalled: bool = False


async def watch_for_close(reader: asyncio.StreamReader, link: str = "a send-only link") -> None:
    """Return-by-raising when the other end closes a connection it sends nothing more on:
    the listener of an outbound link (after ``welcome``), or the dialer of an RDMA link's
    control connection (after its setup). Any data is a protocol error."""
    data = await reader.read(HEADER_BYTES)
    if data:
        raise HandshakeError(f"peer sent data on {link}")
    raise ConnectionResetError("peer closed the connection")
