"""The socket under a peer link: buffer limits, dead-peer detection, closing, errors."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from kdsync.transport.base import TransportError

# StreamReader buffer limit: large enough that big frames do not pause and resume the
# socket every 128 KiB.
STREAM_LIMIT = 1024 * 1024
# How long closing a stream may take (TLS close_notify) before it is aborted.
CLOSE_TIMEOUT = 1.0
# Detect peers that vanished without a FIN (host down, network cut): keepalive on idle
# links, and a bound on unacknowledged data on busy ones (else ~15 min of retries).
_KEEPALIVE_IDLE_S = 10
_KEEPALIVE_INTERVAL_S = 5
_KEEPALIVE_PROBES = 3
_TCP_USER_TIMEOUT_MS = 30_000

# Failures that networks and misbehaving peers cause; anything else is a bug and is
# logged with its traceback.
EXPECTED_LINK_ERRORS = (OSError, TimeoutError, TransportError, asyncio.IncompleteReadError)


def describe(exc: BaseException) -> str:
    """One line naming a link failure, for the log and ``PeerState.last_error``."""
    text = str(exc)
    if isinstance(exc, TimeoutError) and not text:
        text = "timed out"
    if isinstance(exc, asyncio.IncompleteReadError):
        text = "connection closed by peer" + (" mid-frame" if exc.partial else "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def detect_dead_peers(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        # Linux-specific knobs; elsewhere the system defaults (hours) apply.
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, _KEEPALIVE_IDLE_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, _KEEPALIVE_INTERVAL_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, _KEEPALIVE_PROBES)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, _TCP_USER_TIMEOUT_MS)


async def close_writer(writer: asyncio.StreamWriter) -> None:
    """Close a stream, giving TLS a moment for close_notify, then abort if it hangs."""
    writer.close()
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT):
            await writer.wait_closed()
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        writer.transport.abort()
