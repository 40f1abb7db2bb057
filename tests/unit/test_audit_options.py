"""Pure parts of the audit's plumbing: Kafka client settings for Spark (SASL, TLS, client
certificates), the ConfigMap reference and writes, the connector jars lookup, and the
command line's argument errors."""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from kdsync.audit import configmap as cm
from kdsync.audit.command import main
from kdsync.audit.kafka_options import KafkaOptionsError, java_kafka_options
from kdsync.audit.session import (
    DEFAULT_SETTINGS,
    SparkSetupError,
    connector_jars,
    spark_version,
)

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


def test_librdkafka_properties_become_java_client_settings() -> None:
    options, unsupported = java_kafka_options(
        {
            "security.protocol": "sasl_ssl",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "audit",
            "sasl.password": 'p"w',
            "ssl.ca.location": "/etc/ca.pem",
            "ssl.endpoint.identification.algorithm": "none",
            "socket.keepalive.enable": "true",
        }
    )
    assert options == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="audit" password="p\\"w";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/etc/ca.pem",
        "ssl.endpoint.identification.algorithm": "",
    }
    assert unsupported == ["socket.keepalive.enable"]


def test_no_properties_need_no_settings() -> None:
    assert java_kafka_options({}) == ({}, [])


# -- client certificates (mutual TLS) -------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(
    subject: str, key: PrivateKey, issuer: str | None = None, signer: PrivateKey | None = None
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer or subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(
            signer or key,
            None if isinstance(signer or key, ed25519.Ed25519PrivateKey) else hashes.SHA256(),
        )
    )


def _cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _key_pem(
    key: PrivateKey,
    form: serialization.PrivateFormat = serialization.PrivateFormat.PKCS8,
    password: str | None = None,
) -> str:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(serialization.Encoding.PEM, form, encryption).decode()


@dataclass(frozen=True)
class Client:
    key: PrivateKey
    cert: x509.Certificate
    cert_path: Path


def _client(tmp_path: Path, key: PrivateKey | None = None) -> Client:
    key = key or ec.generate_private_key(ec.SECP256R1())
    cert = _certificate("audit", key)
    path = tmp_path / "client.pem"
    path.write_text(_cert_pem(cert))
    return Client(key, cert, path)


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _assert_keystore_of(options: dict[str, str], client: Client) -> None:
    """A PEM key store Java reads: an unencrypted PKCS#8 key matching the chain's first
    certificate."""
    assert options["ssl.keystore.type"] == "PEM"
    key_text = options["ssl.keystore.key"]
    assert key_text.startswith("-----BEGIN PRIVATE KEY-----\n"), key_text[:40]
    key = serialization.load_pem_private_key(key_text.encode(), None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    assert key.public_key().public_bytes(serialization.Encoding.DER, spki) == (
        client.key.public_key().public_bytes(serialization.Encoding.DER, spki)
    )
    chain = x509.load_pem_x509_certificates(options["ssl.keystore.certificate.chain"].encode())
    assert chain[0] == client.cert
    assert "ssl.keystore.location" not in options and "ssl.keystore.password" not in options


@pytest.mark.parametrize(
    ("kind", "form", "password", "header"),
    [
        ("rsa", serialization.PrivateFormat.TraditionalOpenSSL, None, "RSA PRIVATE KEY"),
        ("ec", serialization.PrivateFormat.TraditionalOpenSSL, None, "EC PRIVATE KEY"),
        ("ec", serialization.PrivateFormat.TraditionalOpenSSL, "pw", "EC PRIVATE KEY"),
        ("ec", serialization.PrivateFormat.PKCS8, None, "PRIVATE KEY"),
        ("rsa", serialization.PrivateFormat.PKCS8, "pw", "ENCRYPTED PRIVATE KEY"),
    ],
)
def test_a_client_certificate_becomes_an_inline_pem_keystore_with_a_pkcs8_key(
    tmp_path: Path,
    kind: str,
    form: serialization.PrivateFormat,
    password: str | None,
    header: str,
) -> None:
    key: PrivateKey = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if kind == "rsa"
        else ec.generate_private_key(ec.SECP256R1())
    )
    client = _client(tmp_path, key)
    key_text = _key_pem(key, form, password)
    assert key_text.startswith(f"-----BEGIN {header}-----")
    properties = {
        "security.protocol": "ssl",
        "ssl.ca.location": "/etc/kafka/ca.pem",
        "ssl.certificate.location": str(client.cert_path),
        "ssl.key.location": _write(tmp_path / "key.pem", key_text),
    }
    if password:
        properties["ssl.key.password"] = password
    options, unsupported = java_kafka_options(properties)
    assert unsupported == []
    _assert_keystore_of(options, client)
    # The key is handed over decrypted, so no key password goes to Java.
    assert "ssl.key.password" not in options
    assert options["security.protocol"] == "SSL"
    assert options["ssl.truststore.location"] == "/etc/kafka/ca.pem"


