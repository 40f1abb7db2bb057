"""Flow control between the transport's caller and its connections.

Sending never blocks: ``send`` appends to a per-peer queue bounded in frames and bytes
and returns False (frame dropped) when the queue is full; the ordering protocol
tolerates loss. Frames queued while a peer is down are sent once it is back.
Receiving applies backpressure instead: when the caller does not keep up with
``receive``, the inbound buffer fills, readers stop reading, and TCP flow control
pushes back until the senders' queues fill and drop.
"""

from __future__ import annotations

import asyncio
from collections import deque

from kdsync.transport.base import ReceivedFrame, TransportClosed


class SendQueue:
    """Frames waiting to go to one peer, bounded by count and by bytes."""

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.frames: deque[bytes] = deque()
        self.bytes = 0
        self._not_empty = asyncio.Event()

    def put(self, frame: bytes) -> bool:
        if len(self.frames) >= self.max_frames or self.bytes + len(frame) > self.max_bytes:
            return False
        self.frames.append(frame)
        self.bytes += len(frame)
        self._not_empty.set()
        return True

    async def take_batch(self, max_bytes: int) -> list[bytes]:
        """Wait for frames, then take at least one and at most about ``max_bytes``."""
        while not self.frames:
            self._not_empty.clear()
            await self._not_empty.wait()
        batch: list[bytes] = []
        taken = 0
        while self.frames and (not batch or taken + len(self.frames[0]) <= max_bytes):
            frame = self.frames.popleft()
            batch.append(frame)
            taken += len(frame)
        self.bytes -= taken
        return batch


class InboundBuffer:
    """Received frames waiting for ``receive()``, bounded by bytes.

    A put waits while the buffer is full, which stops that connection's reads. One
    frame is always admitted into an empty buffer, so a frame larger than the bound
    still gets through.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.frames: deque[ReceivedFrame] = deque()
        self.bytes = 0
        self.closed = False
        self._not_empty = asyncio.Event()
        self._has_room = asyncio.Event()

    async def put(self, frame: ReceivedFrame) -> None:
        while self.frames and self.bytes + len(frame.payload) > self.max_bytes:
            if self.closed:
                return
            self._has_room.clear()
            await self._has_room.wait()
        if self.closed:
            return
        self.frames.append(frame)
        self.bytes += len(frame.payload)
        self._not_empty.set()

    async def get(self) -> ReceivedFrame:
        while not self.frames:
            if self.closed:
                raise TransportClosed("transport closed")
            self._not_empty.clear()
            await self._not_empty.wait()
        if self.closed:
            raise TransportClosed("transport closed")
        frame = self.frames.popleft()
        self.bytes -= len(frame.payload)
        self._has_room.set()
        return frame

    def close(self) -> None:
        self.closed = True
        self.frames.clear()
        self.bytes = 0
        self._not_empty.set()
        self._has_room.set()
