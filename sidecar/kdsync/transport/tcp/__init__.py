"""Peer transport over asyncio TCP with mutual TLS: ``TcpTransport``.

Modules: ``connections`` (the transport: listening, dialling, reconnecting, sending),
``peer`` (what it keeps per peer), ``receiving`` (reading a link's frames, with a deadline
per frame), ``handshake`` (who may connect: certificate, hello/welcome, the agreement
check), ``connect_phase`` (a dial's TCP handshake, which gives way when the peer reaches
us), ``flow`` (the bounded send queues and inbound buffer), ``backoff`` (reconnect
delays) and ``streams`` (socket options, closing, describing link errors).
"""

from kdsync.transport.tcp.connections import TcpTransport

__all__ = ["TcpTransport"]
