"""``TcpTransport``: the peer links of one member, from listening and dialling to closing.

Connections: one outbound connection per ordered pair of members. Member A dials B
and uses that connection only for A's frames to B; B's frames to A travel on the
connection B dials to A. So each pair holds two connections, there is never a
"who keeps which duplicate" race, and each side's sending reconnects on its own. The
listener never sends frames, only the handshake reply (``welcome``, see
``kdsync.transport.tcp.handshake``); the dialer reads its side only to notice the
connection closing. A failed outbound link is dialled again after a growing delay
(``backoff``); queued frames wait for it (``flow``).

Everything runs on one event loop; the transport is not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from kdsync.transport.address import parse_address
from kdsync.transport.base import (
    FrameTimeout,
    FrameTooLarge,
    Introduce,
    LinkStatus,
    PeerState,
    PeerTransport,
    ReceivedFrame,
    TransportClosed,
    validate_member_name,
)
from kdsync.transport.framing import check_frame_size, encode_frames
from kdsync.transport.tcp.backoff import ExponentialBackoff
from kdsync.transport.tcp.connect_phase import (
    GIVE_WAY_AFTER_S,
    Resolver,
    open_socket,
    system_resolver,
    until_woken,
)
from kdsync.transport.tcp.flow import InboundBuffer, SendQueue
from kdsync.transport.tcp.handshake import (
    handshake_as_dialer,
    handshake_as_listener,
)
from kdsync.transport.tcp.peer import Peer
from kdsync.transport.tcp.receiving import receive_frames, watch_for_close
from kdsync.transport.tcp.refusals import RefusalCounter, RefusalReason, handshake_refusal
from kdsync.transport.tcp.streams import (
    EXPECTED_LINK_ERRORS,
    STREAM_LIMIT,
    close_writer,
    describe,
    detect_dead_peers,
)
from kdsync.transport.tcp_config import TcpTransportConfig
from kdsync.transport.tls import client_context, server_context

logger = logging.getLogger(__name__)

# Writer-side buffering before ``drain`` waits; lets a batch go out in few syscalls.
_WRITE_HIGH_WATER = 1024 * 1024
# How many queued bytes the sender hands to the socket per drain.
_WRITE_BATCH_BYTES = 1024 * 1024


class TcpTransport:
    """``PeerTransport`` over TCP with mutual TLS (or explicitly insecure plaintext).

    ``jitter`` is the randomness for reconnect backoff (floats in [0, 1)); inject a
    fixed function in tests. ``resolve`` turns a peer's host into addresses (tests move
    a name from one address to another with it). ``registry`` receives the
    refused-connections counter (``kdsync.transport.tcp.refusals``); the sidecar passes
    the one ``/metrics`` serves.
    """

    def __init__(
        self,
        config: TcpTransportConfig,
        *,
        jitter: Callable[[], float] = random.random,
        registry: CollectorRegistry | None = None,
        resolve: Resolver = system_resolver,
    ) -> None:
        self.config = config
        self._jitter = jitter
        self._resolve = resolve
        self._peers: dict[str, Peer] = {}
        for name in config.other_members():
            self._peers[name] = self._new_peer(name, config.peers[name])
        # Set once this member's membership comes from its log (changed at runtime): the
        # handshake then stops comparing startup member lists (``handshake``).
        self.membership_changed = False
        # Set by the driver's peer links: told of a member that dials us with its
        # membership from its log (``handshake``); may link it (added while our log is
        # behind) or keep it from being retired. True if it is linked now.
        self.introduce: Introduce | None = None
        # Where our configuration stands in our log (0: the startup file's), for hellos.
        self.config_index = 0
        # Where the log says we listen (kdsync members add --peer), for our hellos.
        self.advertised_address: str | None = None
        self._inbound = InboundBuffer(config.max_inbound_bytes)
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
        self._pending_handshakes = 0
        self.refusals = RefusalCounter(registry)

    # Whether this transport offers RDMA in the handshake (``RdmaTransport`` does).
    offers_rdma = False

    def _new_peer(self, name: str, address: str) -> Peer:
        host, port = parse_address(address)
        config = self.config
        return Peer(
            name=name,
            address=address,
            host=host,
            port=port,
            queue=SendQueue(config.max_queue_frames, config.max_queue_bytes),
            backoff=ExponentialBackoff(
                config.backoff_initial_s, config.backoff_max_s, self._jitter
            ),
        )

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
        # TLS is started per connection (``_serve_inbound``), not by the server, so a
        # failed TLS handshake is seen, counted and bounded by the handshake deadline.
        self._server = await asyncio.start_server(
            self._on_connection, host, port, limit=STREAM_LIMIT, reuse_address=True
        )
        for peer in self._peers.values():
            if not peer.retired:
                peer.dial_task = self._spawn(self._dial_loop(peer), f"kdsync-dial-{peer.name}")

    def send(self, peer: str, frame: bytes) -> bool:
        state = self._peers.get(peer)
        if state is None:
            raise ValueError(f"{peer!r} is not another member of group {self.config.group!r}")
        check_frame_size(len(frame), self.config.max_frame_bytes)
        if self._closing or state.retired:
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

    @property
    def pending_handshakes(self) -> int:
        """Inbound connections accepted but not yet authenticated (at most
        ``config.max_pending_handshakes``)."""
        return self._pending_handshakes

    def peer_states(self) -> dict[str, PeerState]:
        return {name: peer.snapshot() for name, peer in self._peers.items()}

    def retire_peer(self, peer: str) -> bool:
        state = self._peers.get(peer)
        if state is None or state.retired:
            return False
        state.retired = True
        state.next_attempt_at = None
        state.queue.frames.clear()
        state.queue.bytes = 0
        if state.dial_task is not None:
            state.dial_task.cancel()  # closes the outbound link; an inbound one may stay
        logger.info("stopped dialling %s: it is no longer a member of the group", peer)
        return True

    def add_peer(self, peer: str, address: str) -> bool:
        state = self._peers.get(peer)
        if peer == self.config.member or (
            state is not None and not state.retired and state.address == address
        ):
            return False
        validate_member_name(peer)
        if state is None:
            state = self._new_peer(peer, address)  # raises ValueError for a bad address
            self._peers[peer] = state
            why = "it joined the group"
        else:
            # Back from retirement, or at another address than the startup file's (the
            # log's wins): the same bookkeeping, so a link it kept stays counted.
            host, port = parse_address(address)
            why = "it joined the group again" if state.retired else f"not {state.address}"
            if state.dial_task is not None:
                state.dial_task.cancel()  # dialling the old address
            state.host, state.port, state.address = host, port, address
            state.retired = False
            state.status = LinkStatus.CONNECTING
            state.backoff.reset()
        if self._started and not self._closing:
            state.dial_task = self._spawn(self._dial_loop(state), f"kdsync-dial-{peer}")
        logger.info("reaching member %s at %s: %s", peer, address, why)
        return True

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

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _record_error(self, peer: Peer, exc: BaseException, what: str) -> None:
        description = describe(exc)
        peer.last_error = f"{what}: {description}"
        peer.last_error_at = time.time()
        # Log each distinct failure once; a peer that stays down would otherwise log
        # every retry.
        if not isinstance(exc, EXPECTED_LINK_ERRORS):
            logger.error(
                "peer %s (%s): %s: unexpected error", peer.name, peer.address, what, exc_info=exc
            )
        elif description != peer.logged_error:
            logger.warning("peer %s (%s): %s: %s", peer.name, peer.address, what, description)
            peer.logged_error = description
        else:
            logger.debug("peer %s (%s): %s: %s", peer.name, peer.address, what, description)

    # -- outbound --------------------------------------------------------------------

    async def _dial_loop(self, peer: Peer) -> None:
        # asyncio.timeout rather than wait_for throughout: on 3.11, wait_for can turn a
        # cancellation that races with completion into a normal return, and this loop
        # would then outlive close(). The _closing check is a second line of defence.
        while not self._closing and not peer.retired:
            peer.status = LinkStatus.CONNECTING
            peer.next_attempt_at = None
            peer.connect_attempts += 1
            try:
                async with asyncio.timeout(self.config.connect_timeout_s):
                    link = await self._dial(peer)
            except Exception as exc:
                self._record_error(peer, exc, "connect failed")
            else:
                peer.backoff.reset()
                if link is None:
                    continue  # it reached us while this dial waited for TCP: dial afresh
                reader, writer, rdma = link
                peer.status = LinkStatus.CONNECTED
                peer.connected_since = time.time()
                peer.logged_error = None
                logger.info("connected to peer %s at %s", peer.name, peer.address)
                try:
                    await self._send_frames(peer, reader, writer, rdma)
                except Exception as exc:
                    self._record_error(peer, exc, "link lost")
                finally:
                    peer.connected_since = None
                    await close_writer(writer)
            delay = peer.backoff.next_delay()
            peer.status = LinkStatus.BACKOFF
            peer.next_attempt_at = time.time() + delay
            peer.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await peer.wake.wait()

    async def _dial(
        self, peer: Peer
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool] | None:
        """A connected, authenticated link to ``peer``, and whether its frames go over
        RDMA (both sides offered it); None if the peer reached us while the TCP handshake
        was pending (``connect_phase``)."""
        addresses = await self._resolve(peer.host, peer.port)
        peer.wake.clear()
        dialling = asyncio.current_task()
        peer.awaiting_tcp = dialling
        try:
            sock = await until_woken(
                open_socket(peer.host, addresses),
                peer.wake,
                socket.socket.close,
                patience_s=GIVE_WAY_AFTER_S,
            )
        finally:
            # Unless a newer dial loop (the peer's address changed) took over meanwhile.
            if peer.awaiting_tcp is dialling:
                peer.awaiting_tcp = None
        if sock is None:
            logger.info(
                "peer %s reached us while our dial to %s waited for TCP; dialling afresh",
                peer.name,
                peer.address,
            )
            return None
        try:
            reader, writer = await asyncio.open_connection(sock=sock, limit=STREAM_LIMIT)
        except BaseException:
            sock.close()
            raise
        try:
            if self._client_ssl is not None:
                # TLS on the open stream rather than open_connection(sock=..., ssl=...):
                # on 3.11 a cancellation (a timeout, close()) landing just after that call
                # made its transport left the transport unclosed.
                try:
                    await writer.start_tls(
                        self._client_ssl,
                        server_hostname=peer.host,
                        ssl_handshake_timeout=self.config.connect_timeout_s,
                    )
                except BaseException:
                    # At once: a stream whose TLS handshake was cut never reports closed,
                    # so close_writer would wait out its whole timeout.
                    writer.transport.abort()
                    raise
            detect_dead_peers(writer)
            rdma = await handshake_as_dialer(
                reader,
                writer,
                self.config,
                peer.name,
                peer.address,
                tls=self._client_ssl is not None,
                rdma=self.offers_rdma,
                membership_changed=self.membership_changed,
                own_address=self.advertised_address or self.config.peers.get(self.config.member),
                config_index=self.config_index,
            )
        except BaseException:
            await close_writer(writer)
            raise
        writer.transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)
        return reader, writer, rdma

    async def _send_frames(
        self, peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rdma: bool
    ) -> None:
        """Send ``peer``'s queued frames on an authenticated link until it fails; returns
        only by raising. ``RdmaTransport`` takes the links where ``rdma`` is set."""
        await self._run_link(peer, reader, writer)

    async def _run_link(
        self, peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Send queued frames until the link fails; returns only by raising."""
        watcher = asyncio.create_task(watch_for_close(reader), name=f"kdsync-watch-{peer.name}")
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

    async def _send_queued(self, peer: Peer, writer: asyncio.StreamWriter) -> None:
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
        if self._pending_handshakes >= self.config.max_pending_handshakes:
            # Bounds what unauthenticated connections (each with its buffers) can hold.
            self._refuse(
                RefusalReason.TOO_MANY_PENDING,
                writer.get_extra_info("peername"),
                f"{self._pending_handshakes} connections are already authenticating",
            )
            writer.transport.abort()
            return
        self._pending_handshakes += 1
        serving = self._spawn(self._serve_inbound(reader, writer), "kdsync-inbound")
        # However it ends, even cancelled by close() before it first ran (its own
        # cleanup then never runs), the connection is closed.
        serving.add_done_callback(lambda _: writer.transport.abort())

    def _refuse(self, reason: RefusalReason, remote: object, detail: str) -> None:
        self._rejected_connections += 1
        self.refusals.count(reason)
        logger.warning("refused peer connection from %s (%s): %s", remote, reason.value, detail)

    async def _serve_inbound(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        remote = writer.get_extra_info("peername")
        peer: Peer | None = None
        this_task = asyncio.current_task()
        try:
            try:
                # One deadline for TLS and hello together: a slowloris client cannot
                # stretch it by trickling bytes.
                async with asyncio.timeout(self.config.handshake_timeout_s):
                    if self._server_ssl is not None:
                        await writer.start_tls(self._server_ssl)
                    name, rdma = await handshake_as_listener(
                        reader,
                        writer,
                        self.config,
                        self._peers,
                        tls=self._server_ssl is not None,
                        rdma=self.offers_rdma,
                        membership_changed=self.membership_changed,
                        # Only a certificate of the group's CA makes a claim worth a
                        # link: in insecure mode anyone could make us dial anywhere.
                        introduce=self.introduce if self._server_ssl is not None else None,
                    )
            except Exception as exc:
                if not isinstance(exc, EXPECTED_LINK_ERRORS):
                    logger.error("peer handshake from %s failed", remote, exc_info=exc)
                self._refuse(handshake_refusal(exc), remote, describe(exc))
                return
            finally:
                self._pending_handshakes -= 1
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
            if peer.status is LinkStatus.BACKOFF or peer.awaiting_tcp is not None:
                # It is up and takes us as a member (it restarted, or just learned that we
                # are one): dial it now, not at the end of a backoff of up to backoff_max_s
                # or of a TCP handshake with an address it may no longer have.
                peer.backoff.reset()
                peer.wake.set()
            await self._take_frames(peer, reader, writer, rdma)
        except (FrameTooLarge, FrameTimeout) as exc:
            reason = (
                RefusalReason.FRAME_TOO_LARGE
                if isinstance(exc, FrameTooLarge)
                else RefusalReason.FRAME_TIMEOUT
            )
            self.refusals.count(reason)
            logger.warning("closing connection from %s (%s): %s", remote, reason.value, exc)
        except Exception as exc:
            expected = isinstance(exc, EXPECTED_LINK_ERRORS)
            level = logging.INFO if expected else logging.WARNING
            logger.log(
                level,
                "closing connection from %s: %s",
                remote,
                describe(exc),
                exc_info=None if expected else exc,
            )
        finally:
            if peer is not None and peer.inbound_task is this_task:
                peer.inbound_task = None
            await close_writer(writer)

    async def _take_frames(
        self, peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rdma: bool
    ) -> None:
        """Receive ``peer``'s frames on an authenticated link until it ends.
        ``RdmaTransport`` takes the links where ``rdma`` is set."""
        await receive_frames(
            peer,
            reader,
            writer,
            self._inbound,
            max_frame_bytes=self.config.max_frame_bytes,
            frame_timeout_s=self.config.frame_timeout_s,
        )


if TYPE_CHECKING:

    def _implements_peer_transport(transport: TcpTransport) -> PeerTransport:
        # mypy proves TcpTransport structurally satisfies the interface.
        return transport
