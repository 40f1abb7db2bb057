"""The peer-transport interface that the ordering group runs on.

The ordering core is sans-I/O and tolerates loss, duplication and reordering of
messages, so a transport is allowed to drop frames (peer down, queue full) but must
never block the caller indefinitely and must keep memory bounded. It moves opaque
frames (``bytes``) between the configured members of one group and tags every
received frame with the *authenticated* name of the member that sent it.

TCP (``kdsync.transport.tcp.TcpTransport``) implements it, and RDMA
(``kdsync.transport.rdma.RdmaTransport``) on top of TCP's authenticated links.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

# Member names end up inside certificate URIs and log lines, so keep them to a
# conservative, unambiguous alphabet (covers Kubernetes DNS-1123 names).
MEMBER_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def validate_member_name(name: str) -> str:
    """Return ``name`` if it is usable as a group or member name, else raise ValueError."""
    if not MEMBER_NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"invalid group/member name {name!r}: use 1-63 characters from "
            "[A-Za-z0-9._-], starting with a letter or digit"
        )
    return name


class TransportError(Exception):
    """Base class for transport errors."""


class TransportClosed(TransportError):
    """The transport was closed; no more frames will be received."""


class FrameTooLarge(TransportError, ValueError):
    """A frame exceeds the configured maximum frame size."""


class FrameTimeout(TransportError):
    """A peer started a frame and did not finish it in time (a stalled or slowloris link)."""


class PeerAuthenticationError(TransportError):
    """A peer could not prove it is the member it must be."""


class LinkStatus(enum.StrEnum):
    """State of the outbound link to one peer (this member's sends to it)."""

    CONNECTING = "connecting"  # dialling, TLS handshake or hello in progress
    CONNECTED = "connected"  # handshake done; queued frames are being written
    BACKOFF = "backoff"  # last attempt failed or the link dropped; waiting to retry
    CLOSED = "closed"  # the transport was closed
    RETIRED = "retired"  # the peer left the group: no longer dialled


@dataclass(frozen=True, slots=True)
class PeerState:
    """A snapshot of one peer's links and counters, for metrics and ``kdsync status``.

    Times are wall-clock seconds (``time.time()``). Counters are cumulative since start.
    """

    peer: str
    address: str
    outbound: LinkStatus
    inbound_connected: bool
    last_error: str | None
    last_error_at: float | None
    connected_since: float | None
    next_attempt_at: float | None
    connect_attempts: int
    queued_frames: int
    queued_bytes: int
    frames_sent: int
    bytes_sent: int
    frames_dropped: int
    frames_received: int
    bytes_received: int


class ReceivedFrame(NamedTuple):
    """A frame as delivered to the caller: the authenticated sender and the payload."""

    peer: str
    payload: bytes


# (member, where it listens, its configuration index) -> whether it is linked now: what
# a transport asks of ``PeerTransport.introduce``.
Introduce = Callable[[str, str, int], bool]


class PeerTransport(Protocol):
    """What the ordering group needs from a transport.

    Lifecycle: ``await start()`` once, then ``send``/``receive`` freely, then
    ``await close()``. ``send`` may be called before ``start``; frames wait in the
    (bounded) per-peer queue.
    """

    @property
    def member(self) -> str:
        """This member's own name."""
        ...

    @property
    def peers(self) -> tuple[str, ...]:
        """The other members of the group, in a stable order."""
        ...

    async def start(self) -> None:
        """Start listening and connecting to peers; returns once the listener is bound."""
        ...

    def send(self, peer: str, frame: bytes) -> bool:
        """Enqueue ``frame`` for ``peer`` without blocking.

        Returns False if the frame was dropped (queue full or transport closed).
        Raises ValueError for an unknown peer and FrameTooLarge for an oversized frame,
        since both are bugs in the caller rather than network conditions.
        """
        ...

    async def receive(self) -> ReceivedFrame:
        """Wait for the next frame from any peer; raises TransportClosed after close()."""
        ...

    def peer_states(self) -> dict[str, PeerState]:
        """A snapshot of every peer's link state and counters, keyed by peer name."""
        ...

    def retire_peer(self, peer: str) -> bool:
        """Stop dialling ``peer`` (removed from the group) and drop what is queued for it;
        frames sent to it later are dropped. True the first time."""
        ...

    def add_peer(self, peer: str, address: str) -> bool:
        """Reach ``peer`` at ``address`` from now on and accept its connections (a member
        added at runtime; a retired one may come back; a known one may have moved). True
        unless it is reached at that address already; raises ValueError for a bad name
        or address."""
        ...

    membership_changed: bool
    """Set once this member's membership comes from its log: the peer handshake then
    no longer compares the startup files' member lists."""

    advertised_address: str | None
    """Where the log says this member listens (``kdsync members add --peer``), which its
    hello gives when its membership changed; None: its startup file's own entry."""

    introduce: Introduce | None
    """Told, before the welcome, of a member that dials us saying its membership comes
    from its log, where it listens and where its configuration stands in its log; it may
    link that member (one added while our log is behind, even one we retired) or keep
    it from being retired. True if it is linked now (``PeerLinks.heard_from``)."""

    config_index: int
    """Where this member's configuration stands in its log (0: its startup file's), which
    its hello gives with ``membershipChanged``."""

    @property
    def rejected_connections(self) -> int:
        """Inbound connections refused before they became a peer link (failed TLS
        handshake, no or a malformed hello, not a member, configuration mismatch, handshake
        too slow, too many pending), since start."""
        ...

    async def close(self) -> None:
        """Stop all tasks and close all connections; idempotent."""
        ...
