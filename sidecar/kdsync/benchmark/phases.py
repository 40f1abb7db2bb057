"""One measured phase: the probe positioned, the load offered, the deliveries awaited.

A phase is either a *throughput* phase (every origin writes ``events_per_origin`` events as
fast as its producer can; elapsed = from the producers' start until every destination holds
every event of every other origin) or a *latency* phase (every origin writes at a fixed
rate; the probe's latency percentiles are the result). CPU of the system's processes and of
the brokers is sampled from /proc while it runs and read off at the moment the last
destination became complete.
"""

from __future__ import annotations

import bisect
import json
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kdsync.benchmark.children import Child
from kdsync.benchmark.load import LoadResult, LoadSpec
from kdsync.benchmark.probe import LatencySummary, ProbeResult, ProbeSpec
from kdsync.benchmark.procstats import cpu_seconds, run_queue_wait_seconds
from kdsync.benchmark.systems import ReplicationSystem

_SAMPLE_SECONDS = 0.1
_READY_TIMEOUT = 120.0


@dataclass(frozen=True)
class PhaseSpec:
    kind: str  # warmup, throughput, latency
    phase_id: int  # 1..255, written into every event
    event_bytes: int
    events_per_origin: int
    rate_per_origin: float = 0.0  # 0: as fast as possible
    load_fraction: float | None = None  # of the system's measured maximum (latency phases)
    deadline_seconds: float = 300.0


@dataclass
class PhaseResult:
    kind: str
    event_bytes: int
    events_per_origin: int
    rate_per_origin: float
    load_fraction: float | None
    complete: bool = False
    error: str | None = None
    elapsed_s: float | None = None
    deliveries: int = 0  # distinct cross-cluster deliveries seen by the probe
    expected_deliveries: int = 0
    duplicates: int = 0
    missing: int = 0
    local_copies: int = 0
    deliveries_per_s: float | None = None
    mb_per_s: float | None = None
    latency: LatencySummary = field(default_factory=LatencySummary)
    origin_ack: LatencySummary = field(default_factory=LatencySummary)
    cpu_s: dict[str, float] = field(default_factory=dict)
    # Seconds the system's processes were runnable but waited for a CPU (busy machine).
    cpu_wait_s: dict[str, float] = field(default_factory=dict)
    broker_cpu_s: dict[str, float] = field(default_factory=dict)
    harness_cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def system_cpu_s(self) -> float:
        return sum(self.cpu_s.values())

    @property
    def cpu_s_per_million(self) -> float | None:
        if not self.deliveries:
            return None
        return self.system_cpu_s / (self.deliveries / 1e6)

    @property
    def broker_cpu_s_per_million(self) -> float | None:
        if not self.deliveries:
            return None
        return sum(self.broker_cpu_s.values()) / (self.deliveries / 1e6)

    @property
    def cores_used(self) -> float | None:
        if not self.elapsed_s:
            return None
        return self.system_cpu_s / self.elapsed_s

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["system_cpu_s"] = self.system_cpu_s
        data["cpu_s_per_million_deliveries"] = self.cpu_s_per_million
        data["broker_cpu_s_per_million_deliveries"] = self.broker_cpu_s_per_million
        data["cores_used"] = self.cores_used
        return data


class CpuSampler:
    """Samples the CPU time of named processes every 0.1 s in a thread."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self.times: list[float] = []
        self.readings: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def _sample(self) -> None:
        reading = {n: s for n, p in self.pids.items() if (s := cpu_seconds(p)) is not None}
        self.times.append(time.time())
        self.readings.append(reading)

    def _run(self) -> None:
        while not self._stop.wait(_SAMPLE_SECONDS):
            self._sample()

    def start(self) -> None:
        self._sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _at(self, moment: float) -> dict[str, float]:
        """Readings at ``moment``, interpolated between the samples around it."""
        index = bisect.bisect_left(self.times, moment)
        if index >= len(self.times):
            return self.readings[-1]
        if index == 0:
            return self.readings[0]
        t0, t1 = self.times[index - 1], self.times[index]
        r0, r1 = self.readings[index - 1], self.readings[index]
        weight = (moment - t0) / (t1 - t0) if t1 > t0 else 1.0
        return {n: r0[n] + (r1.get(n, r0[n]) - r0[n]) * weight for n in r0}

    def used_between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds each process used between two moments (wall clock)."""
        before, after = self._at(start), self._at(end)
        return {n: after.get(n, before[n]) - before[n] for n in before}


