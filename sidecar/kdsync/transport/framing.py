"""Length-prefixed frames: a 4-byte big-endian payload length, then the payload.

Readers check the length against a maximum *before* reading the payload, so a peer
that sends garbage or a huge length prefix costs at most ``max_frame_bytes`` of memory
and gets its connection closed.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Protocol

from kdsync.transport.base import FrameTooLarge

LENGTH_PREFIX = struct.Struct(">I")
HEADER_BYTES = LENGTH_PREFIX.size
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
# The 4-byte prefix cannot express more than this, whatever the configuration says.
ABSOLUTE_MAX_FRAME_BYTES = 2**32 - 1

# Small frames are coalesced into one write (fewer TLS records and syscalls);
# bigger ones are written as-is to avoid copying them.
_COALESCE_LIMIT = 64 * 1024


class FrameReader(Protocol):
    """What ``read_frame`` reads from: ``asyncio.StreamReader`` is one."""

    async def readexactly(self, n: int, /) -> bytes: ...


def check_frame_size(size: int, max_frame_bytes: int) -> None:
    """Raise FrameTooLarge if a payload of ``size`` bytes may not be sent or received."""
    if size > max_frame_bytes or size > ABSOLUTE_MAX_FRAME_BYTES:
        raise FrameTooLarge(f"frame of {size} bytes exceeds the maximum of {max_frame_bytes}")


def encode_frame(payload: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """Return the prefix and payload as one ``bytes`` (copies the payload)."""
    check_frame_size(len(payload), max_frame_bytes)
    return LENGTH_PREFIX.pack(len(payload)) + payload


def encode_frames(payloads: Iterable[bytes]) -> list[bytes]:
    """Encode frames into a list of buffers to write in order.

    Small frames are joined together; large payloads are passed through uncopied.
    Sizes must already have been checked by the caller.
    """
    buffers: list[bytes] = []
    pending: list[bytes] = []
    pending_bytes = 0
    for payload in payloads:
        prefix = LENGTH_PREFIX.pack(len(payload))
        if len(payload) >= _COALESCE_LIMIT:
            pending.append(prefix)
            buffers.append(b"".join(pending))
            buffers.append(payload)
            pending = []
            pending_bytes = 0
            continue
        pending.append(prefix)
        pending.append(payload)
        pending_bytes += HEADER_BYTES + len(payload)
        if pending_bytes >= _COALESCE_LIMIT:
            buffers.append(b"".join(pending))
            pending = []
            pending_bytes = 0
    if pending:
        buffers.append(b"".join(pending))
    return buffers


def frame_size(prefix: bytes, max_frame_bytes: int) -> int:
    """The payload length a prefix announces; FrameTooLarge if over the maximum."""
    (size,) = LENGTH_PREFIX.unpack(prefix)
    check_frame_size(size, max_frame_bytes)
    return int(size)


async def read_frame(reader: FrameReader, max_frame_bytes: int) -> bytes:
    """Read one frame.

    Raises FrameTooLarge if the announced length exceeds ``max_frame_bytes`` (before any
    of the payload is buffered) and ``asyncio.IncompleteReadError`` on end of stream
    (``partial`` is empty when the stream ended cleanly between frames).
    """
    size = frame_size(await reader.readexactly(HEADER_BYTES), max_frame_bytes)
    if size == 0:
        return b""
    return await reader.readexactly(size)