def test_inline_pem_settings_and_a_certificate_chain_are_translated(tmp_path: Path) -> None:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("intermediate", ca_key)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate("audit", key, issuer="intermediate", signer=ca_key)
    options, unsupported = java_kafka_options(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "p",
            "ssl.ca.pem": _cert_pem(ca),
            "ssl.certificate.pem": _cert_pem(cert) + _cert_pem(ca),
            "ssl.key.pem": _key_pem(key, serialization.PrivateFormat.TraditionalOpenSSL),
        }
    )
    assert unsupported == []
    _assert_keystore_of(options, Client(key, cert, tmp_path))
    chain = x509.load_pem_x509_certificates(options["ssl.keystore.certificate.chain"].encode())
    assert chain == [cert, ca]
    assert options["ssl.truststore.type"] == "PEM"
    assert options["ssl.truststore.certificates"] == _cert_pem(ca)
    assert "ssl.truststore.location" not in options
    assert options["sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.")


def test_a_pkcs12_keystore_is_passed_by_path(tmp_path: Path) -> None:
    client = _client(tmp_path)
    store = tmp_path / "client.p12"
    store.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"audit", client.key, client.cert, None, serialization.BestAvailableEncryption(b"s3")
        )
    )
    options, unsupported = java_kafka_options(
        {
            "security.protocol": "SSL",
            "ssl.keystore.location": str(store),
            "ssl.keystore.password": "s3",
        }
    )
    assert unsupported == []
    assert options == {
        "security.protocol": "SSL",
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(store),
        "ssl.keystore.password": "s3",
    }


def test_a_key_password_without_a_key_is_left_untranslated() -> None:
    assert java_kafka_options({"ssl.key.password": "x"}) == ({}, ["ssl.key.password"])


def test_spark_redacts_every_secret_the_options_may_carry(tmp_path: Path) -> None:
    client = _client(tmp_path)
    options, _ = java_kafka_options(
        {
            "ssl.certificate.location": str(client.cert_path),
            "ssl.key.location": _write(tmp_path / "key.pem", _key_pem(client.key)),
        }
    )
    pattern = re.compile(DEFAULT_SETTINGS["spark.redaction.regex"].removeprefix("(?i)"), re.I)
    # Spark redacts an option when its name or its value matches.
    for name in ("ssl.keystore.key", "ssl.key.password", "ssl.keystore.password"):
        assert pattern.search(f"kafka.{name}"), name
    assert pattern.search(options["ssl.keystore.key"])
    # Spark's own defaults stay.
    for name in ("spark.authenticate.secret", "fs.s3a.access.key", "x.token"):
        assert pattern.search(name), name
    assert not pattern.search("kafka.ssl.keystore.certificate.chain")
    assert not pattern.search("kafka.bootstrap.servers")


def _error(properties: dict[str, str]) -> str:
    with pytest.raises(KafkaOptionsError) as caught:
        java_kafka_options(properties)
    return str(caught.value)


