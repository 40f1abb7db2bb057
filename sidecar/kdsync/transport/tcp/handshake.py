"""Who may use a peer link: the handshake both sides run before any frame of the group.

After TCP (and TLS, unless insecure):

1. TLS mode: the listener maps the client certificate (already chain-verified against
   the group CA) to a member name and closes the connection, reading nothing, unless
   that name is a configured member of this group other than itself (or, when it takes
   members added while its log is behind, below, any member but itself). The dialer
   checks that the server certificate names the member it meant to reach.
2. The dialer sends a ``hello`` frame (JSON: version, group, member). In insecure
   mode this is the only identity there is; in TLS mode it must match the certificate.
3. The listener answers ``welcome`` (JSON: version, group, its member name); only
   then does the dialer count the link as connected and start writing queued frames.

Both frames also carry the member's *agreement* (the settings every member must share:
members, topics). A peer whose agreement differs is refused on both sides, with a
message naming what differs (``PeerConfigMismatch``). Once either side's membership comes
from its log (``"membershipChanged": true``: it was changed at runtime), the startup
files' member lists no longer decide who belongs, so they are not compared: a member
added since, or one whose file still names a removed member, is welcome; the log and the
transport's peer list (who may connect at all) decide. The role of each member both
lists name (witness or data member) is still compared: only the files say it.

Such a dialer's hello also says where it listens (``"address"``) and where its
configuration stands in its log (``"configIndex"``). A listener whose log is behind the
configuration that added the dialer may not know it yet, or may have retired it (its
own, older configuration leaves it out). Before its welcome it tells its transport's
``introduce`` (set by the driver's peer links), which links such a dialer when its index
is past the listener's own: the listener must answer the dialer's Appends to catch up to
that configuration, which a refusal would prevent for good once the dialer leads. In TLS
mode the certificate, from the group's CA, must still name the member the hello claims.

A dialer that can move frames over RDMA says so in its hello (``"rdma": true``); a
listener that can too answers the same in its welcome, and the link's frames then go
over a queue pair set up on this connection (``kdsync.transport.rdma``). A member that
does not know the field ignores it, so TCP and RDMA members mix, link by link.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Container, Mapping
from typing import Any, NamedTuple

from kdsync.transport.address import parse_address
from kdsync.transport.base import (
    Introduce,
    PeerAuthenticationError,
    TransportError,
    validate_member_name,
)
from kdsync.transport.framing import encode_frame, read_frame
from kdsync.transport.tcp.streams import detect_dead_peers
from kdsync.transport.tcp_config import TcpTransportConfig
from kdsync.transport.tls import member_from_peercert

HANDSHAKE_VERSION = 1
_MAX_HANDSHAKE_FRAME_BYTES = 4096


class HandshakeError(TransportError):
    """A malformed or unexpected hello/welcome."""


class PeerConfigMismatch(HandshakeError):
    """A member's group settings (members, topics) differ from ours: the link is refused."""


class Hello(NamedTuple):
    """What an accepted hello said: the member, and whether it offered RDMA."""

    member: str
    rdma: bool


# The agreement key that stops counting once a membership changed at runtime.
_MEMBERS_KEY = "members"


def _handshake_frame(
    kind: str,
    group: str,
    member: str,
    agreement: Mapping[str, Any] | None = None,
    rdma: bool = False,
    membership_changed: bool = False,
    address: str | None = None,
    config_index: int = 0,
) -> bytes:
    message: dict[str, Any] = {
        "kdsync": kind,
        "version": HANDSHAKE_VERSION,
        "group": group,
        "member": member,
    }
    if agreement:
        message["agreement"] = dict(agreement)
    if rdma:
        message["rdma"] = True
    if membership_changed:
        message["membershipChanged"] = True
        if address is not None:
            message["address"] = address
        if config_index:
            message["configIndex"] = config_index
    return encode_frame(json.dumps(message, separators=(",", ":")).encode())


