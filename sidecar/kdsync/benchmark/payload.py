"""The benchmark's events: fixed-size values that say where and when they came from.

Every value starts with a 12-byte prefix — magic ``KB``, the phase number, the origin's
index and a per-origin sequence number — padded to the event size. The probe recognises
events of its own phase whatever topic or system carried them (MirrorMaker renames topics,
kdsync adds headers), and checks each ``(origin, seq)`` arrives exactly once. Keys are
null and there are no headers, so the value size is the event size.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"KB"
_PREFIX = struct.Struct(">2sBBQ")
PREFIX_BYTES = _PREFIX.size  # 12
MAX_ORIGINS = 255
MAX_PHASE = 255


@dataclass(frozen=True, slots=True)
class EventTag:
    phase: int
    origin: int
    seq: int


def check_event_size(size: int) -> int:
    if size < PREFIX_BYTES:
        raise ValueError(f"event size {size} B: events carry a {PREFIX_BYTES}-byte prefix")
    return size


def padding(size: int) -> bytes:
    """The bytes after the prefix: not all zeros, so nothing compresses them away."""
    pattern = bytes(range(32, 127))
    body = size - PREFIX_BYTES
    return (pattern * (body // len(pattern) + 1))[:body]


def encode(phase: int, origin: int, seq: int, pad: bytes) -> bytes:
    return _PREFIX.pack(MAGIC, phase, origin, seq) + pad


def decode(value: bytes | None) -> EventTag | None:
    """The tag of a benchmark value, or None for anything else (e.g. MM2 heartbeats)."""
    if value is None or len(value) < PREFIX_BYTES or value[:2] != MAGIC:
        return None
    _, phase, origin, seq = _PREFIX.unpack_from(value)
    return EventTag(phase, origin, seq)
