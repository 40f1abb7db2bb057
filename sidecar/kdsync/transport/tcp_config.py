"""What one member's TCP transport needs to know: who it is, where its peers are, limits.

Pure data, checked when built, so a sidecar config can produce it without loading the
transport's asyncio and TLS code (``kdsync.transport.tcp``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kdsync.transport.address import parse_address
from kdsync.transport.base import validate_member_name
from kdsync.transport.framing import ABSOLUTE_MAX_FRAME_BYTES, DEFAULT_MAX_FRAME_BYTES
from kdsync.transport.identity import MemberTlsFiles


@dataclass(frozen=True)
class TcpTransportConfig:
    """Static configuration of one member's TCP transport.

    ``peers`` maps every member of the group (this member may be included; it is
    skipped) to the ``host:port`` it listens on. ``listen`` is the local bind address.
    Exactly one of ``tls`` and ``insecure=True`` must be given.

    ``agreement`` holds the settings every member must share (JSON values: the member
    list, the topic settings); it travels in the handshake, and a peer whose agreement
    differs is refused at connection time with a message naming what differs.

    Inbound limits (the peer port's hardening): a connection must finish the TLS
    handshake and its hello within ``handshake_timeout_s``; at most
    ``max_pending_handshakes`` connections may be doing so at once; a member's frame
    payload must be complete within ``frame_timeout_s`` of its length prefix (checked
    every half timeout; an idle link between frames may stay open: TCP keepalive finds
    dead ones).
    """

    group: str
    member: str
    listen: str
    peers: Mapping[str, str]
    tls: MemberTlsFiles | None = None
    insecure: bool = False
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_queue_frames: int = 10_000
    max_queue_bytes: int = 256 * 1024 * 1024
    max_inbound_bytes: int = 256 * 1024 * 1024
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 5.0
    connect_timeout_s: float = 10.0
    handshake_timeout_s: float = 10.0
    frame_timeout_s: float = 60.0
    max_pending_handshakes: int = 32
    agreement: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_member_name(self.group)
        validate_member_name(self.member)
        for name, address in self.peers.items():
            validate_member_name(name)
            parse_address(address)
        parse_address(self.listen)
        if not self.other_members():
            raise ValueError("a group needs at least one member besides this one")
        if self.insecure == (self.tls is not None):
            raise ValueError("configure exactly one of tls (mutual TLS) or insecure: true")
        if not 0 < self.max_frame_bytes <= ABSOLUTE_MAX_FRAME_BYTES:
            raise ValueError(f"max_frame_bytes must be in 1..{ABSOLUTE_MAX_FRAME_BYTES}")
        if self.max_queue_frames < 1 or self.max_queue_bytes < self.max_frame_bytes:
            raise ValueError("the send queue must hold at least one maximum-size frame")
        if self.max_inbound_bytes < 1:
            raise ValueError("max_inbound_bytes must be positive")
        if self.handshake_timeout_s <= 0 or self.frame_timeout_s <= 0:
            raise ValueError("handshake_timeout_s and frame_timeout_s must be positive")
        if self.max_pending_handshakes < 1:
            raise ValueError("max_pending_handshakes must be at least 1")
        if not 0 < self.backoff_initial_s <= self.backoff_max_s:
            raise ValueError("need 0 < backoff_initial_s <= backoff_max_s")

    def other_members(self) -> list[str]:
        return sorted(name for name in self.peers if name != self.member)