def _disagreement(
    ours: Mapping[str, Any], frame: bytes, peer: str, membership_changed: bool
) -> str | None:
    """What differs between our agreement and the one in a (parsed-valid) handshake frame;
    None when they agree, or when either side sends none (a member from before the check).
    The member lists count only while neither side's membership changed at runtime."""
    message = json.loads(frame)
    theirs = message.get("agreement")
    if not ours or not isinstance(theirs, dict):
        return None
    changed = membership_changed or bool(message.get("membershipChanged"))
    skipped = {_MEMBERS_KEY} if changed else set()
    differences = [
        f"{key}: {json.dumps(ours.get(key))} here, {json.dumps(theirs.get(key))} at {peer}"
        for key in sorted((set(ours) | set(theirs)) - skipped)
        if json.loads(json.dumps(ours.get(key))) != theirs.get(key)
    ]
    if changed:
        differences += _role_differences(ours.get(_MEMBERS_KEY), theirs.get(_MEMBERS_KEY), peer)
    if not differences:
        return None
    return (
        f"member {peer}'s configuration disagrees with this member's ("
        + "; ".join(differences)
        + "); every member needs the same members and topics settings"
    )


def _role_differences(ours: object, theirs: object, peer: str) -> list[str]:
    """Members both lists name with a different role (witness or data member). The log
    never says which a member is, its own file does: a member restarted as the other
    kind would keep nothing durable where the group counts on it, or vote afresh."""
    mine, yours = _roles(ours), _roles(theirs)
    return [
        f"members: {name} is a {_kind(mine[name])} here, a {_kind(yours[name])} at {peer}"
        for name in sorted(mine.keys() & yours.keys())
        if mine[name] != yours[name]
    ]


def _roles(members: object) -> dict[str, bool]:
    """{name: witness} from an agreement's members list ([[name, witness], ...])."""
    if not isinstance(members, list):
        return {}
    return {
        entry[0]: bool(entry[1])
        for entry in members
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
    }


def _kind(witness: bool) -> str:
    return "witness" if witness else "data member"


def _parse_handshake(frame: bytes, kind: str, group: str) -> str:
    """Validate a hello/welcome frame and return the member it names."""
    try:
        message = json.loads(frame)
    except ValueError as exc:
        raise HandshakeError(f"{kind} is not valid JSON") from exc
    if not isinstance(message, dict) or message.get("kdsync") != kind:
        raise HandshakeError(f"expected a {kind} message")
    if message.get("version") != HANDSHAKE_VERSION:
        raise HandshakeError(
            f"{kind} has protocol version {message.get('version')!r}; "
            f"this member speaks {HANDSHAKE_VERSION}"
        )
    if message.get("group") != group:
        raise HandshakeError(f"{kind} is for group {message.get('group')!r}, not {group!r}")
    member = message.get("member")
    if not isinstance(member, str):
        raise HandshakeError(f"{kind} names no member")
    return member


async def handshake_as_dialer(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    config: TcpTransportConfig,
    peer: str,
    address: str,
    *,
    tls: bool,
    rdma: bool = False,
    membership_changed: bool = False,
    own_address: str | None = None,
    config_index: int = 0,
) -> bool:
    """Make sure the listener at ``address`` is member ``peer`` and agrees with us.
    Returns whether the link moves its frames over RDMA (``rdma``: we offer it).
    ``membership_changed``: our membership comes from our log (see the module doc);
    the hello then says ``own_address``, where we listen, and ``config_index``, where
    our configuration stands in our log.

    Raises PeerAuthenticationError, HandshakeError (PeerConfigMismatch when the
    agreements differ), or what reading the stream raises.
    """
    if tls:
        presented = member_from_peercert(writer.get_extra_info("peercert"), config.group)
        if presented != peer:
            raise PeerAuthenticationError(
                f"{address} presented a certificate for member {presented!r}, expected {peer!r}"
            )
    writer.write(
        _handshake_frame(
            "hello",
            config.group,
            config.member,
            config.agreement,
            rdma,
            membership_changed,
            own_address,
            config_index,
        )
    )
    await writer.drain()
    welcome = await read_frame(reader, _MAX_HANDSHAKE_FRAME_BYTES)
    answered_as = _parse_handshake(welcome, "welcome", config.group)
    if answered_as != peer:
        raise PeerAuthenticationError(
            f"{address} answered as member {answered_as!r}, expected {peer!r}"
        )
    disagreement = _disagreement(config.agreement, welcome, peer, membership_changed)
    if disagreement is not None:
        raise PeerConfigMismatch(disagreement)
    return rdma and json.loads(welcome).get("rdma") is True


