"""hack/cpu-breakdown, run as a user runs it: the CPU of a command's processes, by kind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "cpu-breakdown"
# A child that burns about half a CPU-second, its command line naming a kind.
BURN = "import time; end = time.process_time() + 0.6\nwhile time.process_time() < end: pass"


def test_a_childs_cpu_is_counted_under_its_kind(tmp_path: Path) -> None:
    figures = tmp_path / "cpu.json"
    command = [sys.executable, "-c", BURN, "kdsync.cli run"]  # argv names it a sidecar
    done = subprocess.run(
        [str(SCRIPT), "--interval", "0.1", "--json", str(figures), "--", *command],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(figures.read_text())
    assert result["exit"] == 0 and result["command"] == command
    assert result["by_kind_cpu_s"].get("sidecars", 0) >= 0.3, result  # seen until its end
    assert result["waited_cpu_s"] >= 0.5, result
    assert "| sidecars |" in done.stdout


def test_the_commands_exit_status_is_passed_on() -> None:
    done = subprocess.run(
        [str(SCRIPT), "--", sys.executable, "-c", "raise SystemExit(3)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3, done.stderr


def test_no_command_is_refused_with_the_fix() -> None:
    done = subprocess.run(
        [str(SCRIPT), "--"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert "name the command to measure after --" in done.stderr
