"""A group whose Kafka clusters require SASL_SSL with SCRAM-SHA-512 (issue #16, item 4).

Three clusters of their own (started once for this module) listen SASL_SSL besides the
launcher's PLAINTEXT listener (which only the readiness probe and topic set-up use). The
sidecars, the independent checker, the test's producers and consumers and the failover
tool all reach them through the SASL_SSL listener, as a secured production cluster would
be reached. A wrong password gives one line naming the problem and loses nothing; the
password appears nowhere a sidecar reports to.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer

from kdsync import naming
from kdsync.local_group import LocalSidecarGroup
from kdsync.localkafka import (
    BrokerTlsFiles,
    KafkaDistribution,
    LocalKafkaFleet,
    ScramUser,
    sasl_ssl_client_properties,
    sasl_ssl_cluster,
    write_broker_tls,
)
from tests.integration.sidecar.conftest import group_name
from tests.integration.sidecar.harness import (
    PARTITIONS,
    GlobalWatch,
    Traffic,
    http_get,
    verify_group,
    wait_for,
)
from tests.support.plain_kafka import create_topic

pytestmark = pytest.mark.kafka

MEMBERS = ("m1", "m2", "m3")
EVENTS = 300  # per origin


@dataclass(frozen=True)
class SecuredClusters:
    fleet: LocalKafkaFleet
    tls: BrokerTlsFiles
    user: ScramUser

    def properties(self, member: str, user: ScramUser | None = None) -> dict[str, str]:
        """librdkafka properties of ``member``'s SASL_SSL listener, ``bootstrap.servers``
        included."""
        broker = self.fleet[f"sasl-{member}"]
        return sasl_ssl_client_properties(broker, user or self.user, self.tls)

    def bootstrap(self) -> dict[str, str]:
        """Member -> the SASL_SSL listener (what every client here connects to)."""
        return {m: self.properties(m)["bootstrap.servers"] for m in MEMBERS}

    def security(self, user: ScramUser | None = None) -> dict[str, dict[str, str]]:
        """Member -> ``kafka.properties`` (everything but the bootstrap servers)."""
        return {
            m: {k: v for k, v in self.properties(m, user).items() if k != "bootstrap.servers"}
            for m in MEMBERS
        }

    def create_topic(self, topic: str) -> None:
        # Through the PLAINTEXT listener: set-up, not what is under test.
        for member in MEMBERS:
            create_topic(self.fleet[f"sasl-{member}"].bootstrap_servers, topic, PARTITIONS)


@pytest.fixture(scope="module")
def secured(
    kafka_distribution: KafkaDistribution,
    kafka_run_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SecuredClusters]:
    tls = write_broker_tls(tmp_path_factory.mktemp("kafka-tls"))
    # A password that no log line, metric or name could contain by accident.
    user = ScramUser("kdsync-sidecar", f"pw-{secrets.token_hex(12)}")
    fleet = LocalKafkaFleet(
        [sasl_ssl_cluster(f"sasl-{m}", tls, [user]) for m in MEMBERS],
        run_root=kafka_run_root,
        distribution=kafka_distribution,
    )
    with fleet:
        yield SecuredClusters(fleet, tls, user)


@dataclass
class RunningGroup:
    group: LocalSidecarGroup
    topic: str
    produced: dict[str, int]


def _group(secured: SecuredClusters, tag: str, run_dir: Path, topic: str) -> LocalSidecarGroup:
    name = group_name(tag)
    return LocalSidecarGroup(
        name,
        secured.bootstrap(),
        run_dir / name,
        topics={"names": [topic]},
        kafka_properties=secured.security(),
    )


@pytest.fixture(scope="module")
def replicated(
    secured: SecuredClusters, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGroup]:
    """A running group that replicated EVENTS per origin, all over SASL_SSL."""
    topic = f"sasl-{secrets.token_hex(4)}"
    secured.create_topic(topic)
    group = _group(secured, "sasl", tmp_path_factory.mktemp("sidecars"), topic)
    try:
        group.start()
        group.wait_ready(timeout=120)
        traffic = Traffic(
            secured.bootstrap(),
            topic,
            count_per_origin=EVENTS,
            client_properties=secured.security(),
        )
        produced = traffic.start().join()
        yield RunningGroup(group, topic, produced)
    finally:
        group.close()


def test_a_group_replicates_exactly_once_over_sasl_ssl(
    secured: SecuredClusters, replicated: RunningGroup
) -> None:
    result = verify_group(
        replicated.group,
        secured.bootstrap(),
        replicated.topic,
        naming.global_topic(replicated.topic),
        replicated.produced,
        timeout=180,
        client_properties=secured.security(),
    )
    assert result.events == EVENTS * len(MEMBERS)


def _kdsync(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "kdsync.cli", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as expired:
        err = expired.stderr.decode(errors="replace") if expired.stderr else ""
        pytest.fail(f"kdsync {args[0]} did not finish in {timeout:.0f}s; stderr:\n{err[-4000:]}")


def test_the_password_appears_in_no_log_status_metric_or_kdsync_status(
    secured: SecuredClusters, replicated: RunningGroup
) -> None:
    group = replicated.group
    password = secured.user.password
    shown: dict[str, str] = {}
    for name, member in group.members.items():
        shown[f"{name} log"] = member.log_path.read_text(errors="replace")
        status_code, status = http_get(member.http, "/status")
        assert status_code == 200
        shown[f"{name} /status"] = status
        metrics_code, metrics = http_get(member.http, "/metrics")
        assert metrics_code == 200
        shown[f"{name} /metrics"] = metrics
        done = _kdsync("status", "--config", str(member.config_path))
        assert done.returncode == 0, done.stderr
        shown[f"{name} kdsync status"] = done.stdout + done.stderr
        done = _kdsync("check-config", "--config", str(member.config_path))
        assert done.returncode == 0, done.stderr
        shown[f"{name} kdsync check-config"] = done.stdout + done.stderr
    # The places are not empty (the test would pass vacuously otherwise)...
    assert all(text.strip() for text in shown.values()), [k for k, v in shown.items() if not v]
    assert "kdsync_" in shown["m1 /metrics"]
    leaks = [where for where, text in shown.items() if password in text]
    assert leaks == [], f"the SASL password appears in {leaks}"


def test_the_audit_proves_the_group_consistent_over_sasl_ssl(
    secured: SecuredClusters, replicated: RunningGroup, tmp_path: Path
) -> None:
    """``kdsync audit`` (local Spark) plans with librdkafka and reads with Spark's Java
    client, both logging in with the members' SASL_SSL properties."""
    total = sum(replicated.produced.values())
    topic = naming.global_topic(replicated.topic)
    watch = GlobalWatch(secured.bootstrap(), topic, secured.security())
    try:
        wait_for(
            f"{total} events in every {topic}",
            lambda: all(watch.count(m) >= total for m in MEMBERS),
            180,
        )
    finally:
        watch.close()
    report_path = tmp_path / "report.json"
    config = str(replicated.group.members["m2"].config_path)
    # Spark's start-up alone takes a minute on a busy 2-core machine.
    done = _kdsync("audit", "--config", config, "--report", str(report_path), "-v", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"\naudit over SASL_SSL, its phases:\n{done.stderr[-2000:]}")
    report = json.loads(report_path.read_text())
    assert report["passed"] is True, report
    assert report["violationsTotal"] == 0, report
    assert report["checked"]["events"] >= total, report
    assert secured.user.password not in done.stdout + done.stderr + report_path.read_text()


