"""Throwaway TLS material for local brokers: a CA, server and client certificates.

Local clusters (tests, the demo) that want TLS or SASL_SSL listeners need a broker key
store their clients can verify. This module makes one with ``cryptography``: a short-lived
CA and certificates for ``localhost``/``127.0.0.1``. It is not the group PKI of the peer
port (:mod:`kdsync.pki`): those certificates name kdsync members, these name a broker.

The broker's key store is Java's file-based PEM key store (``ssl.keystore.type=PEM``):
an unencrypted PKCS#8 key followed by the certificate chain, in one file.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Long enough for a demo left running over a weekend, short enough not to matter if leaked.
VALID_DAYS = 7
_CLOCK_SKEW = datetime.timedelta(minutes=5)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The key as unencrypted PKCS#8 PEM (what Java's PEM key store reads)."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def write_private(path: Path, data: bytes) -> None:
    """Write a file holding a private key, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


@dataclass(frozen=True)
class LocalCa:
    """A certificate authority kept in memory; issues broker and client certificates."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, common_name: str, *, valid_days: int = VALID_DAYS) -> LocalCa:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(_name(common_name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _CLOCK_SKEW)
            .not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    def issue(
        self, common_name: str, *, server: bool, valid_days: int = VALID_DAYS
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """A certificate for a broker (``server``: valid for localhost and 127.0.0.1) or a
        client (client authentication only)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _CLOCK_SKEW)
            .not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return builder.sign(self.key, hashes.SHA256()), key


@dataclass(frozen=True)
class BrokerTlsFiles:
    """``ca``: what clients trust (librdkafka's ``ssl.ca.location``); ``keystore``: the
    broker's PEM key store (key and chain)."""

    ca: Path
    keystore: Path


def write_broker_tls(folder: Path, ca: LocalCa | None = None) -> BrokerTlsFiles:
    """A broker key store for localhost under ``folder``, signed by ``ca`` (a new one if
    not given); returns the files."""
    ca = ca or LocalCa.create("kdsync local Kafka CA")
    broker_cert, broker_key = ca.issue("localhost", server=True)
    files = BrokerTlsFiles(ca=folder / "ca.pem", keystore=folder / "broker.pem")
    folder.mkdir(parents=True, exist_ok=True)
    files.ca.write_bytes(cert_pem(ca.cert))
    write_private(files.keystore, key_pem(broker_key) + cert_pem(broker_cert) + cert_pem(ca.cert))
    return files
