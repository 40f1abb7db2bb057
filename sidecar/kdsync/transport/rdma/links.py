"""``RdmaTransport``: the TCP transport's links, with their frames moved to queue pairs.

Everything about who may connect stays with TCP and mutual TLS
(``kdsync.transport.tcp``): dialling, the certificate and hello checks, reconnecting,
the bounded queues. When both ends offered RDMA in the handshake, the authenticated
connection then carries the queue pairs' setup and stays open as the link's control
channel:

1. the dialer (the sending side) makes a queue pair and sends its number, packet
   sequence number, GID and MTU, as one frame;
2. the listener makes its own, posts ``receive_buffers`` buffers, connects it, and
   answers with its own details, the number of credits and the buffer size;
3. frames then travel over the queue pair (``stream``), and the listener grants
   credits back on the TLS connection as it re-posts buffers.

A peer that failed the TLS or hello checks gets no queue pair, and a connected queue
pair takes packets only from the one remote queue pair it was connected to, so the
RDMA path carries only authenticated members' frames. Links use send and receive, never
remote memory access: no memory key leaves a member. Either end closing the TLS
connection (a crash closes it too) ends the link and frees its queue pair; the sender
then reconnects as on TCP. Completions wake the event loop through the completion
channel's descriptor, so an idle link costs no CPU.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import deque
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from kdsync.transport.base import ReceivedFrame
from kdsync.transport.framing import encode_frame, read_frame
from kdsync.transport.rdma.pyverbs_device import PyverbsDevice
from kdsync.transport.rdma.stream import GRANT, FrameAssembler, Outgoing
from kdsync.transport.rdma.verbs import (
    Completion,
    QueuePairInfo,
    RdmaUnavailable,
    VerbsDevice,
    VerbsLink,
)
from kdsync.transport.rdma_config import RdmaSettings
from kdsync.transport.tcp.connect_phase import Resolver, system_resolver
from kdsync.transport.tcp.connections import TcpTransport
from kdsync.transport.tcp.handshake import HandshakeError
from kdsync.transport.tcp.peer import Peer
from kdsync.transport.tcp.receiving import frame_timeout, watch_for_close
from kdsync.transport.tcp_config import TcpTransportConfig

logger = logging.getLogger(__name__)

_SETUP_FRAME_BYTES = 4096
# Frames taken from the send queue at a time (as on TCP).
_TAKE_BYTES = 1024 * 1024


def open_pyverbs_device(settings: RdmaSettings) -> VerbsDevice:
    return PyverbsDevice(settings.device, settings.port, settings.gid_index)


class RdmaTransport(TcpTransport):
    """``PeerTransport`` whose links move frames over RDMA queue pairs where both ends
    can, and over TCP where the peer cannot (a member without RDMA in the same group).

    ``open_device`` opens the verbs device at ``start``; it raises RdmaUnavailable when
    the host has no usable device, and then the transport fails to start, or with
    ``settings.fallback_to_tcp`` runs every link on TCP (``fallback_reason`` says why).
    """

    def __init__(
        self,
        config: TcpTransportConfig,
        settings: RdmaSettings,
        *,
        open_device: Callable[[RdmaSettings], VerbsDevice] = open_pyverbs_device,
        jitter: Callable[[], float] = random.random,
        registry: CollectorRegistry | None = None,
        resolve: Resolver = system_resolver,
    ) -> None:
        super().__init__(config, jitter=jitter, registry=registry, resolve=resolve)
        self.settings = settings
        self._open_device = open_device
        self._device: VerbsDevice | None = None
        self.fallback_reason: str | None = None
        # Which links run over RDMA now: peers this member sends to, and receives from.
        self.rdma_outbound: set[str] = set()
        self.rdma_inbound: set[str] = set()
        # Per peer: how often frames waited because the receiver had no buffer posted
        # (a slow receiver; all of them waiting means it has stopped taking frames).
        self.credit_waits: dict[str, int] = dict.fromkeys(self.peers, 0)

    @property
    def device_description(self) -> str | None:
        return None if self._device is None else self._device.description

    def open_device(self) -> None:
        """Open the verbs device (``start`` does it too): RdmaUnavailable if there is none
        usable, unless ``fallback_to_tcp``. Callers open it early to fail before they
        set up anything else."""
        if self._device is not None or self.fallback_reason is not None:
            return
        try:
            self._device = self._open_device(self.settings)
        except RdmaUnavailable as exc:
            if not self.settings.fallback_to_tcp:
                raise
            self.fallback_reason = str(exc)
            logger.warning(
                "RDMA is unavailable, so member %s uses TCP for every peer link "
                "(transport.rdma.fallbackToTcp): %s",
                self.config.member,
                exc,
            )
        else:
            self.offers_rdma = True
            logger.info("peer links use RDMA on %s where peers can", self._device.description)

    async def start(self) -> None:
        self.open_device()
        await super().start()

    async def close(self) -> None:
        await super().close()
        if self._device is not None:
            self._device.close()
            self._device = None

    # -- sending ---------------------------------------------------------------------

    async def _send_frames(
        self, peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rdma: bool
    ) -> None:
        if not rdma or self._device is None:
            await super()._send_frames(peer, reader, writer, rdma)
            return
        link = self._device.link(self.settings.send_buffers, self.settings.buffer_bytes)
        try:
            async with asyncio.timeout(self.config.handshake_timeout_s):
                writer.write(_setup_frame(link.info))
                await writer.drain()
                answer = _parse_setup(await read_frame(reader, _SETUP_FRAME_BYTES), peer.name)
                if not answer.credits:
                    raise HandshakeError(f"member {peer.name}'s RDMA setup grants no credits")
                link.connect(answer.remote)
            outgoing = Outgoing(
                min(answer.buffer_bytes, self.settings.buffer_bytes),
                self.settings.send_buffers,
                answer.credits,
            )
            self.rdma_outbound.add(peer.name)
            logger.info("frames to peer %s go over RDMA", peer.name)
            await _Sender(peer, link, outgoing, reader, self.credit_waits).run()
        finally:
            self.rdma_outbound.discard(peer.name)
            link.close()

    # -- receiving -------------------------------------------------------------------

    async def _take_frames(
        self, peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rdma: bool
    ) -> None:
        if not rdma or self._device is None:
            await super()._take_frames(peer, reader, writer, rdma)
            return
        buffers = self.settings.receive_buffers
        async with asyncio.timeout(self.config.handshake_timeout_s):
            offer = _parse_setup(await read_frame(reader, _SETUP_FRAME_BYTES), peer.name)
        link = self._device.link(buffers, self.settings.buffer_bytes)
        try:
            link.connect(offer.remote)
            for slot in range(buffers):
                link.post_receive(slot)
            writer.write(_setup_frame(link.info, buffers, self.settings.buffer_bytes))
            await writer.drain()
            self.rdma_inbound.add(peer.name)
            await self._receive_over(peer, link, reader, writer)
        finally:
            self.rdma_inbound.discard(peer.name)
            link.close()

    async def _receive_over(
        self,
        peer: Peer,
        link: VerbsLink,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        assembler = FrameAssembler(self.config.max_frame_bytes)
        arrivals = _Completions(link)
        closed = asyncio.create_task(
            watch_for_close(reader, "an RDMA link's control connection"),
            name=f"kdsync-rdma-watch-{peer.name}",
        )
        half = max(1, self.settings.receive_buffers // 2)
        to_grant = 0
        try:
            while True:
                if not arrivals.ready:
                    if to_grant:  # nothing else waiting: hand back what was re-posted
                        writer.write(GRANT.pack(to_grant))
                        to_grant = 0
                    await self._next_arrival(peer, arrivals, closed, assembler.partial)
                completion = arrivals.ready.popleft()
                if completion.error is not None:
                    raise ConnectionResetError(f"RDMA receive failed: {completion.error}")
                message = link.read(completion.slot, completion.length)
                link.post_receive(completion.slot)
                to_grant += 1
                for frame in assembler.feed(message):
                    peer.frames_received += 1
                    peer.bytes_received += len(frame)
                    await self._inbound.put(ReceivedFrame(peer.name, frame))
                if to_grant >= half:
                    writer.write(GRANT.pack(to_grant))
                    to_grant = 0
        finally:
            arrivals.stop()
            closed.cancel()
            await asyncio.gather(closed, return_exceptions=True)

    async def _next_arrival(
        self, peer: Peer, arrivals: _Completions, closed: asyncio.Task[None], partial: bool
    ) -> None:
        """Wait for a message; a frame begun must go on within the frame timeout, as on
        TCP (a peer cannot hold a link open mid-frame)."""
        waiting = asyncio.create_task(arrivals.wait())
        try:
            done, _ = await asyncio.wait(
                {waiting, closed},
                timeout=self.config.frame_timeout_s if partial else None,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            waiting.cancel()
        if closed in done:
            closed.result()  # raises why the link ended
        if not done:
            raise frame_timeout(peer.name, self.config.frame_timeout_s)


class _Setup:
    """A parsed setup frame: the other end's queue pair, and from the receiver its
    credits and buffer size."""

    def __init__(self, remote: QueuePairInfo, credits: int, buffer_bytes: int) -> None:
        self.remote = remote
        self.credits = credits
        self.buffer_bytes = buffer_bytes


def _setup_frame(info: QueuePairInfo, credits: int = 0, buffer_bytes: int = 0) -> bytes:
    message: dict[str, Any] = {"queuePair": info.to_json()}
    if credits:
        message.update(credits=credits, bufferBytes=buffer_bytes)
    return encode_frame(json.dumps(message, separators=(",", ":")).encode())


def _parse_setup(frame: bytes, peer: str) -> _Setup:
    try:
        message = json.loads(frame)
        if not isinstance(message, dict):
            raise ValueError("not an object")
        remote = QueuePairInfo.from_json(message.get("queuePair"))
        credits = message.get("credits", 0)
        buffer_bytes = message.get("bufferBytes", 0)
        if not (isinstance(credits, int) and isinstance(buffer_bytes, int)):
            raise ValueError("credits and bufferBytes must be integers")
        if credits and (credits < 1 or buffer_bytes < 64):
            raise ValueError(f"{credits} credits of {buffer_bytes} bytes")
    except ValueError as exc:
        raise HandshakeError(f"member {peer} sent a bad RDMA setup: {exc}") from exc
    return _Setup(remote, credits, buffer_bytes)


class _Completions:
    """Completions of one link, gathered when its channel's descriptor is readable."""

    def __init__(self, link: VerbsLink) -> None:
        self._link = link
        self.ready: deque[Completion] = deque()
        self._arrived = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(link.fileno(), self._collect)
        self._collect()  # anything that completed before the reader was added

    def _collect(self) -> None:
        found = self._link.completions()
        if found:
            self.ready.extend(found)
            self._arrived.set()

    async def wait(self) -> None:
        while not self.ready:
            self._arrived.clear()
            await self._arrived.wait()

    def stop(self) -> None:
        self._loop.remove_reader(self._link.fileno())


