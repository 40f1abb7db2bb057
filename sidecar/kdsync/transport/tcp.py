"""Peer transport over asyncio TCP with mutual TLS.

Connections: one outbound connection per ordered pair of members. Member A dials B
and uses that connection only for A's frames to B; B's frames to A travel on the
connection B dials to A. So each pair holds two connections, there is never a
"who keeps which duplicate" race, and each side's sending reconnects on its own. The
listener never sends frames, only the handshake reply (``welcome``); the dialer reads
its side only to notice the connection closing.

Handshake, after TCP (and TLS, unless insecure):

1. TLS mode: the listener maps the client certificate (already chain-verified against
   the group CA) to a member name and closes the connection, reading nothing, unless
   that name is a configured member of this group other than itself. The dialer
   checks that the server certificate names the member it meant to reach.
2. The dialer sends a ``hello`` frame (JSON: version, group, member). In insecure
   mode this is the only identity there is; in TLS mode it must match the certificate.
3. The listener answers ``welcome`` (JSON: version, group, its member name); only
   then does the dialer count the link as connected and start writing queued frames.

Sending never blocks: ``send`` appends to a per-peer queue bounded in frames and bytes
and returns False (frame dropped) when the queue is full; the ordering protocol
tolerates loss. Frames queued while a peer is down are sent once it is back.
Receiving applies backpressure instead: when the caller does not keep up with
``receive``, the inbound buffer fills, readers stop reading, and TCP flow control
pushes back until the senders' queues fill and drop.

Everything runs on one event loop; the transport is not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
from kdsync.transport.framing import (
    HEADER_BYTES,
    check_frame_size,
    encode_frame,
    encode_frames,
    read_frame,
)
from kdsync.transport.tcp_config import TcpTransportConfig
from kdsync.transport.tls import (
    client_context,
    member_from_peercert,
    server_context,
)

logger = logging.getLogger(__name__)

HANDSHAKE_VERSION = 1
_MAX_HANDSHAKE_FRAME_BYTES = 4096
# StreamReader buffer limit: large enough that big frames do not pause and resume the
# socket every 128 KiB.
_STREAM_LIMIT = 1024 * 1024
# Writer-side buffering before ``drain`` waits; lets a batch go out in few syscalls.
_WRITE_HIGH_WATER = 1024 * 1024
# How many queued bytes the sender hands to the socket per drain.
_WRITE_BATCH_BYTES = 1024 * 1024
_CLOSE_TIMEOUT = 1.0
# Detect peers that vanished without a FIN (host down, network cut): keepalive on idle
# links, and a bound on unacknowledged data on busy ones (else ~15 min of retries).
_KEEPALIVE_IDLE_S = 10
_KEEPALIVE_INTERVAL_S = 5
_KEEPALIVE_PROBES = 3
_TCP_USER_TIMEOUT_MS = 30_000


class HandshakeError(TransportError):
    """A malformed or unexpected hello/welcome."""


class PeerConfigMismatch(HandshakeError):
    """A member's group settings (members, topics) differ from ours: the link is refused."""


# Failures that networks and misbehaving peers cause; anything else is a bug and is
# logged with its traceback.
_EXPECTED_LINK_ERRORS = (OSError, TimeoutError, TransportError, asyncio.IncompleteReadError)


class ExponentialBackoff:
    """Reconnect delays: doubling from ``initial`` up to ``maximum``, with jitter.

    Each delay is uniform in [ceiling/2, ceiling) ("equal jitter"): spread out so
    members that lost the same peer do not retry in lockstep, yet never near zero.
    ``jitter`` returns floats in [0, 1); tests pass a fixed one.
    """

    def __init__(self, initial: float, maximum: float, jitter: Callable[[], float]) -> None:
        self.initial = initial
        self.maximum = maximum
        self._jitter = jitter
        self.failures = 0

    def next_delay(self) -> float:
        # The exponent is capped so 2**n cannot overflow a float after a long outage.
        ceiling = min(self.maximum, self.initial * 2.0 ** min(self.failures, 60))
        self.failures += 1
        return ceiling * (0.5 + 0.5 * self._jitter())

    def reset(self) -> None:
        self.failures = 0