def test_unreadable_or_unusable_client_certificates_are_clear_errors(tmp_path: Path) -> None:
    client = _client(tmp_path)
    cert = str(client.cert_path)
    key = _write(tmp_path / "key.pem", _key_pem(client.key))
    locked = _write(
        tmp_path / "locked.pem",
        _key_pem(client.key, serialization.PrivateFormat.TraditionalOpenSSL, "right"),
    )
    other = _write(tmp_path / "other.pem", _key_pem(ec.generate_private_key(ec.SECP256R1())))
    missing = str(tmp_path / "nope.pem")

    message = _error({"ssl.certificate.location": cert, "ssl.key.location": missing})
    assert f"ssl.key.location {missing}: cannot read it (No such file or directory)" in message
    assert "Spark driver" in message

    message = _error({"ssl.certificate.location": missing, "ssl.key.location": key})
    assert f"ssl.certificate.location {missing}: cannot read it" in message

    message = _error({"ssl.certificate.location": cert, "ssl.key.location": locked})
    assert f"the private key of ssl.key.location {locked} is encrypted: set ssl.key.password" in (
        message
    )

    message = _error(
        {"ssl.certificate.location": cert, "ssl.key.location": locked, "ssl.key.password": "no"}
    )
    assert f"cannot read the private key of ssl.key.location {locked}" in message
    assert "wrong ssl.key.password" in message

    message = _error({"ssl.certificate.location": cert, "ssl.key.location": other})
    assert "does not belong to the certificate" in message and other in message

    message = _error({"ssl.certificate.location": key, "ssl.key.location": key})
    assert f"ssl.certificate.location {key} holds no PEM certificate" in message

    message = _error({"ssl.certificate.location": cert, "ssl.key.location": cert})
    assert f"cannot read the private key of ssl.key.location {cert} (not a PEM private key)" in (
        message
    )


def test_a_key_type_java_cannot_load_is_named(tmp_path: Path) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    client = _client(tmp_path, key)
    message = _error(
        {"ssl.certificate.location": str(client.cert_path), "ssl.key.pem": _key_pem(key)}
    )
    assert "is an Ed25519 key" in message and "RSA, EC and DSA keys only" in message


@pytest.mark.parametrize(
    ("properties", "expected"),
    [
        (
            {"ssl.certificate.location": "/c.pem"},
            "ssl.certificate.location is set but ssl.key.location (or ssl.key.pem) is not",
        ),
        (
            {"ssl.key.pem": "k"},
            "ssl.key.pem is set but ssl.certificate.location (or ssl.certificate.pem) is not",
        ),
        (
            {"ssl.keystore.location": "/k.p12", "ssl.key.location": "/k.pem"},
            "ssl.keystore.location and ssl.key.location are both set",
        ),
        (
            {"ssl.key.location": "/k.pem", "ssl.key.pem": "k"},
            "ssl.key.location and ssl.key.pem are both set",
        ),
        (
            {"ssl.ca.location": "/ca.pem", "ssl.ca.pem": "c"},
            "ssl.ca.location and ssl.ca.pem are both set",
        ),
    ],
)
def test_incomplete_or_contradictory_tls_settings_are_refused(
    properties: dict[str, str], expected: str
) -> None:
    assert expected in _error(properties)


def test_a_bad_pkcs12_keystore_is_a_clear_error(tmp_path: Path) -> None:
    client = _client(tmp_path)
    store = tmp_path / "client.p12"
    store.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"audit", client.key, client.cert, None, serialization.BestAvailableEncryption(b"s3")
        )
    )
    message = _error({"ssl.keystore.location": str(store), "ssl.keystore.password": "wrong"})
    assert f"ssl.keystore.location {store}: cannot open it as a PKCS#12 key store" in message
    missing = tmp_path / "none.p12"
    message = _error({"ssl.keystore.location": str(missing)})
    assert f"ssl.keystore.location {missing}: cannot read it" in message
    # Only certificates, no key: nothing to authenticate with.
    certs_only = tmp_path / "certs.p12"
    certs_only.write_bytes(
        pkcs12.serialize_key_and_certificates(
            None, None, None, [client.cert], serialization.NoEncryption()
        )
    )
    assert "holds no private key" in _error({"ssl.keystore.location": str(certs_only)})


