"""The driver's frame port over the peer transport, following the group's membership.

The sidecar runs it over its TCP or RDMA transport; the simulator runs it over its
network in scenarios with ``product_links``, and there refuses and drops frames as the
product does.

The transport starts with the members of the startup file. When the configuration in
use changes (``FrameSender.follow_configuration``), or a recovering witness hears of one
(``reach_members``), a member added at runtime is dialled at the address its
configuration entry carries, and accepted from then on; that happens before the driver
sends it anything. An address recorded in the log wins over the startup file's. Members
that left are retired (``retire_departed``) once their removal commits: until then the
change may still be cut from the log. A member that dials us saying its membership comes
from its log, at a configuration index past ours, is linked at the address it gives
(``heard_from``), even if we do not know it or retired it: it was added (or added again)
while our log is behind, and may lead. It stays linked until our log has committed that
index (our configuration in force then names it, or a later change removed it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from kdsync.ordering import Configuration, OrderingNode, Role

log = logging.getLogger(__name__)


class LinkedPeers(Protocol):
    """What the links need of a peer transport (``kdsync.transport.PeerTransport`` has
    it all; the simulator's network has just this)."""

    # Set once this member's membership comes from its log (the handshake then no longer
    # compares startup files).
    membership_changed: bool

    @property
    def member(self) -> str: ...

    @property
    def peers(self) -> tuple[str, ...]:
        """Every member linked since start, retired ones included."""
        ...

    # Called by the transport when a member dials it saying its membership comes from its
    # log, where it listens and its configuration index: True if it is linked now.
    introduce: Callable[[str, str, int], bool] | None
    # Where our configuration stands in our log: our hellos give it.
    config_index: int
    # Where our configuration says we listen: our hellos give it to a member that does
    # not know us yet (None: the startup file's entry).
    advertised_address: str | None

    def send(self, peer: str, frame: bytes) -> bool:
        """False if dropped (retired, queue full, closed); ValueError for a stranger."""
        ...

    def add_peer(self, peer: str, address: str) -> bool:
        """Dial ``peer`` at ``address`` and accept it; False if nothing changed;
        ValueError for an address that cannot be used."""
        ...

    def retire_peer(self, peer: str) -> bool:
        """Stop dialling ``peer`` and drop frames for it; False if it was already."""
        ...


class PeerLinks:
    def __init__(self, transport: LinkedPeers) -> None:
        self.transport = transport
        self._known = set(transport.peers)  # a set: send looks here for every frame
        self._unreachable: set[str] = set()  # logged once each
        self._dropped: set[str] = set()  # logged once each
        # Members that dialled us (heard_from) with a configuration past ours -> the
        # highest index their hellos gave: not retired for being outside our
        # configuration until our log has committed that index.
        self._introduced: dict[str, int] = {}
        self._retired: set[str] = set()  # by retire_departed, and not linked again since
        transport.introduce = self.heard_from

    def send(self, peer: str, frame: bytes) -> bool:
        if peer not in self._known:
            if peer not in self._dropped:
                self._dropped.add(peer)
                log.warning("no link to member %s (no address known): frames dropped", peer)
            return False
        return self.transport.send(peer, frame)

    def follow_configuration(self, config: Configuration, index: int) -> None:
        self.transport.membership_changed = index > 0
        self.transport.config_index = index
        self.transport.advertised_address = config.address_of(self.transport.member)
        self._reach(config, index)

    def reach_members(self, config: Configuration) -> None:
        self._reach(config, None)

    def _reach(self, config: Configuration, index: int | None) -> None:
        transport = self.transport
        for member in config.members:
            if member == transport.member:
                continue
            address = config.address_of(member)
            if address is None:
                if member not in self._known and member not in self._unreachable:
                    self._unreachable.add(member)
                    where = f"log index {index}" if index is not None else "heard in recovery"
                    log.error(
                        "member %s is in the group (%s) with no peer address, and this "
                        "member's startup file does not name it: it cannot be reached "
                        "unless a later configuration in the log removes it (as when a "
                        "new member catches up from before that removal); add members "
                        "with kdsync members add, which records the address",
                        member,
                        where,
                    )
                continue
            try:
                self._link(member, address)  # nothing when reached there already
            except ValueError as exc:
                log.error("member %s's address %r cannot be used: %s", member, address, exc)

    def _link(self, member: str, address: str) -> None:
        """Dial and accept ``member`` at ``address`` (again, if retired); ValueError for
        an address that cannot be used."""
        self.transport.add_peer(member, address)
        self._known.add(member)
        self._retired.discard(member)
        self._dropped.discard(member)

    def heard_from(self, peer: str, address: str, config_index: int) -> bool:
        """``peer`` dialled us, saying its membership comes from its log, where it
        listens, and that its configuration stands at ``config_index`` of its log. Past
        ours, it may be a member added (or added again) while our log is behind, which
        our startup file does not name or our older configuration made us retire: link
        it there, so that we can answer its Appends and catch up to the configuration
        that adds it (refused, it would lead without us for good), and do not retire it
        until our log has committed that index. True if it is linked now; False for
        ourselves, an unusable address, or a member we do not link whose configuration
        is not past ours (one that left the group, or never joined: a stranger is then
        refused, a retired member stays retired). The claim is the dialler's own word,
        taken only where a certificate of the group's CA backs its name (the transport
        asks only in TLS mode)."""
        if peer == self.transport.member:
            return False
        linked = peer in self._known and peer not in self._retired
        if config_index <= self.transport.config_index:
            if peer not in self._known:
                log.info(
                    "refused member %s: its configuration (log index %d) is not past ours "
                    "(%d), which does not name it",
                    peer,
                    config_index,
                    self.transport.config_index,
                )
            return linked
        if not linked:
            try:
                self._link(peer, address)
            except ValueError as exc:
                log.error(
                    "member %s dialled us from an unusable address %r: %s", peer, address, exc
                )
                return False
            log.info(
                "linked member %s at %s: it dialled us with a configuration past ours "
                "(log index %d against %d)",
                peer,
                address,
                config_index,
                self.transport.config_index,
            )
        self._introduced[peer] = max(config_index, self._introduced.get(peer, 0))
        return True

    def retire_departed(self, node: OrderingNode) -> list[str]:
        """Stop dialling the members outside the configuration in force, once it is
        committed (the startup file may still name them); the members newly retired.
        Not while a witness recovers: its configuration is the startup file's until the
        answers are in, and the members they named are the ones it must reach."""
        commit = node.status().commit_index
        if node.role == Role.RECOVERING or node.config_index > commit:
            return []
        members = set(node.config.members)
        # Our log committed past the index a claim gave, and the configuration in force
        # does not name the member: whatever stood there (cut, or a removal since), the
        # claim is spent.
        settled = [p for p, index in self._introduced.items() if index <= commit]
        for name in settled:
            del self._introduced[name]
        # They stay known: frames a removed member still draws (refused votes) are
        # dropped by the transport without a word, as for any retired peer.
        retired = [
            name
            for name in self.transport.peers
            if name not in members
            and name not in self._introduced
            and self.transport.retire_peer(name)
        ]
        self._retired.update(retired)
        return retired
