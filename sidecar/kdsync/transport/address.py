"""Peer and listen addresses: ``host:port``, or ``[v6addr]:port`` for IPv6.

Dependency-free, so configuration checks and the operator can parse addresses without
loading the transport's asyncio and TLS code.
"""

from __future__ import annotations


def parse_address(address: str) -> tuple[str, int]:
    """Split ``host:port`` (or ``[v6addr]:port``) into host and port."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"peer address {address!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"peer address {address!r} has an invalid port")
    return host, port