class _Sender:
    """Moves one peer's queued frames over its link as credits and send buffers allow."""

    def __init__(
        self,
        peer: Peer,
        link: VerbsLink,
        outgoing: Outgoing,
        reader: asyncio.StreamReader,
        credit_waits: dict[str, int],
    ) -> None:
        self._peer = peer
        self._link = link
        self._outgoing = outgoing
        self._reader = reader
        self._credit_waits = credit_waits
        self._can_send = asyncio.Event()

    async def run(self) -> None:
        """Returns only by raising: the link failed or the receiver closed it."""
        completions = _Completions(self._link)
        tasks = [
            asyncio.create_task(self._take_grants(), name=f"kdsync-rdma-grants-{self._peer.name}"),
            asyncio.create_task(self._send_queued(), name=f"kdsync-rdma-send-{self._peer.name}"),
            asyncio.create_task(self._settle(completions), name="kdsync-rdma-completions"),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
            raise ConnectionResetError("link ended")
        finally:
            completions.stop()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _take_grants(self) -> None:
        while True:
            try:
                data = await self._reader.readexactly(GRANT.size)
            except asyncio.IncompleteReadError:
                raise ConnectionResetError("peer closed the connection") from None
            (credits,) = GRANT.unpack(data)
            self._outgoing.grant(credits)
            self._can_send.set()

    async def _settle(self, completions: _Completions) -> None:
        while True:
            await completions.wait()
            while completions.ready:
                completion = completions.ready.popleft()
                if completion.error is not None:
                    raise ConnectionResetError(f"RDMA send failed: {completion.error}")
                self._outgoing.sent(completion.slot)
            self._can_send.set()

    async def _send_queued(self) -> None:
        peer, outgoing, link = self._peer, self._outgoing, self._link
        while True:
            if not outgoing.pending_bytes:
                frames = await peer.queue.take_batch(_TAKE_BYTES)
                outgoing.add_frames(frames)
                peer.frames_sent += len(frames)
                peer.bytes_sent += sum(len(frame) for frame in frames)
            while (message := outgoing.next_message()) is not None:
                link.post_send(*message)
            if outgoing.pending_bytes:
                if outgoing.credits <= 0:
                    # get: a peer added at runtime has no entry yet
                    self._credit_waits[peer.name] = self._credit_waits.get(peer.name, 0) + 1
                self._can_send.clear()
                await self._can_send.wait()
