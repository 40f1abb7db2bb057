"""Peer mTLS material for a group, kept in Secrets: a group CA and one certificate per member.

Same shape as ``kdsync.pki`` (which this reuses): certificates carry the SAN URI
``kdsync://<group>/<member>`` and serve both TLS server and client authentication.
In memory only; the handler reads the existing Secrets and applies what this returns.
Existing material is kept as long as it is still valid, so reconciling never rotates
certificates that running sidecars hold; a member certificate is reissued when it is
missing, not signed by the group CA, names another member, or expires within 30 days.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Mapping
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from kdsync.pki import GroupCa
from kdsync.transport.identity import member_uri
from kdsync_operator import children
from kdsync_operator.spec import Group

Obj = dict[str, Any]
RENEW_BEFORE = datetime.timedelta(days=30)
OPERATOR_CERT_DAYS = 7


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _decode(data: Mapping[str, str], key: str) -> bytes | None:
    value = data.get(key)
    if not value:
        return None
    try:
        return base64.b64decode(value)
    except ValueError:
        return None


def _load_ca(group: str, data: Mapping[str, str]) -> GroupCa | None:
    cert_pem, key_pem = _decode(data, "ca.crt"), _decode(data, "ca.key")
    if cert_pem is None or key_pem is None:
        return None
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError:
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return None
    return GroupCa(group=group, cert=cert, key=key)


def _member_cert_ok(
    ca: GroupCa, group: str, member: str, data: Mapping[str, str], now: datetime.datetime
) -> bool:
    cert_pem, key_pem = _decode(data, "tls.crt"), _decode(data, "tls.key")
    if cert_pem is None or key_pem is None or _decode(data, "ca.crt") != _pem(ca.cert):
        return False
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    fresh = cert.not_valid_after_utc - now > RENEW_BEFORE
    return uris == [member_uri(group, member)] and fresh and ca.issued(cert)


def _secret(group: Group, name: str, component: str, member: str | None, data: Obj) -> Obj:
    meta = children._meta(group, name, component, member)
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "data": data}


def desired_pki_secrets(
    group: Group,
    existing: Mapping[str, Mapping[str, str]],
    now: datetime.datetime | None = None,
) -> dict[str, Obj]:
    """The CA Secret and each member's TLS Secret, reusing valid ``existing`` data
    (Secret name -> base64 ``data`` as stored)."""
    now = now or datetime.datetime.now(datetime.UTC)
    ca_name = children.ca_secret_name(group.name)
    ca = _load_ca(group.name, existing.get(ca_name, {}))
    if ca is None:
        ca = GroupCa.create(group.name)
    ca_pem = _b64(_pem(ca.cert))
    result: dict[str, Obj] = {
        ca_name: _secret(
            group, ca_name, "pki", None, {"ca.crt": ca_pem, "ca.key": _b64(_key_pem(ca.key))}
        )
    }
    for member in group.spec.members:
        name = children.tls_secret_name(group.name, member.name)
        data = existing.get(name, {})
        if _member_cert_ok(ca, group.name, member.name, data, now):
            kept = {key: data[key] for key in ("ca.crt", "tls.crt", "tls.key")}
        else:
            cert, key = ca.issue_member(member.name)
            kept = {"ca.crt": ca_pem, "tls.crt": _b64(_pem(cert)), "tls.key": _b64(_key_pem(key))}
        result[name] = _secret(group, name, "pki", member.name, kept)
    return result


def operator_credentials(
    group: Group, pki_secrets: Mapping[str, Obj]
) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, operator certificate, operator key) as PEM, for the operator's
    connections to the members' admin listeners: a certificate of the group CA naming the
    operator (``kdsync.transport.identity.operator_uri``), which no member holds. Issued
    afresh when asked, valid for ``OPERATOR_CERT_DAYS`` (nothing can revoke it, so it is
    short-lived); the handler keeps one per CA and asks again after a day."""
    data = pki_secrets[children.ca_secret_name(group.name)]["data"]
    ca = _load_ca(group.name, data)
    if ca is None:
        raise ValueError(f"the CA Secret of group {group.name} holds no usable CA")
    cert, key = ca.issue_operator(valid_days=OPERATOR_CERT_DAYS)
    return _pem(ca.cert), _pem(cert), _key_pem(key)
