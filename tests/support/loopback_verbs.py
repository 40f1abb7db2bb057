"""An in-process verbs device for ``RdmaTransport`` tests without RDMA hardware.

It keeps the rules a real reliable-connected queue pair enforces, so the transport's
mistakes show here too: a send must find a receive posted at the other end (else the
send fails, as receiver-not-ready retries would), must fit the receiver's buffer, and
must be connected; a slot may not be posted twice; completions arrive through a
descriptor that becomes readable, as a completion channel's does. Every queue pair of
one ``Fabric`` can reach every other, as on one network.
"""

from __future__ import annotations

import itertools
import os
from collections import deque

from kdsync.transport.rdma.verbs import Completion, QueuePairInfo, RdmaUnavailable

_GID = "0000:0000:0000:0000:0000:ffff:7f00:0001"


class Fabric:
    """The queue pairs that can reach each other, and what the tests count."""

    def __init__(self) -> None:
        self.links: dict[int, LoopbackLink] = {}
        self._numbers = itertools.count(1)
        self.links_made = 0
        self.messages = 0
        self.largest_message = 0

    def device(self, available: bool = True) -> LoopbackDevice:
        if not available:
            raise RdmaUnavailable("no RDMA device: /sys/class/infiniband is empty (test)")
        return LoopbackDevice(self)

    def number(self) -> int:
        return next(self._numbers)


class LoopbackDevice:
    def __init__(self, fabric: Fabric) -> None:
        self._fabric = fabric

    @property
    def description(self) -> str:
        return f"loopback, GID {_GID}"

    def link(self, slots: int, buffer_bytes: int) -> LoopbackLink:
        self._fabric.links_made += 1
        return LoopbackLink(self._fabric, slots, buffer_bytes)

    def close(self) -> None:
        pass


class LoopbackLink:
    def __init__(self, fabric: Fabric, slots: int, buffer_bytes: int) -> None:
        self._fabric = fabric
        self._buffers = [bytearray(buffer_bytes) for _ in range(slots)]
        self._buffer_bytes = buffer_bytes
        self._posted: deque[int] = deque()
        self._remote: int | None = None
        self._done: list[Completion] = []
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        self.closed = False
        self._info = QueuePairInfo(fabric.number(), 0, _GID, 3)
        fabric.links[self._info.qpn] = self

    @property
    def info(self) -> QueuePairInfo:
        return self._info

    def connect(self, remote: QueuePairInfo) -> None:
        if remote.qpn not in self._fabric.links:
            raise OSError(f"no queue pair {remote.qpn} on the fabric")
        self._remote = remote.qpn

    def fileno(self) -> int:
        return self._read_fd

    def completions(self) -> list[Completion]:
        try:
            while os.read(self._read_fd, 4096):
                pass
        except BlockingIOError:
            pass
        done, self._done = self._done, []
        return done

    def _complete(self, completion: Completion) -> None:
        self._done.append(completion)
        os.write(self._write_fd, b"x")

    def post_receive(self, slot: int) -> None:
        assert not self.closed, "post_receive on a closed queue pair"
        assert slot not in self._posted, f"receive slot {slot} posted twice"
        self._posted.append(slot)

    def post_send(self, slot: int, message: bytes) -> None:
        assert not self.closed, "post_send on a closed queue pair"
        assert self._remote is not None, "post_send before connect"
        assert 0 <= slot < len(self._buffers)
        assert len(message) <= self._buffer_bytes, "message larger than the send buffer"
        remote = self._fabric.links.get(self._remote)
        if remote is None or remote.closed:
            self._complete(Completion(slot, 0, "retry exceeded: the remote queue pair is gone"))
            return
        if not remote._posted:
            self._complete(Completion(slot, 0, "receiver not ready: no receive posted"))
            return
        if len(message) > remote._buffer_bytes:
            self._complete(Completion(slot, 0, "remote length error"))
            return
        target = remote._posted.popleft()
        remote._buffers[target][: len(message)] = message
        self._fabric.messages += 1
        self._fabric.largest_message = max(self._fabric.largest_message, len(message))
        remote._complete(Completion(target, len(message), None))
        self._complete(Completion(slot, 0, None))

    def read(self, slot: int, length: int) -> bytes:
        return bytes(self._buffers[slot][:length])

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._fabric.links.pop(self._info.qpn, None)
        os.close(self._read_fd)
        os.close(self._write_fd)
