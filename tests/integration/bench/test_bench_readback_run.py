"""The read-back benchmark at its smallest, on the session's Kafka fleet, so it never
rots. No timing assertions: both readers read every record, idle and busy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kdsync.localkafka import LocalKafkaFleet

pytestmark = pytest.mark.kafka

SCRIPT = Path(__file__).resolve().parents[3] / "hack" / "bench_readback.py"


def test_both_readers_read_everything_idle_and_busy(
    kafka_fleet: LocalKafkaFleet, tmp_path: Path
) -> None:
    bootstrap = next(iter(kafka_fleet.bootstrap_servers().values()))
    out = tmp_path / "readback.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--bootstrap", bootstrap, "--records", "2000",
         "--rounds", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    rates = json.loads(out.read_text())["records_per_s"]
    assert sorted(rates) == ["poll per record", "read_to_end (batches)"], rates
    for reader, modes in rates.items():
        assert sorted(modes) == ["busy", "idle"], (reader, modes)
        assert all(rate > 0 for rate in modes.values()), (reader, modes)
    assert "as fast as one poll per record" in run.stdout, run.stdout


def test_bad_arguments_are_refused_with_the_reason() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--records", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 2
    assert "--records and --rounds must be at least 1" in run.stderr
