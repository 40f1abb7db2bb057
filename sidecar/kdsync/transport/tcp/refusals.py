"""Why this member refused or closed an inbound peer connection, counted for Prometheus.

``kdsync_peer_connections_refused_total{reason}`` counts every inbound connection the
port ended because of the other side: a failed TLS handshake (garbage, no or a foreign
certificate), a stranger, a malformed hello, a handshake or a frame that took too long
(slowloris), an oversized length prefix, too many connections still authenticating.
The counter lives in the registry the transport is given (the sidecar passes the one
its ``/metrics`` serves); without one the transport keeps a private registry.
"""

from __future__ import annotations

import asyncio
import enum
import ssl

from prometheus_client import CollectorRegistry, Counter

from kdsync.transport.base import FrameTooLarge, PeerAuthenticationError
from kdsync.transport.tcp.handshake import HandshakeError, PeerConfigMismatch


class RefusalReason(enum.StrEnum):
    TLS_HANDSHAKE = "tls_handshake"  # garbage before TLS, no/invalid client certificate
    NOT_A_MEMBER = "not_a_member"  # certificate or hello names no other member of the group
    BAD_HELLO = "bad_hello"  # not a hello (invalid TLS-protected bytes, JSON, version, group)
    CONFIG_MISMATCH = "config_mismatch"  # a member whose group settings differ
    HANDSHAKE_TIMEOUT = "handshake_timeout"  # TLS + hello not done within the timeout
    CLOSED_IN_HANDSHAKE = "closed_in_handshake"  # the other side hung up first
    TOO_MANY_PENDING = "too_many_pending"  # over max_pending_handshakes at once
    FRAME_TOO_LARGE = "frame_too_large"  # a length prefix above max_frame_bytes
    FRAME_TIMEOUT = "frame_timeout"  # a started frame not completed within frame_timeout_s


class RefusalCounter:
    """The counter, with every reason present (at 0) from the start."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.counter = Counter(
            "kdsync_peer_connections_refused",
            "Inbound peer connections this member refused or closed, by reason (see "
            "docs/sidecar.md, 'Peer port hardening')",
            ["reason"],
            registry=registry if registry is not None else CollectorRegistry(),
        )
        for reason in RefusalReason:
            self.counter.labels(reason.value)

    def count(self, reason: RefusalReason) -> None:
        self.counter.labels(reason.value).inc()

    def value(self, reason: RefusalReason) -> float:
        return float(self.counter.labels(reason.value)._value.get())


def handshake_refusal(exc: BaseException) -> RefusalReason:
    """The reason to count for an exception that ended an inbound handshake."""
    if isinstance(exc, ssl.SSLError):
        return RefusalReason.TLS_HANDSHAKE
    if isinstance(exc, TimeoutError):
        return RefusalReason.HANDSHAKE_TIMEOUT
    if isinstance(exc, PeerAuthenticationError):
        return RefusalReason.NOT_A_MEMBER
    if isinstance(exc, PeerConfigMismatch):
        return RefusalReason.CONFIG_MISMATCH
    if isinstance(exc, HandshakeError | FrameTooLarge):
        return RefusalReason.BAD_HELLO
    if isinstance(exc, asyncio.IncompleteReadError | OSError):
        return RefusalReason.CLOSED_IN_HANDSHAKE
    return RefusalReason.BAD_HELLO