def _seq(headers: list[tuple[str, bytes | None]] | None) -> int:
    # kdsync's headers are the last five; kdsync.seq is the first of them.
    name, value = list(headers or [])[-5]
    assert name == "kdsync.seq" and value is not None
    return int(value)


def _read(properties: Mapping[str, str], topic: str, group: str, count: int) -> list[int]:
    """Read ``count`` records of ``topic`` as consumer group ``group``, commit, leave."""
    consumer = Consumer(
        {
            **properties,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    seqs: list[int] = []
    deadline = time.monotonic() + 90
    try:
        while len(seqs) < count:
            assert time.monotonic() < deadline, f"{group} read {len(seqs)} of {count}"
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            seqs.append(_seq(message.headers()))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return seqs


def test_failover_moves_a_consumer_group_between_sasl_ssl_clusters(
    secured: SecuredClusters, replicated: RunningGroup
) -> None:
    """``kdsync failover translate`` and ``apply`` log in to both clusters with the
    members' kafka.properties; the consumer reads on in m2 exactly where it left m1."""
    topic = naming.global_topic(replicated.topic)
    total = sum(replicated.produced.values())
    watch = GlobalWatch(secured.bootstrap(), topic, secured.security())
    try:
        wait_for(f"{total} events in m2's {topic}", lambda: watch.count("m2") >= total, 180)
    finally:
        watch.close()
    consumers = f"consumers-{secrets.token_hex(4)}"
    in_a = _read(secured.properties("m1"), topic, consumers, total // 3)
    config = str(replicated.group.members["m1"].config_path)
    where = ("--group", consumers, "--from", "m1", "--to", "m2", "--config", config)
    translated = _kdsync("failover", "translate", *where, "--wait", "120")
    assert translated.returncode == 0, translated.stderr
    applied = _kdsync("failover", "apply", *where, "--wait", "120")
    assert applied.returncode == 0, applied.stderr
    in_b = _read(secured.properties("m2"), topic, consumers, total - len(in_a))
    assert in_a + in_b == list(range(total))
    for output in (translated, applied):
        assert secured.user.password not in output.stdout + output.stderr


@pytest.fixture
def wrong_password_group(
    secured: SecuredClusters, tmp_path: Path
) -> Iterator[tuple[LocalSidecarGroup, str, str]]:
    """A group whose m3 holds a wrong password in its own config; yields the group, its
    source topic and the good config text of m3 (to put back)."""
    topic = f"sasl-wrong-{secrets.token_hex(4)}"
    secured.create_topic(topic)
    group = _group(secured, "sasl-wrong", tmp_path, topic)
    path = group.members["m3"].config_path
    good = path.read_text()
    config: dict[str, Any] = yaml.safe_load(good)
    for entry in config["members"]:
        if entry["name"] == "m3":
            entry["kafka"]["properties"]["sasl.password"] = WRONG_PASSWORD
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    try:
        yield group, topic, good
    finally:
        group.close()


WRONG_PASSWORD = f"wrong-{secrets.token_hex(8)}"


def test_a_wrong_password_gives_one_line_exits_and_loses_nothing(
    secured: SecuredClusters,
    wrong_password_group: tuple[LocalSidecarGroup, str, str],
) -> None:
    group, topic, good = wrong_password_group
    m3 = group.members["m3"]
    group.start()
    group.wait_ready(timeout=120, names=["m1", "m2"])
    # Every origin produces while m3 cannot log in: its own events must wait for it.
    traffic = Traffic(
        secured.bootstrap(), topic, count_per_origin=EVENTS, client_properties=secured.security()
    ).start()
    wait_for("m3's sidecar to exit", lambda: not m3.running, 90)
    assert m3.process is not None and m3.process.returncode != 0
    log = m3.log_path.read_text(errors="replace")
    lines = [line for line in log.splitlines() if re.search("authenticat", line, re.I)]
    assert len(lines) == 1, log
    broker = secured.bootstrap()["m3"]
    assert (
        f"authentication failed for user '{secured.user.name}' at broker {broker} "
        "(SASL SCRAM-SHA-512: " in lines[0]
    ), lines[0]
    assert "Fix: check sasl.username and sasl.password in kafka.properties" in lines[0]
    assert "Traceback" not in log, log
    assert WRONG_PASSWORD not in log and secured.user.password not in log
    produced = traffic.join()

    # The password fixed (as an operator would, in the Secret): m3 starts and the group
    # delivers every event, m3's own included, exactly once.
    m3.config_path.write_text(good)
    group.start_member("m3")
    result = verify_group(
        group,
        secured.bootstrap(),
        topic,
        naming.global_topic(topic),
        produced,
        timeout=180,
        client_properties=secured.security(),
    )
    assert result.events == EVENTS * len(MEMBERS)


def test_check_config_does_not_print_the_password(secured: SecuredClusters, tmp_path: Path) -> None:
    """A property librdkafka refuses is named, with the secret values around it hidden."""
    topic = "unused"
    group = _group(secured, "sasl-check", tmp_path, topic)
    path = group.members["m1"].config_path
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    config["members"][0]["kafka"]["properties"]["sasl.mechanism"] = "SCRAM-SHA-999"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    done = _kdsync("check-config", "--config", str(path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "SCRAM-SHA-999" in done.stderr, done.stderr
    assert secured.user.password not in done.stdout + done.stderr
