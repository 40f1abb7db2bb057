"""A bad librdkafka property in ``kafka.properties`` is one clear line from ``check-config``
and ``run``, never a traceback from deep in start-up (issue #16, bad input)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from confluent_kafka import KafkaError

from kdsync.kafka import connection_check
from kdsync.kafka.client_config import check_client_properties, redact
from kdsync.kafka.connection_check import check_connection
from kdsync.kafka.errors import InvalidClientProperties, KafkaAuthenticationFailed, KafkaUnavailable
from kdsync.local_group import LocalSidecarGroup


@pytest.mark.parametrize(
    ("properties", "named"),
    [
        ({"compression.type": "zstdx"}, "zstdx"),
        ({"no.such.property": "1"}, "no.such.property"),
        ({"security.protocol": "SASL_SSSL"}, "SASL_SSSL"),
        # The writers linger 1 s (kdsync.kafka.produce_pacing); librdkafka refuses a message
        # timeout at or below that, so the check does too, before anything starts.
        ({"message.timeout.ms": "1000"}, "message.timeout.ms"),
    ],
)
def test_refused_properties_are_named_with_a_fix(properties: dict[str, str], named: str) -> None:
    with pytest.raises(InvalidClientProperties) as refused:
        check_client_properties({"bootstrap.servers": "127.0.0.1:1", **properties})
    message = str(refused.value)
    assert named in message and "Fix:" in message, message


def test_accepted_properties_pass_and_secrets_stay_out_of_errors() -> None:
    secret = "s3cr3t-password"
    check_client_properties(
        {
            "bootstrap.servers": "127.0.0.1:1",
            "compression.type": "zstd",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "kdsync",
            "sasl.password": secret,
            "linger.ms": "20",  # a producer property: the consumer only ignores it
        }
    )
    with pytest.raises(InvalidClientProperties) as refused:
        check_client_properties({"sasl.password": secret, "compression.type": "zstdx"})
    assert secret not in str(refused.value)


def _kdsync(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kdsync.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_check_config_and_run_refuse_a_bad_property_in_one_line(tmp_path: Path) -> None:
    # Port 1 on loopback: nothing answers there, and nothing must be tried.
    group = LocalSidecarGroup("props", {"m1": "127.0.0.1:1", "m2": "127.0.0.1:1"}, tmp_path)
    path = group.members["m1"].config_path
    config = yaml.safe_load(path.read_text())
    config["members"][0]["kafka"]["properties"] = {"compression.type": "zstdx"}
    path.write_text(yaml.safe_dump(config))
    for command in ("check-config", "run"):
        result = _kdsync(command, "--config", str(path))
        assert result.returncode == 2, (command, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "zstdx" in lines[0] and "Fix:" in lines[0], result.stderr


def test_redact_hides_every_secret_value_and_only_those() -> None:
    properties = {
        "sasl.username": "kdsync",
        "sasl.password": "pw-1",
        "ssl.key.password": "pw-1-longer",
        "sasl.oauthbearer.client.secret": "oauth-s",
        "compression.type": "zstd",
    }
    text = "user kdsync, pw-1-longer then pw-1 and oauth-s, codec zstd"
    assert redact(text, properties) == "user kdsync, *** then *** and ***, codec zstd"


def _auth_error(code: int, text: str) -> KafkaError:
    return KafkaError(code, text)


def test_a_refused_login_is_one_line_naming_user_broker_and_fix() -> None:
    properties = {
        "bootstrap.servers": "kafka-0:9093,kafka-1:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "kdsync",
        "sasl.password": "pw-never-shown",
    }
    error = _auth_error(
        KafkaError._AUTHENTICATION,
        "sasl_ssl://kafka-1:9093/bootstrap: SASL authentication error: Authentication failed "
        "during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 "
        "(after 316ms in state AUTH_REQ)",
    )
    message = str(connection_check.refusal_error(properties, error))
    assert message == (
        "authentication failed for user 'kdsync' at broker kafka-1:9093 (SASL SCRAM-SHA-512: "
        "Authentication failed during authentication due to invalid credentials with SASL "
        "mechanism SCRAM-SHA-512); nothing was read or written. Fix: check sasl.username and "
        "sasl.password in kafka.properties (or the Secret named by propertiesSecretRef) and "
        "that the user exists in that cluster"
    )


def test_a_refused_tls_handshake_names_the_broker_and_the_ca() -> None:
    error = _auth_error(
        KafkaError._SSL,
        "ssl://10.0.0.7:9093/1: SSL handshake failed: certificate verify failed "
        "(after 12ms in state SSL_HANDSHAKE)",
    )
    message = str(connection_check.refusal_error({"bootstrap.servers": "k:9093"}, error))
    assert message.startswith(
        "the TLS handshake with broker 10.0.0.7:9093 failed (SSL handshake failed: "
        "certificate verify failed); nothing was read or written. Fix: check ssl.ca.location"
    ), message


def test_an_unreachable_cluster_is_reported_after_the_timeout() -> None:
    # Port 1 on loopback: nothing listens there.
    with pytest.raises(KafkaUnavailable) as unreachable:
        check_connection({"bootstrap.servers": "127.0.0.1:1", "sasl.password": "pw-x"}, 2.0)
    assert not isinstance(unreachable.value, KafkaAuthenticationFailed)
    message = str(unreachable.value)
    assert message.startswith("cannot reach Kafka at 127.0.0.1:1 within 2s"), message
    assert "pw-x" not in message