def _python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def run_phase(
    system: ReplicationSystem,
    brokers: Mapping[str, int],
    spec: PhaseSpec,
    work_dir: Path,
) -> PhaseResult:
    work_dir.mkdir(parents=True, exist_ok=True)
    stem = f"phase{spec.phase_id:03d}-{spec.kind}-{spec.event_bytes}B"
    origins = system.origins()
    destinations = system.destinations()
    result = PhaseResult(
        spec.kind, spec.event_bytes, spec.events_per_origin, spec.rate_per_origin,
        spec.load_fraction,
    )  # fmt: skip
    result.expected_deliveries = len(origins) * (len(origins) - 1) * spec.events_per_origin

    ready = work_dir / f"{stem}.probe-ready"
    ready.unlink(missing_ok=True)
    probe_spec = ProbeSpec(
        tuple(destinations),
        tuple(o.index for o in origins),
        spec.phase_id,
        spec.events_per_origin,
        spec.deadline_seconds,
        str(ready),
    )
    probe_files = [work_dir / f"{stem}.probe-{x}.json" for x in ("spec", "result")]
    probe_files[0].write_text(json.dumps(probe_spec.to_json()))
    probe = Child(
        _python_module("kdsync.benchmark.probe", *map(str, probe_files)),
        work_dir / f"{stem}.probe.log",
        work_dir,
    )
    deadline = time.monotonic() + _READY_TIMEOUT
    while not ready.exists():
        if probe.done() or time.monotonic() > deadline:
            probe.kill()
            result.error = f"the probe did not start; see {probe.log}"
            return result
        time.sleep(0.05)  # polling for the probe's ready file, with a deadline

    system_pids = system.processes()
    sampler = CpuSampler({**system_pids, **{f"broker {n}": p for n, p in brokers.items()}})
    waits_before = {n: run_queue_wait_seconds(p) for n, p in system_pids.items()}
    sampler.start()
    load_spec = LoadSpec(
        tuple(origins),
        spec.phase_id,
        spec.events_per_origin,
        spec.event_bytes,
        spec.rate_per_origin,
    )
    load_files = [work_dir / f"{stem}.load-{x}.json" for x in ("spec", "result")]
    load_files[0].write_text(json.dumps(load_spec.to_json()))
    load = Child(
        _python_module("kdsync.benchmark.load", *map(str, load_files)),
        work_dir / f"{stem}.load.log",
        work_dir,
    )
    try:
        load_done = load.wait(spec.deadline_seconds + 60)
        probe_done = probe.wait(spec.deadline_seconds + 60)
    finally:
        sampler.stop()
        load.kill()
        probe.kill()
    for name, pid in system_pids.items():
        before, after = waits_before[name], run_queue_wait_seconds(pid)
        if before is not None and after is not None:
            result.cpu_wait_s[name] = after - before
    result.harness_cpu_s = {"load": load_done.cpu_seconds, "probe": probe_done.cpu_seconds}
    if not load_files[1].exists() or not probe_files[1].exists():
        result.error = f"load or probe wrote no result; see {load.log} and {probe.log}"
        return result
    load_result = LoadResult.from_json(json.loads(load_files[1].read_text()))
    probe_result = ProbeResult.from_json(json.loads(probe_files[1].read_text()))

    result.complete = probe_result.complete and load_result.failed == 0
    errors = [e for e in (probe_result.error,) if e]
    if load_result.failed:
        errors.append(f"{load_result.failed} events could not be produced; see {load.log}")
    result.deliveries = sum(d.delivered for d in probe_result.destinations)
    result.duplicates = sum(d.duplicates for d in probe_result.destinations)
    result.missing = result.expected_deliveries - result.deliveries
    result.local_copies = sum(d.local_copies for d in probe_result.destinations)
    result.latency = probe_result.latency
    result.origin_ack = load_result.origin_ack
    if result.missing:
        errors.append(f"{result.missing} deliveries missing at the deadline")
    result.error = "; ".join(errors) or None

    finished = [d.complete_at for d in probe_result.destinations if d.complete_at is not None]
    end = max(finished) if result.complete and finished else sampler.times[-1]
    result.elapsed_s = end - load_result.started_at
    used = sampler.used_between(load_result.started_at, end)
    result.cpu_s = {n: s for n, s in used.items() if not n.startswith("broker ")}
    result.broker_cpu_s = {n: s for n, s in used.items() if n.startswith("broker ")}
    if result.elapsed_s > 0:
        result.deliveries_per_s = result.deliveries / result.elapsed_s
        result.mb_per_s = result.deliveries_per_s * spec.event_bytes / 1e6
    return result
