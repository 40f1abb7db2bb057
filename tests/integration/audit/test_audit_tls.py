"""The audit reads a member whose Kafka requires client certificates (mutual TLS).

One broker of its own (started once for this module) has, besides the launcher's PLAINTEXT
listener (used to write the test data and by the readiness probe), an SSL listener with
``ssl.client.auth=required``. Member ``m1`` of a mixed group reaches it only through that
listener, configured for librdkafka as a sidecar would be; ``m2`` is a plaintext cluster of
the session fleet. Certificates come from a throwaway CA (``kdsync.localkafka.tls``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from pyspark.sql import SparkSession

from kdsync import naming
from kdsync.audit import command, positions
from kdsync.audit.command import main
from kdsync.audit.kafka_options import java_kafka_options
from kdsync.audit.positions import AuditPlan, TopicRange
from kdsync.localkafka import ClusterSpec, KafkaDistribution, LocalKafkaBroker, LocalKafkaFleet
from kdsync.localkafka.tls import LocalCa, cert_pem, key_pem, write_broker_tls
from tests.integration.audit.replicated_group import ReplicatedGroup
from tests.support.plain_kafka import create_topic

pytestmark = pytest.mark.kafka
REDACTED = "*********(redacted)"

KEY_PASSWORD = "k3y-pass"


@dataclass(frozen=True)
class TlsFiles:
    """Files of the test PKI: the CA, the broker's key store, and client credentials as a
    sidecar would hold them (certificate and an encrypted SEC1 key, in separate files)."""

    ca: Path
    broker_keystore: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path


def make_tls_files(folder: Path) -> TlsFiles:
    ca = LocalCa.create("kdsync test Kafka CA")
    broker = write_broker_tls(folder, ca)
    client_cert, client_key = ca.issue("kdsync-audit", server=False)
    # Signed by a CA the broker does not trust.
    stranger_cert, stranger_key = LocalCa.create("some other CA").issue("stranger", server=False)
    files = TlsFiles(
        ca=broker.ca,
        broker_keystore=broker.keystore,
        client_cert=folder / "client.pem",
        client_key=folder / "client-key.pem",
        stranger_cert=folder / "stranger.pem",
        stranger_key=folder / "stranger-key.pem",
    )
    files.client_cert.write_bytes(cert_pem(client_cert))
    # What librdkafka accepts and Java's PEM key store does not: an encrypted SEC1 key
    # ("BEGIN EC PRIVATE KEY" with Proc-Type/DEK-Info headers).
    files.client_key.write_bytes(
        client_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.BestAvailableEncryption(KEY_PASSWORD.encode()),
        )
    )
    files.stranger_cert.write_bytes(cert_pem(stranger_cert))
    files.stranger_key.write_bytes(key_pem(stranger_key))
    return files


def tls_broker_spec(name: str, files: TlsFiles) -> ClusterSpec:
    """A cluster with an extra listener SSL that requires a client certificate."""
    prefix = "listener.name.ssl."
    return ClusterSpec(
        name,
        overrides={
            f"{prefix}ssl.client.auth": "required",
            f"{prefix}ssl.keystore.type": "PEM",
            f"{prefix}ssl.keystore.location": str(files.broker_keystore),
            f"{prefix}ssl.truststore.type": "PEM",
            f"{prefix}ssl.truststore.location": str(files.ca),
        },
        extra_listeners={"SSL": "SSL"},
    )


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_kafka(
    kafka_distribution: KafkaDistribution, kafka_run_root: Path, tls_files: TlsFiles
) -> Iterator[LocalKafkaBroker]:
    """One broker with a client-certificate SSL listener, for this module."""
    fleet = LocalKafkaFleet(
        [tls_broker_spec("kafka-tls", tls_files)],
        run_root=kafka_run_root,
        distribution=kafka_distribution,
    )
    with fleet:
        yield fleet["kafka-tls"]


def write_mixed_config(
    path: Path,
    group: str,
    topic: str,
    tls: LocalKafkaBroker,
    tls_properties: dict[str, str],
    plain_bootstrap: str,
) -> Path:
    """A group of ``m1`` (the TLS broker, through its SSL listener only) and ``m2``."""
    data = {
        "group": group,
        "member": "m1",
        "insecure": True,
        "members": [
            {
                "name": "m1",
                "peer": "127.0.0.1:7401",
                "kafka": {
                    "bootstrapServers": tls.listener_address("SSL"),
                    "properties": tls_properties,
                },
            },
            {
                "name": "m2",
                "peer": "127.0.0.1:7402",
                "kafka": {"bootstrapServers": plain_bootstrap},
            },
        ],
        "topics": {"names": [topic]},
    }
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def client_properties(files: TlsFiles, how: str, tmp_path: Path) -> dict[str, str]:
    """librdkafka properties of member m1, as its sidecar would have them."""
    base = {"security.protocol": "ssl", "ssl.ca.location": str(files.ca)}
    if how == "pem-files":
        return {
            **base,
            "ssl.certificate.location": str(files.client_cert),
            "ssl.key.location": str(files.client_key),
            "ssl.key.password": KEY_PASSWORD,
        }
    if how == "pkcs12":
        key = serialization.load_pem_private_key(
            files.client_key.read_bytes(), KEY_PASSWORD.encode()
        )
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        cert = x509.load_pem_x509_certificate(files.client_cert.read_bytes())
        store = tmp_path / "client.p12"
        store.write_bytes(
            pkcs12.serialize_key_and_certificates(
                b"audit", key, cert, None, serialization.BestAvailableEncryption(b"p12-pass")
            )
        )
        return {**base, "ssl.keystore.location": str(store), "ssl.keystore.password": "p12-pass"}
    if how == "stranger":
        return {
            **base,
            "ssl.certificate.location": str(files.stranger_cert),
            "ssl.key.location": str(files.stranger_key),
        }
    if how == "no-certificate":
        return base
    if how == "missing-key-file":
        return {
            **base,
            "ssl.certificate.location": str(files.client_cert),
            "ssl.key.location": str(tmp_path / "gone.pem"),
        }
    raise AssertionError(how)


@pytest.fixture
def tls_group(
    tls_kafka: LocalKafkaBroker,
    kafka_fleet: LocalKafkaFleet,
    fresh_topic: Callable[[str], str],
    tmp_path: Path,
) -> Callable[[dict[str, str]], ReplicatedGroup]:
    """A clean replicated group of m1 (mutual TLS) and m2 (plaintext): 3 events from each,
    seqs 0..5 in both T-globals; the factory takes m1's librdkafka properties. Data is
    written through the brokers' PLAINTEXT listeners: only the audit uses the SSL one."""
    topic = fresh_topic("tls")
    group_name = f"g{uuid.uuid4().hex[:10]}"
    plain = kafka_fleet["kafka-1"].bootstrap_servers
    writers = {"m1": tls_kafka.bootstrap_servers, "m2": plain}
    for address in writers.values():
        create_topic(address, topic)
        create_topic(address, naming.global_topic(topic))
    group = ReplicatedGroup(group_name, topic, writers, tmp_path / "unused.yaml")
    produced = {m: group.produce_origin(m, 3, "a") for m in writers}
    delivered = group.deliver([(m, produced[m][i]) for i in range(3) for m in ("m1", "m2")])
    for member in writers:
        group.write_global(member, delivered)
        group.commit_source_offsets(member)

    def make(properties: dict[str, str]) -> ReplicatedGroup:
        path = tmp_path / f"{group_name}-{uuid.uuid4().hex[:6]}.yaml"
        write_mixed_config(path, group_name, topic, tls_kafka, properties, plain)
        return replace(group, config_path=path)

    return make


