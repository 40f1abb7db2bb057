"""``kdsync`` on the command line (issue #4, third "Must show"): a wrong config or an
unreachable broker gives a clear message and a non-zero exit, never a traceback; a
valid config passes ``check-config``; SIGTERM stops a sidecar cleanly mid-traffic."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kdsync.local_group import LocalSidecarGroup
from tests.integration.sidecar.harness import (
    Traffic,
    brief_status,
    start_watched,
    verify_group,
    wait_for,
)

pytestmark = pytest.mark.kafka


def _kdsync(*args: str, timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kdsync.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _variant(base: Path, name: str, change: Callable[[dict[str, Any]], None]) -> Path:
    config = yaml.safe_load(base.read_text())
    change(config)
    path = base.with_name(f"{name}.yaml")
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the socket is


def test_bad_configs_and_unreachable_broker_give_clear_messages(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    group = sidecar_group("cli", bootstrap, source_topic)
    base = group.members["m1"].config_path

    def unreachable(config: dict[str, Any]) -> None:
        config["members"][0]["kafka"]["bootstrapServers"] = f"127.0.0.1:{_closed_port()}"

    # Started first: it waits for the broker that never answers.
    offline = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kdsync.cli",
            "run",
            "--config",
            str(_variant(base, "unreachable", unreachable)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        valid = _kdsync("check-config", "--config", str(base))
        assert valid.returncode == 0, valid.stderr
        assert "valid" in valid.stdout and "m1" in valid.stdout

        def duplicate(config: dict[str, Any]) -> None:
            config["members"][1]["name"] = config["members"][0]["name"]

        def bad_regex(config: dict[str, Any]) -> None:
            config["topics"] = {"include": ["orders-("]}

        for name, change, words in (
            ("duplicate", duplicate, ("members", "m1")),
            ("badregex", bad_regex, ("include", "regular expression", "orders-(")),
        ):
            result = _kdsync("run", "--config", str(_variant(base, name, change)))
            assert result.returncode == 2, (name, result.returncode, result.stderr)
            assert "Traceback" not in result.stderr, result.stderr
            for word in words:
                assert word in result.stderr, (name, word, result.stderr)
            # The same message from check-config.
            checked = _kdsync("check-config", "--config", str(_variant(base, name, change)))
            assert checked.returncode == 2 and checked.stderr == result.stderr

        # RDMA asked for on a host without a device (this one): the sidecar does not
        # start, and says what is missing and how to fix it; check-config says it first.
        def rdma(config: dict[str, Any]) -> None:
            config["transport"] = {"type": "rdma"}
            config["http"] = f"127.0.0.1:{_closed_port()}"  # m1 itself is running

        rdma_config = str(_variant(base, "rdma", rdma))
        checked = _kdsync("check-config", "--config", rdma_config)
        assert checked.returncode == 2, checked.stdout
        assert "transport.type is rdma, but no RDMA device" in checked.stderr, checked.stderr
        assert "fallbackToTcp" not in checked.stderr and "transport.type: tcp" in checked.stderr
        refused = _kdsync("run", "--config", rdma_config)
        assert refused.returncode == 2, refused.stderr
        assert "Traceback" not in refused.stderr, refused.stderr
        (error,) = [line for line in refused.stderr.splitlines() if " ERROR " in line]
        assert "no RDMA device" in error and "fallbackToTcp: true" in error, error

        def rdma_or_tcp(config: dict[str, Any]) -> None:
            config["transport"] = {"type": "rdma", "rdma": {"fallbackToTcp": True}}

        lenient = _kdsync("check-config", "--config", str(_variant(base, "lenient", rdma_or_tcp)))
        assert lenient.returncode == 0, lenient.stderr
        assert "rdma unavailable, so tcp" in lenient.stdout, lenient.stdout

        _, stderr = offline.communicate(timeout=120)
    finally:
        if offline.poll() is None:
            offline.kill()
            offline.communicate()
    assert offline.returncode != 0
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, stderr
    assert "cannot reach Kafka" in errors[0] and "Fix:" in errors[0], errors


def test_sigterm_during_traffic_exits_cleanly_and_group_stays_consistent(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    group = sidecar_group("sigterm", bootstrap, source_topic)
    global_topic, watch = start_watched(group, bootstrap, source_topic)
    traffic = Traffic(bootstrap, source_topic, rate_per_origin=150).start()
    try:
        start = watch.count("m2")
        wait_for(
            "traffic to flow",
            lambda: watch.count("m2") >= start + 300,
            60,
            lambda: brief_status(group),
        )
        began = time.monotonic()
        code = group.stop("m2", timeout=30)
        took = time.monotonic() - began
        assert code == 0, group.log_tail("m2")
        assert took < 30
        assert "received SIGTERM" in group.log_tail("m2", 200)
        group.start_member("m2")
        group.wait_ready(timeout=90, names=["m2"])
    finally:
        produced = traffic.stop()
    print(f"\nSIGTERM: m2 exited 0 after {took:.1f}s")
    verify_group(group, bootstrap, source_topic, global_topic, produced, watch=watch)
    watch.close()
