"""Mutual TLS for peer links: SSL contexts and member identities in certificates.

Trust model: each group has its own CA, which signs one certificate per member. A
member's identity is the SAN URI ``kdsync://<group>/<member>`` in its certificate
(the CN carries the member name too, for humans, but is not trusted). Both sides
present a certificate and both verify the other's chain against the group CA; then
the listener checks the name is a configured member and the dialer checks the name is
the member it meant to reach. Host names are deliberately not checked: peer addresses
are whatever the deployment routes (IPs, Service names), and the identity that matters
is the member, which the CA vouches for.
"""

from __future__ import annotations

import ssl

from kdsync.transport.base import PeerAuthenticationError
from kdsync.transport.identity import MemberTlsFiles, parse_member_uri


def _base_context(purpose: int, files: MemberTlsFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(purpose)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED
    # Only the group CA is trusted: not the system store, which would let any
    # publicly-trusted certificate through the chain check.
    context.load_verify_locations(cafile=str(files.ca_cert))
    context.load_cert_chain(certfile=str(files.cert), keyfile=str(files.key))
    return context


def server_context(files: MemberTlsFiles) -> ssl.SSLContext:
    """Context for the listener: TLS 1.3 only, client certificate required."""
    context = _base_context(ssl.PROTOCOL_TLS_SERVER, files)
    # Peers never resume sessions; tickets would only cost a round of writes.
    context.num_tickets = 0
    return context


def client_context(files: MemberTlsFiles) -> ssl.SSLContext:
    """Context for dialling a peer: TLS 1.3 only, server chain checked against the group CA.

    Host-name checking is off because the member name is checked instead (see
    ``member_from_peercert``) right after the handshake.
    """
    context = _base_context(ssl.PROTOCOL_TLS_CLIENT, files)
    context.check_hostname = False
    return context


def member_uris_in_peercert(peercert: object) -> list[str]:
    """All URI SAN entries of a certificate as returned by ``SSLSocket.getpeercert()``."""
    if not isinstance(peercert, dict):
        return []
    alt_names = peercert.get("subjectAltName", ())
    uris: list[str] = []
    if isinstance(alt_names, tuple):
        for entry in alt_names:
            if (
                isinstance(entry, tuple)
                and len(entry) == 2
                and entry[0] == "URI"
                and isinstance(entry[1], str)
            ):
                uris.append(entry[1])
    return uris


def member_from_peercert(peercert: object, group: str) -> str:
    """The member a verified peer certificate names in ``group``.

    ``peercert`` is the dict from ``getpeercert()`` (or the ``peercert`` extra info of
    an asyncio transport) after chain verification. Raises PeerAuthenticationError
    unless the certificate names exactly one member, of this group.
    """
    named: list[tuple[str, str]] = []
    for uri in member_uris_in_peercert(peercert):
        parsed = parse_member_uri(uri)
        if parsed is not None:
            named.append(parsed)
    if not named:
        raise PeerAuthenticationError("peer certificate has no kdsync member URI")
    if len(named) > 1:
        # A certificate for several identities is a mis-issued certificate: refuse it
        # rather than guess which one the peer means.
        raise PeerAuthenticationError(f"peer certificate names several members: {named}")
    cert_group, member = named[0]
    if cert_group != group:
        raise PeerAuthenticationError(
            f"peer certificate is for group {cert_group!r}, not {group!r}"
        )
    return member
