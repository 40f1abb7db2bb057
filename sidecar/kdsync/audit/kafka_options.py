"""Spark's Kafka source speaks the Java client's settings; members are configured for librdkafka.

``java_kafka_options`` translates one member's librdkafka ``properties`` (the ones a sidecar
uses) into the Java client's names, so the audit reads each cluster the way its sidecar does.

Client certificates (mutual TLS) become the Java client's PEM key store (KIP-651), passed
**inline** (``ssl.keystore.key`` / ``ssl.keystore.certificate.chain``): librdkafka keeps
certificate and key in two files, Java's file-based PEM key store wants both in one, and a
file written here would exist on the driver only, not on Spark's executors. The files are
read where the audit is planned (the driver); the key is re-encoded as an unencrypted PKCS#8
PEM, the only private-key form Java's PEM support reads without a password, so PKCS#1
(``BEGIN RSA PRIVATE KEY``), SEC1 (``BEGIN EC PRIVATE KEY``) and encrypted keys all work.
The key thus travels in the read options: :mod:`kdsync.audit.spark_conf` extends
``spark.redaction.regex`` (in the local session's defaults and the operator's
SparkApplication) so Spark redacts it wherever it redacts options (the Java client itself
prints these settings as ``[hidden]``).
A PKCS#12 key store (``ssl.keystore.location``) is passed by path
(``ssl.keystore.type=PKCS12``): it must exist at that path on the executors too, like
``ssl.ca.location``, which is what mounting the same Secret in driver and executors gives.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, rsa
from cryptography.hazmat.primitives.serialization import pkcs12

_SASL_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# librdkafka names that mean the same in the Java client.
_SAME_IN_JAVA = {
    "client.rack",
    "sasl.kerberos.service.name",
    "ssl.endpoint.identification.algorithm",
}
# Key types Java's PEM key store can load (Kafka tries the RSA, DSA and EC key factories).
_JAVA_PEM_KEYS = (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey, dsa.DSAPrivateKey)


class KafkaOptionsError(ValueError):
    """A member's TLS settings cannot be turned into Java client settings; the message
    names the property, the problem and the fix."""


def java_kafka_options(properties: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Translate a member's librdkafka ``properties`` to Java client settings for Spark.

    Returns the settings (without the ``kafka.`` prefix) and the names it cannot translate
    (the caller warns: such a cluster may still be readable, or fail with Kafka's message).
    Raises :class:`KafkaOptionsError` when client-certificate settings are incomplete,
    contradictory, or name files that cannot be read or used.
    """
    options: dict[str, str] = {}
    unsupported: list[str] = []
    props = dict(properties)
    mechanism = props.pop("sasl.mechanisms", None) or props.pop("sasl.mechanism", None)
    username = props.pop("sasl.username", None)
    password = props.pop("sasl.password", None)
    if "security.protocol" in props:
        options["security.protocol"] = props.pop("security.protocol").upper()
    if mechanism is not None:
        options["sasl.mechanism"] = mechanism.upper()
    if username is not None or password is not None:
        module = _SASL_MODULES.get((mechanism or "PLAIN").upper())
        if module is None:
            unsupported.append("sasl.username")
        else:
            user = json.dumps(username or "")
            secret = json.dumps(password or "")
            options["sasl.jaas.config"] = f"{module} required username={user} password={secret};"
    if "ssl.ca.location" in props and "ssl.ca.pem" in props:
        raise KafkaOptionsError("ssl.ca.location and ssl.ca.pem are both set: keep one of them")
    if "ssl.ca.location" in props:
        options["ssl.truststore.type"] = "PEM"
        options["ssl.truststore.location"] = props.pop("ssl.ca.location")
    elif "ssl.ca.pem" in props:
        options["ssl.truststore.type"] = "PEM"
        options["ssl.truststore.certificates"] = props.pop("ssl.ca.pem")
    options.update(_client_certificate(props))
    for name in sorted(props):
        if name in _SAME_IN_JAVA:
            value = props[name]
            if name == "ssl.endpoint.identification.algorithm" and value == "none":
                value = ""
            options[name] = value
        else:
            unsupported.append(name)
    return options, unsupported


