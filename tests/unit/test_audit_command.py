"""``kdsync audit``'s one-line reports of what stops it, without Kafka or Spark: member
settings Spark's Kafka client cannot use (checked before planning), properties it does not
get (one warning per member), and Spark jobs that fail with a Java exception (named by that
exception and its causes, not by the Py4J call)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from py4j.protocol import Py4JJavaError

from kdsync.audit import command
from kdsync.audit.command import java_failure, main
from kdsync.audit.positions import KafkaUnreachable
from kdsync.config import SidecarConfig, parse_config

SSL_ERROR = "org.apache.kafka.common.errors.SslAuthenticationException"
SSL_CAUSE = "javax.net.ssl.SSLHandshakeException"


def write_config(path: Path, m1: dict[str, str], m2: dict[str, str] | None = None) -> Path:
    """A group of data members m1 and m2 (Kafka ``k1:9092`` / ``k2:9092``) and witness w."""
    data = {
        "group": "g",
        "member": "m1",
        "insecure": True,
        "topics": {"names": ["orders"]},
        "members": [
            {
                "name": "m1",
                "peer": "127.0.0.1:7401",
                "kafka": {"bootstrapServers": "k1:9092", "properties": m1},
            },
            {
                "name": "m2",
                "peer": "127.0.0.1:7402",
                "kafka": {"bootstrapServers": "k2:9092", "properties": m2 or {}},
            },
            {"name": "w", "peer": "127.0.0.1:7403", "witness": True},
        ],
    }
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def self_signed_certificate() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "audit")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def config_of(path: Path) -> SidecarConfig:
    return parse_config(yaml.safe_load(path.read_text()), check_files=False)


class Unplanned:
    """Stands in for ``plan_audit``: records the call and stops the run there."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        raise KafkaUnreachable("planning stopped by the test")


@pytest.fixture
def planner(monkeypatch: pytest.MonkeyPatch) -> Unplanned:
    fake = Unplanned()
    monkeypatch.setattr(command, "plan_audit", fake)
    return fake


# -- member settings Spark's Kafka client cannot use ------------------------------------


