"""``Peer``: what one member's transport keeps about each other member's links."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from kdsync.transport.base import LinkStatus, PeerState
from kdsync.transport.tcp.backoff import ExponentialBackoff
from kdsync.transport.tcp.flow import SendQueue


@dataclass
class Peer:
    """Mutable per-peer bookkeeping; ``PeerState`` is its public snapshot. (Shared with
    ``RdmaTransport``, which moves the same queues and counters over queue pairs.)"""

    name: str
    address: str
    host: str
    port: int
    queue: SendQueue
    backoff: ExponentialBackoff
    status: LinkStatus = LinkStatus.CONNECTING
    last_error: str | None = None
    last_error_at: float | None = None
    logged_error: str | None = None
    connected_since: float | None = None
    next_attempt_at: float | None = None
    connect_attempts: int = 0
    frames_sent: int = 0
    bytes_sent: int = 0
    frames_dropped: int = 0
    frames_received: int = 0
    bytes_received: int = 0
    inbound_task: asyncio.Task[Any] | None = field(default=None, repr=False)
    dial_task: asyncio.Task[None] | None = field(default=None, repr=False)
    retired: bool = False  # left the group: no longer dialled, frames for it dropped
    # Set when the peer reached us while our link to it waits out a backoff or for its
    # TCP handshake (``connect_phase``): it is up, so dial it now.
    wake: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    # The dial loop whose dial waits for its TCP handshake (not for DNS), if one does.
    awaiting_tcp: asyncio.Task[Any] | None = field(default=None, repr=False)

    def snapshot(self) -> PeerState:
        return PeerState(
            peer=self.name,
            address=self.address,
            outbound=LinkStatus.RETIRED if self.retired else self.status,
            inbound_connected=self.inbound_task is not None,
            last_error=self.last_error,
            last_error_at=self.last_error_at,
            connected_since=self.connected_since,
            next_attempt_at=self.next_attempt_at,
            connect_attempts=self.connect_attempts,
            queued_frames=len(self.queue.frames),
            queued_bytes=self.queue.bytes,
            frames_sent=self.frames_sent,
            bytes_sent=self.bytes_sent,
            frames_dropped=self.frames_dropped,
            frames_received=self.frames_received,
            bytes_received=self.bytes_received,
        )
