"""Where a command's CPU goes, by kind of process (hack/cpu-breakdown).

Runs a command (e.g. ``./hack/test``) and samples ``/proc`` every few seconds. Every
process started after the command keeps its last CPU time (user plus system) seen; at
the end they are summed by kind (brokers, sidecars, Spark, the simulation, ...), so a
suite's time on a busy machine can be read as the work each part does. A process that
starts and ends between two samples is not seen: the exact total of everything the
command waited for is printed beside the sum, and the difference is named.

  hack/cpu-breakdown [--interval 3] [--json FILE] -- COMMAND [ARG...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

from kdsync.benchmark.procstats import cpu_and_start, ticks_since_boot

# (kind, any of these in the command line); the first match wins, so order matters.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("unit tests and the simulation", ("tests/unit tests/simulation", "pytest-checks")),
    ("ruff, mypy, import contracts", ("bin/ruff", "bin/mypy", "lint-imports")),
    ("Kafka brokers", ("kafka.Kafka ",)),
    ("MirrorMaker 2", ("connect-mirror", "MirrorMaker")),
    ("Spark JVMs", ("pyspark/jars", "/opt/spark/jars", "org.apache.spark")),
    ("Spark Python workers", ("pyspark.daemon", "pyspark.worker")),
    ("sidecars", ("kdsync run", "kdsync.cli run")),
    ("RDMA guest (qemu)", ("qemu-system",)),
    (
        "the e2e node (Kubernetes, containerd, operators)",
        ("kube-", "etcd", "kubelet", "containerd", "coredns", "kopf", "spark-operator", "/pause"),
    ),
    ("pytest processes (traffic, checks)", ("pytest",)),
)


def kind_of(command_line: str) -> str:
    for kind, needles in KINDS:
        if any(needle in command_line for needle in needles):
            return kind
    return "other"


class Sampler:
    """Last CPU seconds and command line of every process started since ``since``."""

    def __init__(self, since: int) -> None:
        self.since = since
        self.seen: dict[tuple[int, int], tuple[float, str]] = {}  # (pid, start) -> ...

    def sample(self) -> None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            stat = cpu_and_start(pid)
            if stat is None or stat[1] < self.since:  # gone meanwhile, or older
                continue
            cpu, start = stat
            try:
                raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                raw = b""
            command_line = raw.replace(b"\0", b" ").decode(errors="replace").strip()
            key = (pid, start)
            known = self.seen.get(key)
            # An exited process not yet reaped has no command line: keep the name it had.
            self.seen[key] = (cpu, command_line or (known[1] if known else ""))

    def by_kind(self) -> list[tuple[str, float]]:
        """CPU seconds by kind, most first."""
        totals: dict[str, float] = {}
        for cpu, command_line in self.seen.values():
            kind = kind_of(command_line) if command_line else "unnamed (kernel, exited)"
            totals[kind] = totals.get(kind, 0.0) + cpu
        return sorted(totals.items(), key=lambda item: -item[1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="hack/cpu-breakdown", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between samples")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("name the command to measure after --, e.g. -- ./hack/test")
    if args.interval <= 0:
        parser.error(f"--interval {args.interval}: use a positive number of seconds")

    sampler = Sampler(ticks_since_boot())
    started = time.monotonic()
    process = subprocess.Popen(command)
    stop = threading.Event()

    def sample_until_stopped() -> None:
        while not stop.wait(args.interval):  # the sampling period, not synchronisation
            sampler.sample()

    thread = threading.Thread(target=sample_until_stopped, daemon=True)
    thread.start()
    try:
        status = process.wait()
    except KeyboardInterrupt:
        process.terminate()
        status = process.wait()
    sampler.sample()
    stop.set()
    thread.join()
    wall = time.monotonic() - started
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    exact = waited.ru_utime + waited.ru_stime
    totals = sampler.by_kind()
    summed = sum(cpu for _, cpu in totals)
    cores = os.cpu_count() or 1
    print(f"\n{' '.join(command)}: exit {status}, {wall / 60:.1f} minutes")
    print(
        f"processes seen: {summed / 60:.1f} CPU-minutes, {100 * summed / (wall * cores):.0f}% "
        f"of {cores} cores; everything the command waited for: {exact / 60:.1f} CPU-minutes "
        "(more when processes ended between samples; less when some were not its children)"
    )
    print("| CPU-minutes | CPU-s | share | what |\n|---|---|---|---|")
    for kind, cpu in totals:
        print(f"| {cpu / 60:.1f} | {cpu:.0f} | {100 * cpu / max(summed, 1e-9):.0f}% | {kind} |")
    if args.json:
        document = {
            "command": command,
            "exit": status,
            "wall_s": round(wall, 1),
            "cores": cores,
            "seen_cpu_s": round(summed, 1),
            "waited_cpu_s": round(exact, 1),
            "by_kind_cpu_s": {kind: round(cpu, 1) for kind, cpu in totals},
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