def test_an_unreadable_key_file_stops_the_audit_before_planning_naming_member_and_fix(
    tmp_path: Path, planner: Unplanned, capsys: pytest.CaptureFixture[str]
) -> None:
    cert = tmp_path / "client.pem"
    cert.write_bytes(self_signed_certificate())
    missing = tmp_path / "gone-key.pem"
    config = write_config(
        tmp_path / "c.yaml",
        {"security.protocol": "ssl"},
        {"ssl.certificate.location": str(cert), "ssl.key.location": str(missing)},
    )
    assert main(["--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    assert err.startswith(
        "kdsync audit: cannot run: member m2: members[].kafka.properties for Spark's Kafka "
        f"client: ssl.key.location {missing}: cannot read it (No such file or directory)"
    ), err
    assert "mount them there" in err, err  # the fix
    assert not err.startswith("kdsync audit: cannot run: KafkaOptionsError"), err
    assert planner.calls == 0  # refused before any Kafka client was made


def test_half_given_client_certificate_settings_name_the_member(
    tmp_path: Path, planner: Unplanned, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path / "c.yaml", {"ssl.certificate.location": "/c.pem"})
    assert main(["--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "kdsync audit: cannot run: member m1: members[].kafka.properties for Spark's Kafka "
        "client: ssl.certificate.location is set but ssl.key.location (or ssl.key.pem) is "
        "not: a client certificate needs both its certificate (chain) and its private key"
    )
    assert planner.calls == 0


def test_properties_spark_does_not_get_are_warned_once_per_member(
    tmp_path: Path, planner: Unplanned, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        {"socket.keepalive.enable": "true", "security.protocol": "ssl", "debug": "all"},
        {"ssl.key.password": "only-a-password"},
    )
    assert main(["--config", str(config)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "kdsync audit: warning: member m1: not passed to Spark's Kafka client: debug, "
        "socket.keepalive.enable (librdkafka-only or not translated; see docs/audit.md, "
        "Kafka security)",
        "kdsync audit: warning: member m2: not passed to Spark's Kafka client: "
        "ssl.key.password (librdkafka-only or not translated; see docs/audit.md, "
        "Kafka security)",
        "kdsync audit: cannot run: planning stopped by the test",
    ]
    assert planner.calls == 1  # a warning, not a refusal: the audit went on to plan


def test_translatable_properties_warn_nothing(
    tmp_path: Path, planner: Unplanned, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(
        tmp_path / "c.yaml", {"security.protocol": "ssl", "ssl.ca.location": "/ca.pem"}
    )
    assert main(["--config", str(config)]) == 2
    assert capsys.readouterr().err.strip() == (
        "kdsync audit: cannot run: planning stopped by the test"
    )


# -- Spark jobs failing with a Java exception --------------------------------------------


class FakeClass:
    def __init__(self, name: str) -> None:
        self.name = name

    def getName(self) -> str:
        return self.name


class FakeThrowable:
    """What Py4J hands over for a java.lang.Throwable: getClass, toString, getCause."""

    _target_id = "o42"

    def __init__(self, name: str, message: str | None, cause: FakeThrowable | None = None) -> None:
        self.name = name
        self.message = message
        self.cause = cause

    def getClass(self) -> FakeClass:
        return FakeClass(self.name)

    def toString(self) -> str:
        return self.name if self.message is None else f"{self.name}: {self.message}"

    def getCause(self) -> FakeThrowable | None:
        return self.cause


def chain_of(throwable: FakeThrowable) -> list[tuple[str, str]]:
    return command._java_chain(throwable)


def ssl_refusal() -> FakeThrowable:
    """The driver's Kafka admin client refused by the broker, as Spark 4.0 reports it."""
    root = FakeThrowable(SSL_CAUSE, "Received fatal alert: bad_certificate")
    ssl = FakeThrowable(SSL_ERROR, "Failed to process post-handshake messages", root)
    return FakeThrowable("java.util.concurrent.ExecutionException", ssl.toString(), ssl)


def test_a_java_failure_names_the_exception_and_its_cause_not_the_wrapper(
    tmp_path: Path,
) -> None:
    members = config_of(write_config(tmp_path / "c.yaml", {})).data_members
    assert java_failure(chain_of(ssl_refusal()), members) == (
        f"Spark's Kafka client failed: {SSL_ERROR}: Failed to process post-handshake "
        f"messages; caused by {SSL_CAUSE}: Received fatal alert: bad_certificate"
    )


def test_a_failed_task_names_the_member_whose_read_it_was(tmp_path: Path) -> None:
    """Spark's Kafka consumers carry the reader's group id kdsync-audit-<member>-<hex>."""
    members = config_of(write_config(tmp_path / "c.yaml", {})).data_members
    loss = FakeThrowable(
        "org.apache.spark.sql.kafka010.KafkaIllegalStateException",
        "Cannot fetch offset 5 (GroupId: kdsync-audit-m2-0a1b2c3d-7f-executor, "
        "TopicPartition: orders-global-0).\nSome data may have been lost ...",
    )
    job = FakeThrowable(
        "org.apache.spark.SparkException",
        "Job aborted due to stage failure: Task 0 in stage 1.0 failed 1 times, most recent "
        f"failure: Lost task 0.0 in stage 1.0 (TID 1) (host executor driver): "
        f"{loss.toString()}\n\tat org.apache.spark...",
        loss,
    )
    assert java_failure(chain_of(job), members) == (
        "member m2: Spark failed: org.apache.spark.sql.kafka010.KafkaIllegalStateException: "
        "Cannot fetch offset 5 (GroupId: kdsync-audit-m2-0a1b2c3d-7f-executor, "
        "TopicPartition: orders-global-0)."
    )


def test_the_member_is_named_only_when_the_exceptions_point_at_one(tmp_path: Path) -> None:
    members = config_of(write_config(tmp_path / "c.yaml", {})).data_members
    timeout = "org.apache.kafka.common.errors.TimeoutException"
    one = FakeThrowable(timeout, "Failed to connect to k1:9092")
    assert java_failure(chain_of(one), members).startswith("member m1: Spark's Kafka client")
    both = FakeThrowable(timeout, "k1:9092 and k2:9092 are both down")
    assert java_failure(chain_of(both), members).startswith("Spark's Kafka client failed")
    # The group id of a member m1x is not m1's.
    other = FakeThrowable(timeout, "group kdsync-audit-m1x-0a1b2c3d")
    assert java_failure(chain_of(other), members).startswith("Spark's Kafka client failed")


def test_a_long_java_chain_keeps_one_line_the_first_causes_and_the_root() -> None:
    root = FakeThrowable("java.io.EOFException", None)
    chain: FakeThrowable = root
    for index in range(5):
        message = f"step {index}" + "." * 400 + "\n\tat a stack trace"
        chain = FakeThrowable(f"x.E{index}", message, chain)
    text = java_failure(chain_of(chain), [])
    assert "\n" not in text
    assert text.startswith("Spark failed: x.E4: step 4" + "." * 10)
    assert f"x.E3: step 3{'.' * (300 - len('x.E3: step 3'))}; ...; caused by " in text
    assert text.endswith("; ...; caused by java.io.EOFException")


class FakePy4JJavaError(Py4JJavaError):  # type: ignore[misc]
    """A real Py4JJavaError whose text does not need a JVM."""

    def __str__(self) -> str:
        return f"{self.errmsg}\n: {self.java_exception.toString()}\n\tat java..."


@pytest.fixture
def job_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run gets past planning and the session; its first Spark job fails."""
    monkeypatch.setattr(command, "plan_audit", lambda *a, **k: object())
    monkeypatch.setattr(command, "audit_session", lambda *a, **k: object())

    def run_audit(*args: Any, **kwargs: Any) -> Any:
        raise FakePy4JJavaError("An error occurred while calling o734.persist", ssl_refusal())

    monkeypatch.setattr(command, "run_audit", run_audit)


def test_kdsync_audit_prints_the_java_cause_of_a_failed_job(
    tmp_path: Path,
    job_fails: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv(command.DEBUG_ENV, raising=False)
    config = write_config(tmp_path / "c.yaml", {})
    assert main(["--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"kdsync audit: cannot run: Spark's Kafka client failed: {SSL_ERROR}: Failed to "
        f"process post-handshake messages; caused by {SSL_CAUSE}: Received fatal alert: "
        "bad_certificate (set KDSYNC_AUDIT_DEBUG=1 for the traceback)"
    )


def test_the_debug_flag_still_shows_the_traceback_of_a_failed_job(
    tmp_path: Path,
    job_fails: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(command.DEBUG_ENV, "1")
    config = write_config(tmp_path / "c.yaml", {})
    assert main(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "An error occurred while calling o734.persist" in err  # the Py4J error itself
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(f"kdsync audit: cannot run: Spark's Kafka client failed: {SSL_ERROR}")
    )


def test_other_failures_keep_the_type_and_first_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(command.DEBUG_ENV, raising=False)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("first line\nsecond line")

    monkeypatch.setattr(command, "plan_audit", broken)
    assert main(["--config", str(write_config(tmp_path / "c.yaml", {}))]) == 2
    assert capsys.readouterr().err.strip() == (
        "kdsync audit: cannot run: RuntimeError: first line "
        "(set KDSYNC_AUDIT_DEBUG=1 for the traceback)"
    )