def audit(config: Path, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any], float]:
    report = tmp_path / "report.json"
    report.unlink(missing_ok=True)
    started = time.monotonic()
    status = main(["--config", str(config), "--report", str(report), *extra])
    took = time.monotonic() - started
    return status, json.loads(report.read_text()) if report.exists() else {}, took


@pytest.mark.parametrize("how", ["pem-files", "pkcs12"])
def test_a_member_behind_mutual_tls_is_audited(
    tls_group: Callable[[dict[str, str]], ReplicatedGroup],
    tls_files: TlsFiles,
    spark: SparkSession,
    tmp_path: Path,
    how: str,
) -> None:
    group = tls_group(client_properties(tls_files, how, tmp_path))
    status, report, _ = audit(group.config_path, tmp_path)
    assert status == 0, report
    assert report["passed"] is True
    assert report["checked"] == {"fromSeq": 0, "toSeq": 5, "events": 6}
    assert report["lag"] == {"m1": 0, "m2": 0}
    assert report["violationsTotal"] == 0


@pytest.mark.parametrize("how", ["stranger", "no-certificate", "missing-key-file"])
def test_a_wrong_or_missing_client_certificate_exits_2_with_one_line(
    tls_group: Callable[[dict[str, str]], ReplicatedGroup],
    tls_files: TlsFiles,
    tls_kafka: LocalKafkaBroker,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    how: str,
) -> None:
    """Planning (librdkafka, with the sidecar's own settings) meets the refusal first."""
    group = tls_group(client_properties(tls_files, how, tmp_path))
    status, _, took = audit(group.config_path, tmp_path, "--kafka-timeout", "5")
    err = capsys.readouterr().err.strip()
    assert status == 2, err
    assert took < 60, took
    assert err.startswith("kdsync audit: cannot run:") and "\n" not in err, err
    if how == "missing-key-file":
        # Checked before any Kafka client is made, naming member, property, path and fix.
        assert err.startswith(
            "kdsync audit: cannot run: member m1: members[].kafka.properties for Spark's "
            f"Kafka client: ssl.key.location {tmp_path / 'gone.pem'}: cannot read it"
        ), err
    else:
        assert err.startswith(
            f"kdsync audit: cannot run: member m1: cannot list topics from Kafka at "
            f"{tls_kafka.listener_address('SSL')}"
        ), err


