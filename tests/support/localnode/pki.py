"""Certificates and kubeconfigs of a throwaway single-node cluster (``cryptography``).

One CA signs everything: the API server's serving certificate (loopback, the node address
and the ``kubernetes`` Service's names and IP), one client certificate per component, in
the user and group names Kubernetes' default RBAC bindings expect (``system:kube-scheduler``,
``system:node:<node>`` in ``system:nodes`` ...), and the API server's client certificate for
the kubelet. The service-account signing key is separate. Valid seven days: a node lives
as long as one test session.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 7
_Key = ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class Credential:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


def _key_pem(key: _Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _alt_names(names: Sequence[str]) -> list[x509.GeneralName]:
    result: list[x509.GeneralName] = []
    for name in names:
        try:
            result.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            result.append(x509.DNSName(name))
    return result


class ClusterPki:
    """Makes the CA once, then issues credentials into ``folder`` (mode 0700)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = _name("kdsync-local-node-ca")
        self._ca_cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
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
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca_cert = folder / "ca.crt"
        self.ca_key = folder / "ca.key"
        self.ca_cert.write_bytes(self._ca_cert.public_bytes(serialization.Encoding.PEM))
        self._write_key(self.ca_key, self._ca_key)
        sa_key = ec.generate_private_key(ec.SECP256R1())
        self.service_account_key = folder / "sa.key"
        self.service_account_pub = folder / "sa.pub"
        self._write_key(self.service_account_key, sa_key)
        self.service_account_pub.write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    @staticmethod
    def _write_key(path: Path, key: _Key) -> None:
        path.write_bytes(_key_pem(key))
        path.chmod(0o600)

    def issue(
        self,
        name: str,
        common_name: str,
        *,
        organizations: Sequence[str] = (),
        server_names: Sequence[str] = (),
    ) -> Credential:
        """A client certificate, or a serving one when ``server_names`` are given."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server_names else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organizations))
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server_names:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(_alt_names(server_names)), critical=False
            )
        cert = builder.sign(self._ca_key, hashes.SHA256())
        credential = Credential(self.folder / f"{name}.crt", self.folder / f"{name}.key")
        credential.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._write_key(credential.key, key)
        return credential

    def kubeconfig(self, path: Path, server: str, user: str, credential: Credential) -> Path:
        """A kubeconfig for ``server`` with the credential embedded (one context)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "kdsync-local-node",
                    "cluster": {
                        "server": server,
                        "certificate-authority-data": _b64(self.ca_cert),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": _b64(credential.cert),
                        "client-key-data": _b64(credential.key),
                    },
                }
            ],
            "contexts": [
                {
                    "name": "kdsync-local-node",
                    "context": {"cluster": "kdsync-local-node", "user": user},
                }
            ],
            "current-context": "kdsync-local-node",
            "preferences": {},
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        path.chmod(0o600)
        return path


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode("ascii")
