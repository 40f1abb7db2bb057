"""Peer transports for the ordering group: the interface, addresses, identities, settings.

Importing this package loads no asyncio and no ``ssl``: the TCP implementation lives in
``kdsync.transport.tcp`` (``TcpTransport``), and RDMA, which runs on TCP's authenticated
links, in ``kdsync.transport.rdma`` (``RdmaTransport``); import them from there.
"""

from kdsync.transport.address import parse_address
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
from kdsync.transport.identity import MemberTlsFiles
from kdsync.transport.tcp_config import TcpTransportConfig

__all__ = [
    "FrameTooLarge",
    "LinkStatus",
    "MemberTlsFiles",
    "PeerAuthenticationError",
    "PeerState",
    "PeerTransport",
    "ReceivedFrame",
    "TcpTransportConfig",
    "TransportClosed",
    "TransportError",
    "parse_address",
]