class _SendQueue:
    """Frames waiting to go to one peer, bounded by count and by bytes."""

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.frames: deque[bytes] = deque()
        self.bytes = 0
        self._not_empty = asyncio.Event()

    def put(self, frame: bytes) -> bool:
        if len(self.frames) >= self.max_frames or self.bytes + len(frame) > self.max_bytes:
            return False
        self.frames.append(frame)
        self.bytes += len(frame)
        self._not_empty.set()
        return True

    async def take_batch(self, max_bytes: int) -> list[bytes]:
        """Wait for frames, then take at least one and at most about ``max_bytes``."""
        while not self.frames:
            self._not_empty.clear()
            await self._not_empty.wait()
        batch: list[bytes] = []
        taken = 0
        while self.frames and (not batch or taken + len(self.frames[0]) <= max_bytes):
            frame = self.frames.popleft()
            batch.append(frame)
            taken += len(frame)
        self.bytes -= taken
        return batch


class _InboundBuffer:
    """Received frames waiting for ``receive()``, bounded by bytes.

    A put waits while the buffer is full, which stops that connection's reads. One
    frame is always admitted into an empty buffer, so a frame larger than the bound
    still gets through.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.frames: deque[ReceivedFrame] = deque()
        self.bytes = 0
        self.closed = False
        self._not_empty = asyncio.Event()
        self._has_room = asyncio.Event()

    async def put(self, frame: ReceivedFrame) -> None:
        while self.frames and self.bytes + len(frame.payload) > self.max_bytes:
            if self.closed:
                return
            self._has_room.clear()
            await self._has_room.wait()
        if self.closed:
            return
        self.frames.append(frame)
        self.bytes += len(frame.payload)
        self._not_empty.set()

    async def get(self) -> ReceivedFrame:
        while not self.frames:
            if self.closed:
                raise TransportClosed("transport closed")
            self._not_empty.clear()
            await self._not_empty.wait()
        if self.closed:
            raise TransportClosed("transport closed")
        frame = self.frames.popleft()
        self.bytes -= len(frame.payload)
        self._has_room.set()
        return frame

    def close(self) -> None:
        self.closed = True
        self.frames.clear()
        self.bytes = 0
        self._not_empty.set()
        self._has_room.set()


@dataclass
class _Peer:
    """Mutable per-peer bookkeeping; ``PeerState`` is its public snapshot."""

    name: str
    address: str
    host: str
    port: int
    queue: _SendQueue
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

    def snapshot(self) -> PeerState:
        return PeerState(
            peer=self.name,
            address=self.address,
            outbound=self.status,
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


def _describe(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, TimeoutError) and not text:
        text = "timed out"
    if isinstance(exc, asyncio.IncompleteReadError):
        text = "connection closed by peer" + (" mid-frame" if exc.partial else "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _handshake_frame(
    kind: str, group: str, member: str, agreement: Mapping[str, Any] | None = None
) -> bytes:
    message: dict[str, Any] = {
        "kdsync": kind,
        "version": HANDSHAKE_VERSION,
        "group": group,
        "member": member,
    }
    if agreement:
        message["agreement"] = dict(agreement)
    return encode_frame(json.dumps(message, separators=(",", ":")).encode())


def _disagreement(ours: Mapping[str, Any], frame: bytes, peer: str) -> str | None:
    """What differs between our agreement and the one in a (parsed-valid) handshake frame;
    None when they agree, or when either side sends none (a member from before the check)."""
    theirs = json.loads(frame).get("agreement")
    if not ours or not isinstance(theirs, dict):
        return None
    differences = [
        f"{key}: {json.dumps(ours.get(key))} here, {json.dumps(theirs.get(key))} at {peer}"
        for key in sorted(set(ours) | set(theirs))
        if json.loads(json.dumps(ours.get(key))) != theirs.get(key)
    ]
    if not differences:
        return None
    return (
        f"member {peer}'s configuration disagrees with this member's ("
        + "; ".join(differences)
        + "); every member needs the same members and topics settings"
    )


def _parse_handshake(frame: bytes, kind: str, group: str) -> str:
    """Validate a hello/welcome frame and return the member it names."""
    try:
        message = json.loads(frame)
    except ValueError as exc:
        raise HandshakeError(f"{kind} is not valid JSON") from exc
    if not isinstance(message, dict) or message.get("kdsync") != kind:
        raise HandshakeError(f"expected a {kind} message")
    if message.get("version") != HANDSHAKE_VERSION:
        raise HandshakeError(
            f"{kind} has protocol version {message.get('version')!r}; "
            f"this member speaks {HANDSHAKE_VERSION}"
        )
    if message.get("group") != group:
        raise HandshakeError(f"{kind} is for group {message.get('group')!r}, not {group!r}")
    member = message.get("member")
    if not isinstance(member, str):
        raise HandshakeError(f"{kind} names no member")
    return member


def _detect_dead_peers(writer: asyncio.StreamWriter) -> None:
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


async def _close_writer(writer: asyncio.StreamWriter) -> None:
    """Close a stream, giving TLS a moment for close_notify, then abort if it hangs."""
    writer.close()
    try:
        async with asyncio.timeout(_CLOSE_TIMEOUT):
            await writer.wait_closed()
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        writer.transport.abort()


class TcpTransport:
    """``PeerTransport`` over TCP with mutual TLS (or explicitly insecure plaintext).

    ``jitter`` is the randomness for reconnect backoff (floats in [0, 1)); inject a
    fixed function in tests.
    """

    def __init__(
        self, config: TcpTransportConfig, *, jitter: Callable[[], float] = random.random
    ) -> None:
        self.config = config
        self._peers: dict[str, _Peer] = {}
        for name in config.other_members():
            address = config.peers[name]
            host, port = parse_address(address)
            self._peers[name] = _Peer(
                name=name,
                address=address,
                host=host,
                port=port,
                queue=_SendQueue(config.max_queue_frames, config.max_queue_bytes),
                backoff=ExponentialBackoff(config.backoff_initial_s, config.backoff_max_s, jitter),
            )
        self._inbound = _InboundBuffer(config.max_inbound_bytes)
        self._server_ssl: ssl.SSLContext | None = None
        self._client_ssl: ssl.SSLContext | None = None
        if config.tls is not None:
            self._server_ssl = server_context(config.tls)
            self._client_ssl = client_context(config.tls)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False
        self._closing = False
        self._closed = asyncio.Event()
        self._rejected_connections = 0

    # -- PeerTransport ---------------------------------------------------------------

    @property
    def member(self) -> str:
        return self.config.member

    @property
    def peers(self) -> tuple[str, ...]:
        return tuple(self._peers)

    @property
    def listen_address(self) -> tuple[str, int]:
        """The address actually bound (useful when the configured port is 0)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("transport is not listening")
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("transport already started")
        if self._closing:
            raise TransportClosed("transport closed")
        self._started = True
        host, port = parse_address(self.config.listen)
        if self.config.insecure:
            logger.warning(
                "INSECURE PEER TRANSPORT: TLS is off for member %s of group %s. Anyone who "
                "can reach %s can read the group's traffic and impersonate any member. "
                "Use insecure mode only for local tests.",
                self.config.member,
                self.config.group,
                self.config.listen,
            )
        tls_options: dict[str, Any] = {}
        if self._server_ssl is not None:
            tls_options = {
                "ssl": self._server_ssl,
                "ssl_handshake_timeout": self.config.handshake_timeout_s,
                "ssl_shutdown_timeout": _CLOSE_TIMEOUT,
            }
        self._server = await asyncio.start_server(
            self._on_connection,
            host,
            port,
            limit=_STREAM_LIMIT,
            reuse_address=True,
            **tls_options,
        )
        for peer in self._peers.values():
            self._spawn(self._dial_loop(peer), f"kdsync-dial-{peer.name}")

    def send(self, peer: str, frame: bytes) -> bool:
        state = self._peers.get(peer)
        if state is None:
            raise ValueError(f"{peer!r} is not another member of group {self.config.group!r}")
        check_frame_size(len(frame), self.config.max_frame_bytes)
        if self._closing:
            return False
        if state.queue.put(frame):
            return True
        state.frames_dropped += 1
        return False

    async def receive(self) -> ReceivedFrame:
        return await self._inbound.get()

    @property
    def rejected_connections(self) -> int:
        return self._rejected_connections

    def peer_states(self) -> dict[str, PeerState]:
        return {name: peer.snapshot() for name, peer in self._peers.items()}

    async def close(self) -> None:
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        self._inbound.close()
        if self._server is not None:
            self._server.close()
        # Tasks may spawn no new ones once _closing is set, so one pass suffices.
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        for peer in self._peers.values():
            peer.status = LinkStatus.CLOSED
            peer.connected_since = None
            peer.next_attempt_at = None
            peer.queue.frames.clear()
            peer.queue.bytes = 0
        self._closed.set()

    async def __aenter__(self) -> TcpTransport:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- tasks -----------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _record_error(self, peer: _Peer, exc: BaseException, what: str) -> None:
        description = _describe(exc)
        peer.last_error = f"{what}: {description}"
        peer.last_error_at = time.time()
        # Log each distinct failure once; a peer that stays down would otherwise log
        # every retry.
        if not isinstance(exc, _EXPECTED_LINK_ERRORS):
            logger.error(
                "peer %s (%s): %s: unexpected error", peer.name, peer.address, what, exc_info=exc
            )
        elif description != peer.logged_error:
            logger.warning("peer %s (%s): %s: %s", peer.name, peer.address, what, description)
            peer.logged_error = description
        else:
            logger.debug("peer %s (%s): %s: %s", peer.name, peer.address, what, description)

    # -- outbound --------------------------------------------------------------------

    async def _dial_loop(self, peer: _Peer) -> None:
        # asyncio.timeout rather than wait_for throughout: on 3.11, wait_for can turn a
        # cancellation that races with completion into a normal return, and this loop
        # would then outlive close(). The _closing check is a second line of defence.
        while not self._closing:
            peer.status = LinkStatus.CONNECTING
            peer.next_attempt_at = None
            peer.connect_attempts += 1
            try:
                async with asyncio.timeout(self.config.connect_timeout_s):
                    reader, writer = await self._dial(peer)
            except Exception as exc:
                self._record_error(peer, exc, "connect failed")
            else:
                peer.backoff.reset()
                peer.status = LinkStatus.CONNECTED
                peer.connected_since = time.time()
                peer.logged_error = None
                logger.info("connected to peer %s at %s", peer.name, peer.address)
                try:
                    await self._run_link(peer, reader, writer)
                except Exception as exc:
                    self._record_error(peer, exc, "link lost")
                finally:
                    peer.connected_since = None
                    await _close_writer(writer)
            delay = peer.backoff.next_delay()
            peer.status = LinkStatus.BACKOFF
            peer.next_attempt_at = time.time() + delay
            await asyncio.sleep(delay)

    async def _dial(self, peer: _Peer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._client_ssl is not None:
            reader, writer = await asyncio.open_connection(
                peer.host,
                peer.port,
                limit=_STREAM_LIMIT,
                ssl=self._client_ssl,
                ssl_handshake_timeout=self.config.connect_timeout_s,
                ssl_shutdown_timeout=_CLOSE_TIMEOUT,
            )
        else:
            reader, writer = await asyncio.open_connection(
                peer.host, peer.port, limit=_STREAM_LIMIT
            )
        try:
            _detect_dead_peers(writer)
            if self._client_ssl is not None:
                presented = member_from_peercert(
                    writer.get_extra_info("peercert"), self.config.group
                )
                if presented != peer.name:
                    raise PeerAuthenticationError(
                        f"{peer.address} presented a certificate for member {presented!r}, "
                        f"expected {peer.name!r}"
                    )
            writer.write(
                _handshake_frame(
                    "hello", self.config.group, self.config.member, self.config.agreement
                )
            )
            await writer.drain()
            welcome = await read_frame(reader, _MAX_HANDSHAKE_FRAME_BYTES)
            answered_as = _parse_handshake(welcome, "welcome", self.config.group)
            if answered_as != peer.name:
                raise PeerAuthenticationError(
                    f"{peer.address} answered as member {answered_as!r}, expected {peer.name!r}"
                )
            disagreement = _disagreement(self.config.agreement, welcome, peer.name)
            if disagreement is not None:
                raise PeerConfigMismatch(disagreement)
        except BaseException:
            await _close_writer(writer)
            raise
        writer.transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)
        return reader, writer

    async def _run_link(
        self, peer: _Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Send queued frames until the link fails; returns only by raising."""
        watcher = asyncio.create_task(_watch_for_close(reader), name=f"kdsync-watch-{peer.name}")
        sender = asyncio.create_task(
            self._send_queued(peer, writer), name=f"kdsync-send-{peer.name}"
        )
        try:
            done, _ = await asyncio.wait({watcher, sender}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            sender.cancel()
            await asyncio.gather(watcher, sender, return_exceptions=True)
        for task in done:
            exc = task.exception()
            if exc is not None:
                raise exc
        raise ConnectionResetError("link ended")

    async def _send_queued(self, peer: _Peer, writer: asyncio.StreamWriter) -> None:
        while True:
            batch = await peer.queue.take_batch(_WRITE_BATCH_BYTES)
            for buffer in encode_frames(batch):
                writer.write(buffer)
            await writer.drain()
            peer.frames_sent += len(batch)
            peer.bytes_sent += sum(len(frame) for frame in batch)

    # -- inbound ---------------------------------------------------------------------

    def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Plain callback (not a coroutine) so the connection's task is one of ours,
        # cancelled and awaited by close().
        if self._closing:
            writer.transport.abort()
            return
        self._spawn(self._serve_inbound(reader, writer), "kdsync-inbound")

    async def _serve_inbound(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        remote = writer.get_extra_info("peername")
        peer: _Peer | None = None
        this_task = asyncio.current_task()
        try:
            try:
                async with asyncio.timeout(self.config.handshake_timeout_s):
                    name = await self._accept_handshake(reader, writer)
            except Exception as exc:
                self._rejected_connections += 1
                logger.warning(
                    "rejected peer connection from %s: %s",
                    remote,
                    _describe(exc),
                    exc_info=None if isinstance(exc, _EXPECTED_LINK_ERRORS) else exc,
                )
                return
            peer = self._peers[name]
            previous = peer.inbound_task
            peer.inbound_task = this_task
            if previous is not None:
                # The member reconnected (e.g. it restarted): the new link supersedes.
                previous.cancel()
            if self.config.insecure:
                logger.warning(
                    "accepted UNAUTHENTICATED (insecure mode) connection from %s claiming "
                    "to be member %s",
                    remote,
                    name,
                )
            else:
                logger.info("accepted connection from member %s at %s", name, remote)
            await self._receive_frames(peer, reader)
        except Exception as exc:
            expected = isinstance(exc, _EXPECTED_LINK_ERRORS)
            level = (
                logging.INFO if expected and not isinstance(exc, FrameTooLarge) else logging.WARNING
            )
            logger.log(
                level,
                "closing connection from %s: %s",
                remote,
                _describe(exc),
                exc_info=None if expected else exc,
            )
        finally:
            if peer is not None and peer.inbound_task is this_task:
                peer.inbound_task = None
            await _close_writer(writer)

    async def _accept_handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> str:
        """Authenticate an inbound connection; returns the member it belongs to."""
        certified: str | None = None
        if self._server_ssl is not None:
            # Checked before reading anything: a stranger gets no say in what we parse.
            certified = member_from_peercert(writer.get_extra_info("peercert"), self.config.group)
            self._check_is_peer(certified)
        hello = await read_frame(reader, _MAX_HANDSHAKE_FRAME_BYTES)
        claimed = _parse_handshake(hello, "hello", self.config.group)
        if certified is not None and claimed != certified:
            raise PeerAuthenticationError(
                f"hello claims member {claimed!r} but the certificate names {certified!r}"
            )
        self._check_is_peer(claimed)
        _detect_dead_peers(writer)
        # The welcome carries our agreement even to a member that disagrees, so both
        # sides can say what differs; the link is then refused.
        writer.write(
            _handshake_frame(
                "welcome", self.config.group, self.config.member, self.config.agreement
            )
        )
        await writer.drain()
        disagreement = _disagreement(self.config.agreement, hello, claimed)
        if disagreement is not None:
            raise PeerConfigMismatch(disagreement)
        return claimed

    def _check_is_peer(self, name: str) -> None:
        if name not in self._peers:
            raise PeerAuthenticationError(
                f"{name!r} is not another member of group {self.config.group!r}"
            )

    async def _receive_frames(self, peer: _Peer, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                payload = await read_frame(reader, self.config.max_frame_bytes)
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    return  # clean close between frames
                raise
            peer.frames_received += 1
            peer.bytes_received += len(payload)
            await self._inbound.put(ReceivedFrame(peer.name, payload))


async def _watch_for_close(reader: asyncio.StreamReader) -> None:
    """Return-by-raising when the listener closes an outbound link.

    The listener sends nothing after ``welcome``, so any data is a protocol error.
    """
    data = await reader.read(HEADER_BYTES)
    if data:
        raise HandshakeError("peer sent data on a send-only link")
    raise ConnectionResetError("peer closed the connection")


if TYPE_CHECKING:

    def _implements_peer_transport(transport: TcpTransport) -> PeerTransport:
        # mypy proves TcpTransport structurally satisfies the interface.
        return transport
