"""Peer transports for the ordering group: the interface and the TCP implementation."""

from kdsync.transport.base import (
    FrameTooLarge,
    LinkStatus,
    PeerAuthenticationError,
    PeerState,
    PeerTransport,
    ReceivedFrame,
    TransportClosed,
    TransportError,
)
from kdsync.transport.tcp import ExponentialBackoff, TcpTransport, TcpTransportConfig
from kdsync.transport.tls import MemberTlsFiles

__all__ = [
    "ExponentialBackoff",
    "FrameTooLarge",
    "LinkStatus",
    "MemberTlsFiles",
    "PeerAuthenticationError",
    "PeerState",
    "PeerTransport",
    "ReceivedFrame",
    "TcpTransport",
    "TcpTransportConfig",
    "TransportClosed",
    "TransportError",
]