def _client_certificate(props: dict[str, str]) -> dict[str, str]:
    """The Java key store settings for librdkafka's client certificate settings, which are
    removed from ``props`` (an ``ssl.key.password`` without a key is left there)."""
    cert = _one_of(props, "ssl.certificate.location", "ssl.certificate.pem")
    key = _one_of(props, "ssl.key.location", "ssl.key.pem")
    keystore = props.get("ssl.keystore.location")
    given = cert or key
    if keystore is not None and given is not None:
        raise KafkaOptionsError(
            f"ssl.keystore.location and {given[0]} are both set: give the client "
            "certificate either as a PKCS#12 key store or as certificate and key, not both"
        )
    if keystore is not None:
        del props["ssl.keystore.location"]
        return _pkcs12_keystore(keystore, props.pop("ssl.keystore.password", None))
    if given is None:
        return {}
    if cert is None or key is None:
        missing = "ssl.certificate.location" if cert is None else "ssl.key.location"
        missing += f" (or {missing.replace('.location', '.pem')})"
        raise KafkaOptionsError(
            f"{given[0]} is set but {missing} is not: a client certificate needs both its "
            "certificate (chain) and its private key"
        )
    password = props.pop("ssl.key.password", None)
    chain = _certificates(*cert)
    private_key = _private_key(*key, password)
    if private_key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != chain[0].public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise KafkaOptionsError(
            f"the private key of {_where(*key)} does not belong to the certificate of "
            f"{_where(*cert)} (the first certificate must be the client's own): give the "
            "matching pair"
        )
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": "".join(
            c.public_bytes(serialization.Encoding.PEM).decode("ascii") for c in chain
        ),
        "ssl.keystore.key": private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode("ascii"),
    }


def _one_of(props: dict[str, str], location: str, inline: str) -> tuple[str, str] | None:
    """``(property name, value)`` of a file-or-inline pair of librdkafka settings."""
    if location in props and inline in props:
        raise KafkaOptionsError(f"{location} and {inline} are both set: keep one of them")
    for name in (location, inline):
        if name in props:
            return name, props.pop(name)
    return None


def _where(name: str, value: str) -> str:
    return f"{name} {value}" if name.endswith(".location") else name


def _read(name: str, value: str) -> bytes:
    if not name.endswith(".location"):
        return value.encode()
    try:
        return Path(value).read_bytes()
    except OSError as error:
        raise KafkaOptionsError(
            f"{name} {value}: cannot read it ({error.strerror or error}); the audit reads "
            "client certificate files where it runs (the Spark driver): mount them there "
            "at the same path as in the sidecar, or fix the path"
        ) from None


def _certificates(name: str, value: str) -> list[x509.Certificate]:
    data = _read(name, value)
    try:
        chain = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise KafkaOptionsError(
            f"{_where(name, value)} holds no PEM certificate (-----BEGIN CERTIFICATE-----): "
            "give the client certificate, then any intermediates, in PEM"
        ) from None
    return chain


def _private_key(
    name: str, value: str, password: str | None
) -> rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | dsa.DSAPrivateKey:
    data = _read(name, value)
    secret = password.encode() if password else None
    try:
        key = serialization.load_pem_private_key(data, secret)
    except TypeError:
        # Raised for an encrypted key without a password, and for a password given for an
        # unencrypted key (librdkafka ignores that one).
        if secret is None:
            raise KafkaOptionsError(
                f"the private key of {_where(name, value)} is encrypted: set ssl.key.password"
            ) from None
        key = serialization.load_pem_private_key(data, None)
    except ValueError:
        problem = (
            "wrong ssl.key.password, or not a PEM private key"
            if secret is not None
            else "not a PEM private key"
        )
        raise KafkaOptionsError(
            f"cannot read the private key of {_where(name, value)} ({problem}): give a PEM "
            "key (BEGIN PRIVATE KEY, RSA PRIVATE KEY, EC PRIVATE KEY or an encrypted one "
            "with ssl.key.password)"
        ) from None
    except Exception as error:  # cryptography's UnsupportedAlgorithm and the like
        raise KafkaOptionsError(
            f"cannot read the private key of {_where(name, value)} ({error})"
        ) from None
    if not isinstance(key, _JAVA_PEM_KEYS):
        kind = type(key).__name__.replace("PrivateKey", "")
        raise KafkaOptionsError(
            f"the private key of {_where(name, value)} is an {kind} key; Java's Kafka client "
            "(which Spark uses) loads RSA, EC and DSA keys only: issue the audit's client "
            "certificate with an RSA or EC key"
        )
    return key


def _pkcs12_keystore(path: str, password: str | None) -> dict[str, str]:
    """Java reads librdkafka's PKCS#12 key store itself; check it here for a clear error."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise KafkaOptionsError(
            f"ssl.keystore.location {path}: cannot read it ({error.strerror or error}); the "
            "driver and every executor read it at this path: mount it there, or fix the path"
        ) from None
    try:
        key, cert, _ = pkcs12.load_key_and_certificates(
            data, password.encode() if password else None
        )
    except ValueError:
        raise KafkaOptionsError(
            f"ssl.keystore.location {path}: cannot open it as a PKCS#12 key store (wrong "
            "ssl.keystore.password, or not a PKCS#12 file)"
        ) from None
    if key is None or cert is None:
        raise KafkaOptionsError(
            f"ssl.keystore.location {path}: the PKCS#12 key store holds no private key "
            "with its certificate: add the client's key and certificate to it"
        )
    # Java refuses a key store location without a password; an empty one opens a PKCS#12
    # file that has none.
    return {
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": path,
        "ssl.keystore.password": password or "",
    }