@dataclass(frozen=True)
class JavaRefusal:
    status: int
    err: str
    took: float


@pytest.fixture
def java_refused(
    tls_group: Callable[[dict[str, str]], ReplicatedGroup],
    tls_files: TlsFiles,
    spark: SparkSession,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> JavaRefusal:
    """An audit whose planning reaches m1 but whose Spark reads present a certificate the
    broker refuses: what happens when librdkafka and the Java client disagree."""
    group = tls_group(client_properties(tls_files, "pem-files", tmp_path))
    refused = client_properties(tls_files, "stranger", tmp_path)

    def plan_with_refused_reads(*args: Any, **kwargs: Any) -> AuditPlan:
        plan = positions.plan_audit(*args, **kwargs)

        def swap(rng: TopicRange) -> TopicRange:
            return replace(rng, properties=refused) if rng.member == "m1" else rng

        topics = tuple(
            replace(t, globals=tuple(map(swap, t.globals)), origins=tuple(map(swap, t.origins)))
            for t in plan.topics
        )
        return replace(plan, topics=topics)

    monkeypatch.setattr(command, "plan_audit", plan_with_refused_reads)
    status, _, took = audit(group.config_path, tmp_path)
    return JavaRefusal(status, capsys.readouterr().err.strip(), took)


def test_a_certificate_refused_to_spark_exits_2_without_hanging(
    java_refused: JavaRefusal,
) -> None:
    assert java_refused.status == 2, java_refused.err
    # The Java client fails the TLS handshake at once (SslAuthenticationException is not
    # retried); 60 s would be Kafka's default.api.timeout.ms, i.e. a retry loop.
    assert java_refused.took < 45, java_refused.took
    assert java_refused.err.startswith("kdsync audit: cannot run:"), java_refused.err
    assert "\n" not in java_refused.err


def test_a_certificate_refused_to_spark_is_named_in_the_message(
    java_refused: JavaRefusal,
) -> None:
    """The line names Kafka's exception (and its cause), not the Py4J call that failed."""
    assert java_refused.err.startswith(
        "kdsync audit: cannot run: Spark's Kafka client failed: "
        "org.apache.kafka.common.errors.SslAuthenticationException: "
    ), java_refused.err
    assert "; caused by javax.net.ssl.SSL" in java_refused.err, java_refused.err
    assert "Py4JJavaError" not in java_refused.err, java_refused.err
    assert "An error occurred while calling" not in java_refused.err, java_refused.err


def test_spark_redacts_the_inline_client_key(
    tls_files: TlsFiles, spark: SparkSession, tmp_path: Path
) -> None:
    """What the audit's session does with the options: Spark's Kafka module (logging the
    parameters of its clients) and SQL (plan options) both redact the key."""
    options, _ = java_kafka_options(client_properties(tls_files, "pem-files", tmp_path))
    assert "PRIVATE KEY" in options["ssl.keystore.key"]
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    pairs = jvm.java.util.ArrayList()
    for name, value in options.items():
        pairs.add(jvm.scala.Tuple2(name, value))
    as_scala = jvm.scala.jdk.javaapi.CollectionConverters.asScala
    kafka_logged = jvm.org.apache.spark.kafka010.KafkaRedactionUtil.redactParams(
        as_scala(pairs).toSeq()
    )
    logged = {kafka_logged.apply(i)._1(): kafka_logged.apply(i)._2() for i in range(len(options))}
    assert logged["ssl.keystore.key"] == REDACTED
    assert logged["ssl.keystore.certificate.chain"] == options["ssl.keystore.certificate.chain"]
    prefixed = jvm.java.util.ArrayList()
    for name, value in options.items():
        prefixed.add(jvm.scala.Tuple2(f"kafka.{name}", value))
    sql_conf = spark._jsparkSession.sessionState().conf()
    shown = sql_conf.redactOptions(as_scala(prefixed).toSeq())
    in_plans = {shown.apply(i)._1(): shown.apply(i)._2() for i in range(len(options))}
    assert in_plans["kafka.ssl.keystore.key"] == REDACTED
    assert not any("PRIVATE KEY" in str(value) for value in in_plans.values())
