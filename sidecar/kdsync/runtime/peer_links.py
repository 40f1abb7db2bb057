"""The driver's frame port over the peer transport, following the group's membership.

The transport starts with the members of the startup file. When the configuration in
use changes (``FrameSender.follow_configuration``), a member added at runtime is dialled
at the address its configuration entry carries, and accepted from then on; that happens
before the driver sends it anything. Members that left are retired by the sidecar once
their removal commits (until then the change may still be cut from the log).
"""

from __future__ import annotations

import logging

from kdsync.ordering import Configuration
from kdsync.transport import PeerTransport

log = logging.getLogger(__name__)


class PeerLinks:
    def __init__(self, transport: PeerTransport) -> None:
        self.transport = transport
        self._unreachable: set[str] = set()  # logged once each

    def send(self, peer: str, frame: bytes) -> bool:
        if peer not in self.transport.peers:
            return False  # a member with no address (logged by follow_configuration)
        return self.transport.send(peer, frame)

    def follow_configuration(self, config: Configuration, index: int) -> None:
        transport = self.transport
        transport.membership_changed = index > 0
        known = set(transport.peers)
        for member in config.members:
            if member == transport.member:
                continue
            address = config.address_of(member)
            if address is None:
                if member not in known and member not in self._unreachable:
                    self._unreachable.add(member)
                    log.error(
                        "member %s joined the group (log index %d) with no peer address, "
                        "and this member's startup file does not name it: it cannot be "
                        "reached; add members with kdsync members add, which records it",
                        member,
                        index,
                    )
                continue
            try:
                transport.add_peer(member, address)  # nothing when reached already
            except ValueError as exc:
                log.error("member %s's address %r cannot be used: %s", member, address, exc)
