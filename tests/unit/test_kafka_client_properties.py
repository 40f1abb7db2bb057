"""A bad librdkafka property in ``kafka.properties`` is one clear line from ``check-config``
and ``run``, never a traceback from deep in start-up (issue #16, bad input)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kdsync.kafka.client_config import check_client_properties
from kdsync.kafka.errors import InvalidClientProperties
from kdsync.local_group import LocalSidecarGroup


@pytest.mark.parametrize(
    ("properties", "named"),
    [
        ({"compression.type": "zstdx"}, "zstdx"),
        ({"no.such.property": "1"}, "no.such.property"),
        ({"security.protocol": "SASL_SSSL"}, "SASL_SSSL"),
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