async def handshake_as_listener(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    config: TcpTransportConfig,
    peers: Container[str],
    *,
    tls: bool,
    rdma: bool = False,
    membership_changed: bool = False,
    introduce: Introduce | None = None,
) -> Hello:
    """Authenticate an inbound connection; returns the member it belongs to, and whether
    its frames come over RDMA (it offered it and ``rdma``: we accept it). Raises like
    ``handshake_as_dialer``.

    The member must be one of ``peers`` once its hello is read. A hello saying its
    membership changed at runtime, where it listens and its configuration index is
    first passed to ``introduce`` (the transport's), which may add the member to
    ``peers`` (a member added while our log is behind) or keep it from being retired:
    before the welcome, so that a member refused hears no welcome."""
    certified: str | None = None
    if tls:
        certified = member_from_peercert(writer.get_extra_info("peercert"), config.group)
        # Checked before reading anything: without ``introduce``, a stranger gets no say
        # in what we parse. With it, a certificate of the group's CA naming a member we
        # do not know may be one added while our log is behind: its hello (at most 4 KiB,
        # within the handshake's deadline) is read, and decides.
        if introduce is None or certified == config.member:
            _check_is_peer(certified, peers, config.group)
    hello = await read_frame(reader, _MAX_HANDSHAKE_FRAME_BYTES)
    claimed = _parse_handshake(hello, "hello", config.group)
    if certified is not None and claimed != certified:
        raise PeerAuthenticationError(
            f"hello claims member {claimed!r} but the certificate names {certified!r}"
        )
    disagreement = _disagreement(config.agreement, hello, claimed, membership_changed)
    claim = _membership_claim(hello)
    if introduce is not None and claim is not None and disagreement is None:
        introduce(claimed, *claim)  # (our own name: refused below, as peers lack it)
    _check_is_peer(claimed, peers, config.group)
    detect_dead_peers(writer)
    use_rdma = rdma and json.loads(hello).get("rdma") is True
    # The welcome carries our agreement even to a member that disagrees, so both
    # sides can say what differs; the link is then refused.
    writer.write(
        _handshake_frame(
            "welcome",
            config.group,
            config.member,
            config.agreement,
            use_rdma,
            membership_changed,
        )
    )
    await writer.drain()
    if disagreement is not None:
        raise PeerConfigMismatch(disagreement)
    return Hello(claimed, use_rdma)


def _membership_claim(hello: bytes) -> tuple[str, int] | None:
    """Where a dialler listens and where its configuration stands in its log, if its
    hello says its membership changed at runtime and both are usable."""
    message = json.loads(hello)
    address, index = message.get("address"), message.get("configIndex")
    if (
        message.get("membershipChanged") is not True
        or not isinstance(address, str)
        or not isinstance(index, int)
        or isinstance(index, bool)
    ):
        return None
    try:
        validate_member_name(message["member"])
        parse_address(address)
    except ValueError:
        return None
    return address, index


def _check_is_peer(name: str, peers: Container[str], group: str) -> None:
    if name not in peers:
        raise PeerAuthenticationError(f"{name!r} is not another member of group {group!r}")
