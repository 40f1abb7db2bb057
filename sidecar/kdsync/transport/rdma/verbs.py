"""The port between the RDMA transport and a verbs device: one queue pair per link.

``RdmaTransport`` only needs a few operations of a reliable-connected queue pair with
registered buffers, so it talks to this interface, not to pyverbs: ``pyverbs_device``
implements it on a real device (a NIC, or Soft-RoCE in CI), and the unit tests use an
in-process one (``tests/support/loopback_verbs.py``), so the transport's logic is tested
without a device, and the same tests run again on a real one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from kdsync.transport.base import TransportError

_GID = re.compile(r"^[0-9a-f]{4}(:[0-9a-f]{4}){7}$")


class RdmaUnavailable(TransportError):
    """This host or pod cannot do RDMA as configured; the message names what is missing
    and how to fix it."""


class RdmaLinkError(TransportError):
    """The device refused an operation on a link's queue pair: the link ends (and is
    set up again, as after any link failure)."""


@dataclass(frozen=True)
class QueuePairInfo:
    """What the other end needs to connect to a queue pair (sent in the handshake).

    There is no memory key: links use send/receive only, so a peer never gets access to
    this member's memory, only to the buffers posted for it."""

    qpn: int
    psn: int
    gid: str
    mtu: int

    def to_json(self) -> dict[str, Any]:
        return {"qpn": self.qpn, "psn": self.psn, "gid": self.gid, "mtu": self.mtu}

    @classmethod
    def from_json(cls, value: object) -> QueuePairInfo:
        """Parse what a peer sent; ValueError naming the problem if it is malformed."""
        if not isinstance(value, dict):
            raise ValueError("queue pair info is not an object")
        qpn, psn, gid, mtu = (value.get(k) for k in ("qpn", "psn", "gid", "mtu"))
        if not (isinstance(qpn, int) and 0 < qpn < 2**24):
            raise ValueError(f"bad queue pair number {qpn!r}")
        if not (isinstance(psn, int) and 0 <= psn < 2**24):
            raise ValueError(f"bad packet sequence number {psn!r}")
        if not (isinstance(gid, str) and _GID.fullmatch(gid)):
            raise ValueError(f"bad GID {gid!r}")
        if not (isinstance(mtu, int) and 1 <= mtu <= 5):
            raise ValueError(f"bad path MTU {mtu!r}")
        return cls(qpn, psn, gid, mtu)


class Completion(NamedTuple):
    """A finished work request: the buffer slot it used and, for a receive, the length.

    ``error`` is None on success, else the device's status, e.g. a flush after the queue
    pair failed."""

    slot: int
    length: int
    error: str | None


class VerbsLink(Protocol):
    """One reliable-connected queue pair, its completion queue and channel, and
    ``slots`` registered buffers of ``buffer_bytes`` each (for sending or receiving)."""

    @property
    def info(self) -> QueuePairInfo: ...

    def connect(self, remote: QueuePairInfo) -> None:
        """Bring the queue pair to ready-to-send, connected to ``remote``."""
        ...

    def fileno(self) -> int:
        """A descriptor that becomes readable when completions may be waiting."""
        ...

    def completions(self) -> list[Completion]:
        """Take the completion event (if any), re-arm notification, and return every
        completion waiting. Never blocks."""
        ...

    def post_receive(self, slot: int) -> None: ...

    def post_send(self, slot: int, message: bytes) -> None:
        """Copy ``message`` into the slot's buffer and send it (signalled)."""
        ...

    def read(self, slot: int, length: int) -> bytes:
        """The first ``length`` bytes a receive put in ``slot``."""
        ...

    def close(self) -> None: ...


class VerbsDevice(Protocol):
    """An opened device port, from which links are made."""

    @property
    def description(self) -> str:
        """The device, port and GID in use, for the log and status."""
        ...

    def link(self, slots: int, buffer_bytes: int) -> VerbsLink: ...

    def close(self) -> None: ...
