"""An aiohttp site for the admin listener that bounds connections still in their TLS
handshake, as the peer port does (``transport.tcp.connections``): at most
``max_pending`` at a time (one more is closed at once), each finished within
``handshake_timeout_s`` or closed.

aiohttp's ``TCPSite`` passes neither to asyncio, which then waits 60 s for a handshake
and takes any number: clients that open connections and send nothing would each hold a
socket and its buffers for a minute. Here the listening socket carries a gate protocol
that pauses reading, counts the connection, and upgrades it with ``loop.start_tls``;
only a verified connection reaches aiohttp's request handler. Each connection ended here
is counted by reason (``AdminRefusal``) in the counter the site is given, the one
``kdsync_admin_connections_refused_total`` serves.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HandshakeLimits:
    # The peer port's defaults (``TcpTransportConfig``): an operator needs one or two.
    max_pending: int = 32
    handshake_timeout_s: float = 10.0


class AdminRefusal(enum.StrEnum):
    """Why the admin listener ended a connection before, or instead of, serving it."""

    TOO_MANY_PENDING = "too_many_pending"  # over max_pending handshakes at once
    HANDSHAKE_TIMEOUT = "handshake_timeout"  # not done within handshake_timeout_s
    TLS_HANDSHAKE = "tls_handshake"  # no certificate, another CA's, not TLS at all
    CLOSED_IN_HANDSHAKE = "closed_in_handshake"  # the client hung up first
    NOT_THE_OPERATOR = "not_the_operator"  # a verified client, not the operator, asked to change


def _handshake_refusal(exc: OSError) -> AdminRefusal:
    if isinstance(exc, ssl.SSLError):
        return AdminRefusal.TLS_HANDSHAKE
    # asyncio ends a handshake past its timeout with ConnectionAbortedError.
    if isinstance(exc, ConnectionAbortedError):
        return AdminRefusal.HANDSHAKE_TIMEOUT
    return AdminRefusal.CLOSED_IN_HANDSHAKE


class GatedTlsSite(web.BaseSite):
    __slots__ = (
        "_bound",
        "_closing",
        "_count_refusal",
        "_handshakes",
        "_host",
        "_limits",
        "_pending",
        "_port",
    )

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        context: ssl.SSLContext,
        limits: HandshakeLimits,
        count_refusal: Callable[[AdminRefusal], None] = lambda _: None,
    ) -> None:
        super().__init__(runner, ssl_context=context)
        self._host = host
        self._port = port
        self._limits = limits
        self._count_refusal = count_refusal
        self._pending = 0
        # Each handshake's task and its raw transport: stop() aborts a task's connection
        # even when the task is cancelled before it ever ran.
        self._handshakes: dict[asyncio.Task[None], asyncio.Transport] = {}
        self._bound: tuple[str, int] | None = None
        self._closing = False

    @property
    def name(self) -> str:
        host, port = self._bound or (self._host, self._port)
        return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"

    @property
    def pending(self) -> int:
        """Connections accepted and still in their TLS handshake."""
        return self._pending

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Gate(self), self._host, self._port, backlog=self._backlog
        )
        address = self._server.sockets[0].getsockname()
        self._bound = (address[0], address[1])

    async def stop(self) -> None:
        # Nothing new is accepted first: a connection taken while we wait below would
        # start a handshake nobody cancels.
        self._closing = True
        if self._server is not None:
            self._server.close()
        tasks = list(self._handshakes)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await super().stop()

    def _accept(self, transport: asyncio.Transport) -> None:
        if self._closing:
            transport.abort()
            return
        remote = transport.get_extra_info("peername")
        if self._pending >= self._limits.max_pending:
            log.warning(
                "refused admin connection from %s: %d connections are already in their "
                "TLS handshake",
                remote,
                self._pending,
            )
            self._count_refusal(AdminRefusal.TOO_MANY_PENDING)
            transport.abort()
            return
        self._pending += 1
        task = asyncio.get_running_loop().create_task(self._secure(transport, remote))
        self._handshakes[task] = transport
        task.add_done_callback(self._handshake_over)

    def _handshake_over(self, task: asyncio.Task[None]) -> None:
        """Counted down here, not in the task: a task cancelled before it ran never
        enters its body."""
        transport = self._handshakes.pop(task)
        self._pending -= 1
        if task.cancelled() or task.exception() is not None:
            transport.abort()  # (a no-op when start_tls already closed it)
            if not task.cancelled():
                log.error("admin connection handshake failed", exc_info=task.exception())

    async def _secure(self, transport: asyncio.Transport, remote: object) -> None:
        server = self._runner.server
        if server is None or self._ssl_context is None:  # the runner was cleaned up
            transport.abort()
            return
        early = _Handoff()
        try:
            tls = await asyncio.get_running_loop().start_tls(
                transport,
                early,
                self._ssl_context,
                server_side=True,
                ssl_handshake_timeout=self._limits.handshake_timeout_s,
            )
        except OSError as exc:  # ssl.SSLError, a timeout (ConnectionAbortedError), a reset
            log.info("admin connection from %s failed its TLS handshake: %s", remote, exc)
            self._count_refusal(_handshake_refusal(exc))
            transport.abort()
            return
        if tls is None:  # closed without an error during the handshake
            self._count_refusal(AdminRefusal.CLOSED_IN_HANDSHAKE)
            transport.abort()
            return
        early.hand_to(server(), tls)


class _Handoff(asyncio.Protocol):
    """The TLS connection's protocol until aiohttp's handler takes it: with TLS 1.3 the
    first request can arrive with the client's last handshake message, before
    ``start_tls`` returns; it is kept here and passed on after ``connection_made``."""

    def __init__(self) -> None:
        self._data: list[bytes] = []
        self._eof = False
        self._lost: tuple[Exception | None] | None = None

    def data_received(self, data: bytes) -> None:
        self._data.append(data)

    def eof_received(self) -> bool:
        self._eof = True
        return True  # keep the transport open: the handler decides once it has it

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = (exc,)

    def hand_to(self, handler: asyncio.Protocol, tls: asyncio.BaseTransport) -> None:
        tls.set_protocol(handler)
        handler.connection_made(tls)
        for data in self._data:
            handler.data_received(data)
        if self._eof and not handler.eof_received():
            tls.close()  # what asyncio does when a protocol does not keep a half-closed one
        if self._lost is not None:
            handler.connection_lost(self._lost[0])


class _Gate(asyncio.Protocol):
    """A new connection's protocol until its handshake starts: nothing is read before."""

    def __init__(self, site: GatedTlsSite) -> None:
        self._site = site

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()
        self._site._accept(transport)
