"""The operator's identity in a group's PKI: its URI, its certificate, and that a peer
link never takes it for a member (a real TLS handshake in memory, no sockets)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from kdsync.pki import GroupCa, make_group_pki
from kdsync.transport.base import PeerAuthenticationError
from kdsync.transport.identity import (
    MemberTlsFiles,
    is_operator_uri,
    operator_uri,
    parse_member_uri,
)
from kdsync.transport.tls import client_context, member_from_peercert, server_context

GROUP = "orders"


def test_the_operator_uri_has_a_scheme_of_its_own() -> None:
    assert operator_uri(GROUP) == "kdsync-operator://orders"
    assert is_operator_uri("kdsync-operator://orders", GROUP)
    assert not is_operator_uri("kdsync-operator://payments", GROUP)
    assert not is_operator_uri("kdsync://orders/operator", GROUP)
    assert not is_operator_uri("kdsync-operator://orders/x", GROUP)
    assert not is_operator_uri("kdsync-operator://bad/name", "bad/name")
    assert parse_member_uri(operator_uri(GROUP)) is None, "never a member"
    with pytest.raises(ValueError):
        operator_uri("a/b")


def test_issue_operator_makes_a_client_only_certificate_of_the_group_ca() -> None:
    ca = GroupCa.create(GROUP)
    cert, key = ca.issue_operator(valid_days=30)
    assert ca.issued(cert)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    assert cert.public_key() == key.public_key()
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [operator_uri(GROUP)]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert 30 <= lifetime.days <= 31
    # Members keep both usages (they listen and dial).
    member_cert, _ = ca.issue_member("a")
    member_eku = member_cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(member_eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}


def _operator_files(tmp_path: Path, pki: dict[str, MemberTlsFiles]) -> MemberTlsFiles:
    ca = GroupCa.load(GROUP, pki["a"].ca_cert, tmp_path / "ca-key.pem")
    cert, key = ca.issue_operator()
    cert_path, key_path = tmp_path / "operator.pem", tmp_path / "operator-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return MemberTlsFiles(ca_cert=pki["a"].ca_cert, cert=cert_path, key=key_path)


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> ssl.SSLObject:
    """A TLS handshake between two in-memory endpoints; the server's end once done."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_end = server.wrap_bio(to_server, to_client, server_side=True)
    from_server, from_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_end = client.wrap_bio(from_server, from_client)
    done = {"server": False, "client": False}
    for _ in range(20):  # a handshake takes a few flights; a bound, not a wait
        for name, end in (("client", client_end), ("server", server_end)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        # Shuttle what each side wrote to the other.
        if from_client.pending:
            to_server.write(from_client.read())
        if to_client.pending:
            from_server.write(to_client.read())
        if all(done.values()):
            return server_end
    raise AssertionError("the handshake did not finish")


def test_a_peer_listener_refuses_an_operator_certificate(tmp_path: Path) -> None:
    pki = make_group_pki(GROUP, ["a", "b"], tmp_path)
    operator = _operator_files(tmp_path, pki)
    # The chain is the group CA's, so the handshake itself succeeds...
    server_end = _handshake(server_context(pki["a"]), client_context(operator))
    peercert = server_end.getpeercert()
    assert peercert is not None
    # ...and the identity check the peer listener runs next refuses it.
    with pytest.raises(PeerAuthenticationError, match="no kdsync member URI"):
        member_from_peercert(peercert, GROUP)
    # A member's certificate on the same path is taken (the check is not vacuous).
    server_end = _handshake(server_context(pki["a"]), client_context(pki["b"]))
    assert member_from_peercert(server_end.getpeercert(), GROUP) == "b"


def test_an_operator_certificate_cannot_serve_a_peer_link(tmp_path: Path) -> None:
    """A member dialling a peer that presents the operator's certificate fails the chain
    check: the certificate is for client authentication only."""
    pki = make_group_pki(GROUP, ["a", "b"], tmp_path)
    operator = _operator_files(tmp_path, pki)
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate purpose"):
        _handshake(server_context(operator), client_context(pki["a"]))
