"""Pure parts of kdsync.localkafka: properties, ports, locating jars, reaping leftovers."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kdsync.localkafka import (
    KAFKA_VERSION,
    KafkaNotProvisioned,
    ScramUser,
    find_distribution,
    sasl_ssl_cluster,
    write_broker_tls,
)
from kdsync.localkafka.config import (
    FAST_SINGLE_NODE_DEFAULTS,
    BrokerPorts,
    allocate_ports,
    broker_properties,
    parse_properties,
    render_properties,
)
from kdsync.localkafka.distribution import default_libs_dir
from kdsync.localkafka.fleet import RUN_DIR_PREFIX, reap_stale_runs
from kdsync.localkafka.process import PidRegistry, ProcessIdentity

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_pinned_version_matches_the_maven_project() -> None:
    pom = (REPO_ROOT / "hack" / "kafka" / "pom.xml").read_text()
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    assert match is not None
    assert match.group(1) == KAFKA_VERSION


def test_single_node_properties_point_at_the_given_ports_and_folder(tmp_path: Path) -> None:
    props = broker_properties(
        host="127.0.0.1", ports=BrokerPorts(broker=21001, controller=21002), data_dir=tmp_path
    )
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:21001,CONTROLLER://127.0.0.1:21002"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:21002"
    assert props["log.dirs"] == str(tmp_path)
    # Transactions need their internal topics creatable on one node.
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    ):
        assert props[key] == "1", key


def test_overrides_win_and_are_spelled_as_kafka_expects(tmp_path: Path) -> None:
    props = broker_properties(
        host="127.0.0.1",
        ports=BrokerPorts(1, 2),
        data_dir=tmp_path,
        overrides={"message.max.bytes": 4096, "auto.create.topics.enable": True},
    )
    assert props["message.max.bytes"] == "4096"
    assert props["auto.create.topics.enable"] == "true"
    assert FAST_SINGLE_NODE_DEFAULTS["auto.create.topics.enable"] == "false"


def test_launcher_owned_properties_cannot_be_overridden(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"listeners.*log\.dirs|log\.dirs.*listeners"):
        broker_properties(
            host="127.0.0.1",
            ports=BrokerPorts(1, 2),
            data_dir=tmp_path,
            overrides={"listeners": "PLAINTEXT://:9092", "log.dirs": "/tmp/x"},
        )


def test_properties_file_round_trips_awkward_text() -> None:
    props = {
        "plain.key": "value",
        "key with spaces:and=signs": "  leading spaces, \\ backslash, #hash",
        "unicode": "héllo ✓",
        "multi.line": "a\nb\tc",
        "empty": "",
    }
    text = render_properties(props, header="two\nlines")
    assert text.startswith("# two\n# lines\n")
    assert parse_properties(text) == props


def test_allocated_ports_are_distinct_free_and_outside_the_ephemeral_range() -> None:
    ports = allocate_ports(8)
    assert len(set(ports)) == 8
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(port < low for port in ports)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_missing_jars_say_how_to_provision_them(tmp_path: Path) -> None:
    with pytest.raises(KafkaNotProvisioned, match="run hack/fetch-kafka"):
        find_distribution(tmp_path / "nowhere")
    (tmp_path / "empty-libs").mkdir()
    with pytest.raises(KafkaNotProvisioned, match="run hack/fetch-kafka"):
        find_distribution(tmp_path / "empty-libs")


def test_libs_location_follows_the_environment(tmp_path: Path) -> None:
    assert default_libs_dir({"KDSYNC_KAFKA_LIBS": str(tmp_path)}) == tmp_path
    assert default_libs_dir({"KDSYNC_CACHE": str(tmp_path)}) == (
        tmp_path / "kafka" / KAFKA_VERSION / "libs"
    )


def test_java_command_runs_a_class_from_the_libs_folder(tmp_path: Path) -> None:
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / f"kafka_2.13-{KAFKA_VERSION}.jar").write_bytes(b"")
    (tmp_path / "log4j2.xml").write_text("<Configuration/>")
    distribution = find_distribution(libs)
    argv = distribution.java_command("kafka.Kafka", ["server.properties"], ["-Xmx64m"])
    assert argv[1] == "-Xmx64m"
    assert f"-Dlog4j2.configurationFile={tmp_path / 'log4j2.xml'}" in argv
    assert argv[-4:] == ["-cp", f"{libs}/*", "kafka.Kafka", "server.properties"]


def _dead_process() -> ProcessIdentity:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = ProcessIdentity.of(child.pid)
    child.wait()
    assert identity is not None and not identity.is_alive()
    return identity


def test_reaper_kills_brokers_of_a_dead_owner_and_spares_live_sessions(tmp_path: Path) -> None:
    dead_owner = _dead_process()
    me = ProcessIdentity.current()
    stand_in = subprocess.Popen(["sleep", "300"])  # plays a broker left behind
    try:
        stand_in_identity = ProcessIdentity.of(stand_in.pid)
        assert stand_in_identity is not None
        crashed = tmp_path / f"{RUN_DIR_PREFIX}{dead_owner.pid}-{dead_owner.start_ticks}-aaaaaa"
        PidRegistry(crashed / "pids").register("kafka-1", stand_in_identity, owner=dead_owner)
        live = tmp_path / f"{RUN_DIR_PREFIX}{me.pid}-{me.start_ticks}-bbbbbb"
        live.mkdir()

        assert reap_stale_runs(tmp_path) == [crashed]

        deadline = time.monotonic() + 10
        while stand_in.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stand_in.returncode == -9
        assert not crashed.exists()
        assert live.exists()
    finally:
        if stand_in.poll() is None:
            stand_in.kill()
            stand_in.wait()


def test_an_extra_listener_can_advertise_a_proxy_in_front_of_it(tmp_path: Path) -> None:
    ports = BrokerPorts(9092, 9093, (("SIDECAR", 9094),))
    props = broker_properties(
        host="127.0.0.1",
        ports=ports,
        data_dir=tmp_path,
        extra_listeners={"SIDECAR": "PLAINTEXT"},
        advertised={"SIDECAR": "127.0.0.1:18000"},
    )
    assert "SIDECAR://127.0.0.1:9094" in props["listeners"].split(",")
    advertised = props["advertised.listeners"].split(",")
    assert "SIDECAR://127.0.0.1:18000" in advertised
    assert "PLAINTEXT://127.0.0.1:9092" in advertised  # the others advertise themselves
    with pytest.raises(ValueError, match="not extra listeners"):
        broker_properties(
            host="127.0.0.1",
            ports=ports,
            data_dir=tmp_path,
            advertised={"SIDECAR": "127.0.0.1:18000"},
        )


def test_a_scram_user_is_a_storage_tool_argument_and_hides_its_password() -> None:
    user = ScramUser("kdsync-sidecar", "pw-123")
    assert user.storage_argument() == "SCRAM-SHA-512=[name=kdsync-sidecar,password=pw-123]"
    assert "pw-123" not in repr(user)
    for name, password in (("a,b", "pw"), ("a", "pw]"), ("", "pw"), ("a", "p w")):
        with pytest.raises(ValueError, match="--add-scram"):
            ScramUser(name, password)


def test_a_sasl_ssl_cluster_adds_a_scram_listener_with_tls(tmp_path: Path) -> None:
    tls = write_broker_tls(tmp_path)
    user = ScramUser("u", "pw")
    spec = sasl_ssl_cluster("k1", tls, [user])
    assert spec.scram_users == (user,)
    properties = broker_properties(
        host="127.0.0.1",
        ports=BrokerPorts(1, 2, (("SASL_SSL", 3),)),
        data_dir=tmp_path / "data",
        overrides=spec.overrides,
        extra_listeners=spec.extra_listeners,
    )
    assert "SASL_SSL://127.0.0.1:3" in properties["listeners"].split(",")
    assert "SASL_SSL:SASL_SSL" in properties["listener.security.protocol.map"]
    assert properties["listener.name.sasl_ssl.sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert properties["listener.name.sasl_ssl.ssl.keystore.location"] == str(tls.keystore)
    # The key store is the broker's key then its chain, readable by the owner only.
    keystore = tls.keystore.read_text()
    assert keystore.startswith("-----BEGIN PRIVATE KEY-----")
    assert keystore.count("BEGIN CERTIFICATE") == 2
    assert tls.keystore.stat().st_mode & 0o077 == 0
    with pytest.raises(ValueError, match="at least one SCRAM user"):
        sasl_ssl_cluster("k1", tls, [])
