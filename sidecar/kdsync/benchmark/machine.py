"""What the benchmark ran on: CPU, memory, load, software versions."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import confluent_kafka

from kdsync.localkafka.distribution import KAFKA_VERSION, find_java


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return None


def _java_version() -> str:
    try:
        done = subprocess.run(
            [str(find_java()), "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, RuntimeError, subprocess.TimeoutExpired):
        return "unknown"
    lines = done.stderr.strip().splitlines()
    return lines[0] if lines else "unknown"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def describe_machine() -> dict[str, Any]:
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memoryGiB": round(_memory_gib() or 0, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "java": _java_version(),
        "kafka": KAFKA_VERSION,
        "confluentKafka": str(confluent_kafka.version()),
        "librdkafka": confluent_kafka.libversion()[0],
        "loadAverageAtStart": load_average(),
    }