@pytest.mark.parametrize("text", ["name", "/name", "ns/", "a/b/c"])
def test_a_configmap_reference_needs_namespace_and_name(text: str) -> None:
    with pytest.raises(cm.ConfigMapError, match="NAMESPACE/NAME"):
        cm.parse_reference(text)


class FakeCoreApi:
    """Stores ConfigMaps like an API server: create fails if present, replace checks the
    resourceVersion."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], Any] = {}
        self.version = 0

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

        if (namespace, name) not in self.stored:
            raise ApiException(status=404, reason="Not Found")
        return self.stored[(namespace, name)]

    def create_namespaced_config_map(self, namespace: str, body: Any) -> None:
        self.version += 1
        body.metadata.resource_version = str(self.version)
        self.stored[(namespace, body.metadata.name)] = body

    def replace_namespaced_config_map(self, name: str, namespace: str, body: Any) -> None:
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

        current = self.stored[(namespace, name)]
        if current.metadata.resource_version != body.metadata.resource_version:
            raise ApiException(status=409, reason="Conflict")
        self.version += 1
        body.metadata.resource_version = str(self.version)
        self.stored[(namespace, name)] = body


def test_the_configmap_gets_the_report_and_keeps_the_last_clean_state() -> None:
    api = FakeCoreApi()
    target = cm.ReportConfigMap("kdsync/orders-audit", api=api)
    assert target.read_state() is None
    target.write('{"passed": true}', '{"state": 1}')
    assert target.read_state() == '{"state": 1}'
    # A failed run writes its report but leaves the clean state in place.
    target.write('{"passed": false}', None)
    stored = api.stored[("kdsync", "orders-audit")]
    assert stored.data == {"report.json": '{"passed": false}', "state.json": '{"state": 1}'}
    assert stored.metadata.labels == {"app.kubernetes.io/managed-by": "kdsync-audit"}


def test_missing_connector_jars_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SparkSetupError) as caught:
        connector_jars({"KDSYNC_SPARK_JARS": str(tmp_path)})
    assert "hack/fetch-spark" in str(caught.value)
    assert f"spark-sql-kafka-0-10_2.13-{spark_version()}.jar" in str(caught.value)


def test_connector_jars_are_found_in_the_named_folder(tmp_path: Path) -> None:
    for name in (f"spark-sql-kafka-0-10_2.13-{spark_version()}.jar", "kafka-clients-3.9.0.jar"):
        (tmp_path / name).write_bytes(b"")
    assert [Path(j).name for j in connector_jars({"KDSYNC_SPARK_JARS": str(tmp_path)})] == [
        "kafka-clients-3.9.0.jar",
        f"spark-sql-kafka-0-10_2.13-{spark_version()}.jar",
    ]


def test_bad_yaml_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("group: [unclosed\n")
    assert main(["--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kdsync audit: cannot run: bad config") and "\n" not in err


def test_an_inverted_range_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "group: g\nmember: a\ninsecure: true\ntopics: {names: [t]}\nmembers:\n"
        "  - {name: a, peer: '127.0.0.1:1', kafka: {bootstrapServers: '127.0.0.1:9'}}\n"
        "  - {name: b, peer: '127.0.0.1:2', kafka: {bootstrapServers: '127.0.0.1:9'}}\n"
    )
    assert main(["--config", str(config), "--from-seq", "5", "--to-seq", "4"]) == 2
    assert "--to-seq 4 is below --from-seq 5" in capsys.readouterr().err


def test_the_command_line_rejects_negative_numbers() -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--config", "c.yaml", "--violation-cap", "-1"])
    assert caught.value.code == 2
