"""An aiohttp site for the admin listener that bounds connections still in their TLS
handshake, as the peer port does (``transport.tcp.connections``): at most
``max_pending`` at a time (one more is closed at once), each finished within
``handshake_timeout_s`` or closed.

aiohttp's ``TCPSite`` passes neither to asyncio, which then waits 60 s for a handshake
and takes any number: clients that open connections and send nothing would each hold a
socket and its buffers for a minute. Here the listening socket carries a gate protocol
that pauses reading, counts the connection, and upgrades it with ``loop.start_tls``;
only a verified connection reaches aiohttp's request handler.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass

from aiohttp import web

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HandshakeLimits:
    # The peer port's defaults (``TcpTransportConfig``): an operator needs one or two.
    max_pending: int = 32
    handshake_timeout_s: float = 10.0


class GatedTlsSite(web.BaseSite):
    __slots__ = ("_bound", "_handshakes", "_host", "_limits", "_pending", "_port")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        context: ssl.SSLContext,
        limits: HandshakeLimits,
    ) -> None:
        super().__init__(runner, ssl_context=context)
        self._host = host
        self._port = port
        self._limits = limits
        self._pending = 0
        self._handshakes: set[asyncio.Task[None]] = set()
        self._bound: tuple[str, int] | None = None

    @property
    def name(self) -> str:
        host, port = self._bound or (self._host, self._port)
        return f"https://{host}:{port}"

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
        for task in list(self._handshakes):
            task.cancel()
        await asyncio.gather(*self._handshakes, return_exceptions=True)
        await super().stop()

    def _accept(self, transport: asyncio.Transport) -> None:
        remote = transport.get_extra_info("peername")
        if self._pending >= self._limits.max_pending:
            log.warning(
                "refused admin connection from %s: %d connections are already in their "
                "TLS handshake",
                remote,
                self._pending,
            )
            transport.abort()
            return
        self._pending += 1
        task = asyncio.get_running_loop().create_task(self._secure(transport, remote))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _secure(self, transport: asyncio.Transport, remote: object) -> None:
        server = self._runner.server
        assert server is not None and self._ssl_context is not None
        handler = server()
        try:
            tls = await asyncio.get_running_loop().start_tls(
                transport,
                handler,
                self._ssl_context,
                server_side=True,
                ssl_handshake_timeout=self._limits.handshake_timeout_s,
            )
        except OSError as exc:  # ssl.SSLError, a timeout (ConnectionAbortedError), a reset
            log.info("admin connection from %s failed its TLS handshake: %s", remote, exc)
            transport.abort()
            return
        except asyncio.CancelledError:
            transport.abort()
            raise
        finally:
            self._pending -= 1
        if tls is None:  # the client went away as the handshake ended
            transport.abort()
            return
        handler.connection_made(tls)


class _Gate(asyncio.Protocol):
    """A new connection's protocol until its handshake starts: nothing is read before."""

    def __init__(self, site: GatedTlsSite) -> None:
        self._site = site

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()
        self._site._accept(transport)
