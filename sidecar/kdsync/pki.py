"""A small PKI for one ordering group: a group CA and one certificate per member.

Used by local mode and tests; a Kubernetes deployment may issue the same shape of
certificates with its own tooling. What the transport relies on (see
``kdsync.transport.tls``): every member certificate is signed by the group CA, carries
the SAN URI ``kdsync://<group>/<member>``, and is valid for both TLS server and client
authentication (each member both listens and dials). ``GroupCa.issue_operator`` issues
the operator's client certificate for the members' admin listeners
(``kdsync-operator://<group>``, client authentication only).

Layout under ``out_dir`` (one folder per member so no member name can collide with
another file)::

    ca.pem  ca-key.pem
    members/<member>/cert.pem  members/<member>/key.pem

Keys are ECDSA P-256 (cheap handshakes) and written with mode 0600.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kdsync.transport.base import validate_member_name
from kdsync.transport.identity import MemberTlsFiles, member_uri, operator_uri

__all__ = ["GroupCa", "MemberTlsFiles", "make_group_pki"]

CA_VALID_DAYS = 3650
MEMBER_VALID_DAYS = 825
# Tolerates small clock differences between the machine that issues and the peers.
_CLOCK_SKEW = datetime.timedelta(minutes=5)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class GroupCa:
    """The certificate authority of one group, able to issue member certificates."""

    group: str
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, group: str, *, valid_days: int = CA_VALID_DAYS) -> GroupCa:
        """A fresh CA for ``group`` (kept in memory until ``save``)."""
        validate_member_name(group)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kdsync"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"kdsync group {group} CA"),
            ]
        )
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _CLOCK_SKEW)
            .not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(group=group, cert=cert, key=key)

    @classmethod
    def load(cls, group: str, cert_path: Path, key_path: Path) -> GroupCa:
        """Load a CA written by ``save``."""
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path}: expected an EC private key")
        return cls(group=group, cert=cert, key=key)

    def save(self, cert_path: Path, key_path: Path) -> None:
        cert_path.parent.mkdir(parents=True, exist_ok=True)
        cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        _write_private(key_path, _key_pem(self.key))

    def issued(self, cert: x509.Certificate) -> bool:
        """Whether ``cert`` was signed by this CA."""
        try:
            cert.verify_directly_issued_by(self.cert)
        except (ValueError, TypeError, InvalidSignature):
            return False
        return True

    def issue_member(
        self, member: str, *, valid_days: int = MEMBER_VALID_DAYS
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """A certificate and key for ``member`` of this CA's group."""
        # Each member both listens and dials: server and client authentication.
        return self._issue(
            member,
            member_uri(self.group, member),
            [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
            valid_days,
        )

    def issue_operator(
        self, *, valid_days: int = MEMBER_VALID_DAYS
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """A certificate and key for the group's operator on the members' admin listeners.

        Client authentication only: the operator never serves, and its URI scheme
        (``kdsync-operator://<group>``) is one no peer link takes for a member.
        """
        return self._issue(
            "kdsync operator",
            operator_uri(self.group),
            [ExtendedKeyUsageOID.CLIENT_AUTH],
            valid_days,
        )

    def _issue(
        self,
        common_name: str,
        uri: str,
        usages: list[x509.ObjectIdentifier],
        valid_days: int,
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """A leaf certificate of this CA whose identity is the SAN URI ``uri``."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(
                x509.Name(
                    [
                        x509.NameAttribute(NameOID.ORGANIZATION_NAME, f"kdsync group {self.group}"),
                        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                    ]
                )
            )
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _CLOCK_SKEW)
            .not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]),
                critical=False,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), False
            )
            .sign(self.key, hashes.SHA256())
        )
        return cert, key


def make_group_pki(
    group: str,
    members: list[str],
    out_dir: Path,
    *,
    member_valid_days: int = MEMBER_VALID_DAYS,
) -> dict[str, MemberTlsFiles]:
    """Create (or complete) the PKI of ``group`` under ``out_dir``.

    Idempotent: an existing CA in ``out_dir`` is reused, and an existing member
    certificate is kept if that CA signed it, so re-running local mode does not
    invalidate certificates that running sidecars hold. Returns each member's files.
    """
    for member in members:
        validate_member_name(member)
    if len(set(members)) != len(members):
        raise ValueError(f"duplicate member names in {members}")
    out_dir.mkdir(parents=True, exist_ok=True)
    ca_cert_path = out_dir / "ca.pem"
    ca_key_path = out_dir / "ca-key.pem"
    if ca_cert_path.exists() and ca_key_path.exists():
        ca = GroupCa.load(group, ca_cert_path, ca_key_path)
    else:
        ca = GroupCa.create(group)
        ca.save(ca_cert_path, ca_key_path)

    files: dict[str, MemberTlsFiles] = {}
    for member in members:
        member_dir = out_dir / "members" / member
        cert_path = member_dir / "cert.pem"
        key_path = member_dir / "key.pem"
        if not (cert_path.exists() and key_path.exists() and _reusable(ca, member, cert_path)):
            cert, key = ca.issue_member(member, valid_days=member_valid_days)
            member_dir.mkdir(parents=True, exist_ok=True)
            _write_private(key_path, _key_pem(key))
            cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[member] = MemberTlsFiles(ca_cert=ca_cert_path, cert=cert_path, key=key_path)
    return files


def _reusable(ca: GroupCa, member: str, cert_path: Path) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except ValueError:
        return False
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    names_member = san.get_values_for_type(x509.UniformResourceIdentifier) == [
        member_uri(ca.group, member)
    ]
    # Reissue well before expiry rather than let a restarted group fail its handshakes.
    fresh = cert.not_valid_after_utc - _now() > datetime.timedelta(days=7)
    return names_member and fresh and ca.issued(cert)
