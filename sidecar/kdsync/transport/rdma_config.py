"""What one member's RDMA links need to know: the device, and the buffers they register.

Pure data, checked when built, like ``tcp_config``: the sidecar config produces it
without loading pyverbs (``kdsync.transport.rdma``).
"""

from __future__ import annotations

from dataclasses import dataclass

# Each link's messages are at most one buffer; a frame larger than that is split.
DEFAULT_BUFFER_BYTES = 64 * 1024


@dataclass(frozen=True)
class RdmaSettings:
    """``device`` None means the host's only RDMA device; ``gid_index`` None the first
    IPv4-mapped GID of ``port`` (RoCE v2). With ``fallback_to_tcp`` a member that finds
    no usable device runs on TCP and says so (log, ``/status``, metrics) instead of
    failing to start.

    Registered (locked) memory: every inbound link posts ``receive_buffers`` buffers and
    every outbound link has ``send_buffers``, each ``buffer_bytes`` long, so a member
    with P peers locks ``pinned_bytes(P)``; the container's RLIMIT_MEMLOCK (or the
    IPC_LOCK capability) must allow it."""

    device: str | None = None
    port: int = 1
    gid_index: int | None = None
    fallback_to_tcp: bool = False
    buffer_bytes: int = DEFAULT_BUFFER_BYTES
    receive_buffers: int = 16
    send_buffers: int = 8

    def __post_init__(self) -> None:
        if self.port < 1:
            raise ValueError("the RDMA port number starts at 1")
        if self.gid_index is not None and self.gid_index < 0:
            raise ValueError("the GID index must not be negative")
        if not 4096 <= self.buffer_bytes <= 16 * 1024 * 1024:
            raise ValueError("RDMA buffers must be 4 KiB to 16 MiB")
        if not 2 <= self.receive_buffers <= 1024 or not 1 <= self.send_buffers <= 1024:
            raise ValueError("use 2-1024 receive buffers and 1-1024 send buffers per link")

    def pinned_bytes(self, peers: int) -> int:
        """Memory a member with ``peers`` peers registers for its links."""
        return peers * (self.receive_buffers + self.send_buffers) * self.buffer_bytes
