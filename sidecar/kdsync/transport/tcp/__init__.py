"""Peer transport over asyncio TCP with mutual TLS: ``TcpTransport``.

Modules: ``connections`` (the transport: listening, dialling, reconnecting, sending and
receiving), ``handshake`` (who may connect: certificate, hello/welcome, the agreement
check), ``flow`` (the bounded send queues and inbound buffer), ``backoff`` (reconnect
delays) and ``streams`` (socket options, closing, describing link errors).
"""

from kdsync.transport.tcp.connections import TcpTransport

__all__ = ["TcpTransport"]
