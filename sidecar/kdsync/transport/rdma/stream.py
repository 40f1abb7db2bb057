"""The frame stream over one queue pair, without I/O: cutting, credits and reassembly.

A link carries the same length-prefixed frames as TCP (``kdsync.transport.framing``),
as one byte stream cut into messages of at most one receive buffer each. A reliable
connected queue pair delivers messages whole and in order, so the receiver rebuilds
the stream by appending them: a frame larger than a buffer spans several messages, and
small frames share one.

The receiver posts a fixed number of buffers, and a send that finds none posted would
stall the queue pair (receiver-not-ready). So the sender holds one **credit** per
buffer posted for it and spends one per message. The receiver grants a credit back
each time it has copied a message out and posted that buffer again; grants travel on
the link's TLS connection (``GRANT``), which is always open while the queue pair is.

``Outgoing`` is the sender's side, ``FrameAssembler`` the receiver's; both are plain
objects the transport drives (and the unit tests drive directly).
"""

from __future__ import annotations

import struct
from collections import deque

from kdsync.transport.framing import HEADER_BYTES, LENGTH_PREFIX, check_frame_size

# A credit grant on the TLS connection: how many buffers were posted again.
GRANT = struct.Struct(">I")


class Outgoing:
    """Encoded frames waiting to go out, cut into messages as credits allow.

    ``credits`` is how many messages the receiver can take now; ``free_slots`` which of
    this side's registered send buffers are not in flight. ``next_message`` returns the
    bytes of the next message (at most ``message_bytes``) and the slot to send it from,
    or None when there is nothing to send, no credit or no free slot."""

    def __init__(self, message_bytes: int, slots: int, credits: int) -> None:
        if message_bytes <= HEADER_BYTES:
            raise ValueError("a message must hold more than a length prefix")
        self.message_bytes = message_bytes
        self.credits = credits
        self.free_slots: deque[int] = deque(range(slots))
        self._pending: deque[memoryview] = deque()
        self.pending_bytes = 0

    def add_frames(self, payloads: list[bytes]) -> None:
        for payload in payloads:
            self._pending.append(memoryview(LENGTH_PREFIX.pack(len(payload))))
            if payload:
                self._pending.append(memoryview(payload))
            self.pending_bytes += HEADER_BYTES + len(payload)

    def grant(self, credits: int) -> None:
        self.credits += credits

    def sent(self, slot: int) -> None:
        """The message sent from ``slot`` completed: the slot may be used again."""
        self.free_slots.append(slot)

    def next_message(self) -> tuple[int, bytes] | None:
        if not self._pending or self.credits <= 0 or not self.free_slots:
            return None
        parts: list[memoryview] = []
        room = self.message_bytes
        while self._pending and room:
            head = self._pending[0]
            if len(head) <= room:
                parts.append(self._pending.popleft())
                room -= len(head)
            else:
                parts.append(head[:room])
                self._pending[0] = head[room:]
                room = 0
        message = b"".join(parts)
        self.pending_bytes -= len(message)
        self.credits -= 1
        return self.free_slots.popleft(), message


class FrameAssembler:
    """Rebuilds frames from the messages of one link, in order.

    ``feed`` returns the frames a message completes. A length prefix over
    ``max_frame_bytes`` raises FrameTooLarge before anything of that frame is kept, as
    on TCP. ``partial`` says whether a frame has begun and not ended (for the
    transport's frame timeout)."""

    def __init__(self, max_frame_bytes: int) -> None:
        self._max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._need: int | None = None  # the current frame's payload length, once known

    @property
    def partial(self) -> bool:
        return bool(self._buffer) or self._need is not None

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def feed(self, message: bytes) -> list[bytes]:
        self._buffer += message
        frames: list[bytes] = []
        buffer = self._buffer
        start = 0
        while True:
            if self._need is None:
                if len(buffer) - start < HEADER_BYTES:
                    break
                (size,) = LENGTH_PREFIX.unpack_from(buffer, start)
                check_frame_size(size, self._max_frame_bytes)
                self._need = size
                start += HEADER_BYTES
            if len(buffer) - start < self._need:
                break
            frames.append(bytes(buffer[start : start + self._need]))
            start += self._need
            self._need = None
        del buffer[:start]
        return frames
