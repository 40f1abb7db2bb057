"""Pure parts of the audit's plumbing: Kafka client settings for Spark, the ConfigMap
reference and writes, the connector jars lookup, and the command line's argument errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kdsync.audit import configmap as cm
from kdsync.audit.command import main
from kdsync.audit.kafka_options import java_kafka_options
from kdsync.audit.session import SparkSetupError, connector_jars, spark_version


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
