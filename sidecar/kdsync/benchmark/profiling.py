"""``hack/bench-replication --profile``: where kdsync's sidecars spend their time.

Starts a kdsync group on the given clusters, warms it up, measures its maximum
throughput, then offers a steady load at 80% of it (not a burst: a large backlog wedges the
group today, issue #11) and, once that load is steady, for ``seconds`` on every sidecar at
once:

- py-spy records GIL-holding samples with native frames (see
  :mod:`kdsync.benchmark.profile_analysis`);
- /proc gives the CPU of each OS thread (librdkafka's own ``rdk:*`` threads vs the Python
  threads), which py-spy cannot see;
- a prober times ``GET /healthz`` every 50 ms: it is served by the sidecar's event loop, so
  its response time is how long the loop was busy with something else (stalls);
- ``/status`` before and after gives the events each sidecar wrote into its ``T-global``.

Then :mod:`kdsync.benchmark.call_counts` counts calls per event in a second, smaller run.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kdsync.benchmark.call_counts import count_calls
from kdsync.benchmark.children import Child
from kdsync.benchmark.load import LoadSpec
from kdsync.benchmark.phases import PhaseSpec, _python_module, run_phase
from kdsync.benchmark.probe import LatencySummary
from kdsync.benchmark.procstats import cpu_seconds, run_queue_wait_seconds, thread_cpu_seconds
from kdsync.benchmark.profile_analysis import parse_raw, summarise, thread_cpu_kinds
from kdsync.benchmark.systems import KdsyncSystem

RATE = 100  # py-spy samples per second
_HEALTH_PERIOD = 0.05
_SETTLE_SECONDS = 3.0


class PySpyMissing(RuntimeError):
    pass


def find_py_spy() -> str:
    """The py-spy binary installed with the dev dependencies (or on PATH)."""
    try:
        files = importlib.metadata.distribution("py-spy").files or []
        for file in files:
            if str(file).endswith("bin/py-spy"):
                return str(Path(str(file.locate())).resolve())
    except importlib.metadata.PackageNotFoundError:
        pass
    found = shutil.which("py-spy")
    if found is None:
        raise PySpyMissing(
            "py-spy not found: it is a dev dependency (pyproject.toml); run hack/bootstrap"
        )
    return found


class HealthProber:
    """Times GET /healthz on each sidecar every 50 ms, in a thread."""

    def __init__(self, addresses: Mapping[str, str]) -> None:
        self.addresses = dict(addresses)
        self.samples: dict[str, list[float]] = {name: [] for name in addresses}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(name,), daemon=True) for name in addresses
        ]

    def _run(self, name: str) -> None:
        url = f"http://{self.addresses[name]}/healthz"
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    response.read()
            except OSError:
                pass  # a timeout is still a measurement of how long it took
            self.samples[name].append((time.monotonic() - started) * 1000)
            self._stop.wait(_HEALTH_PERIOD)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        result: dict[str, Any] = {}
        for name, samples in self.samples.items():
            summary = LatencySummary.of(samples)
            result[name] = {
                "count": summary.count,
                "percentiles_ms": summary.percentiles_ms,
                "max_ms": summary.max_ms,
                "over_100ms": sum(1 for s in samples if s > 100),
                "over_500ms": sum(1 for s in samples if s > 500),
            }
        return result


def _statuses(system: KdsyncSystem) -> dict[str, dict[str, Any]]:
    """Every sidecar's /status; a busy event loop may take seconds to answer."""
    assert system.group is not None
    found: dict[str, dict[str, Any]] = {}
    for name in system.group.members:
        for _ in range(3):
            status = system.group.status(name, timeout=15)
            if status is not None:
                found[name] = status
                break
    return found


def _events_out(statuses: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    return {name: int(status.get("eventsOut", 0)) for name, status in statuses.items()}


def profile_kdsync(
    clusters: Mapping[str, str],
    brokers: Mapping[str, int],
    work_dir: Path,
    *,
    event_bytes: int,
    seconds: float,
    partitions: int,
    progress: Callable[[str], None],
    load_fraction: float = 0.8,
    measure_events: int = 20_000,
    call_count_events: int = 10_000,
) -> dict[str, Any]:
    py_spy = find_py_spy()
    work_dir.mkdir(parents=True, exist_ok=True)
    topic = f"bench-profile-{int(time.time())}"
    system = KdsyncSystem(clusters, work_dir / "group", topic, partitions)
    members = len(clusters)
    report: dict[str, Any] = {
        "members": members,
        "event_bytes": event_bytes,
        "seconds": seconds,
        "rate_hz": RATE,
        "load_fraction": load_fraction,
    }
    try:
        progress(f"profile: kdsync on {members} clusters, {event_bytes}-byte events")
        system.start(300)
        phases = work_dir / "phases"
        warmup = run_phase(system, brokers, PhaseSpec("warmup", 1, event_bytes, 2000), phases)
        if not warmup.complete:
            raise RuntimeError(f"warm-up failed: {warmup.error}")
        measured = run_phase(
            system, brokers, PhaseSpec("throughput", 2, event_bytes, measure_events), phases
        )
        if not measured.complete or not measured.elapsed_s:
            raise RuntimeError(f"measuring the maximum failed: {measured.error}")
        # Sustained, not a burst: a large backlog wedges the group today (issue #11), and a
        # wedged group's profile says nothing about steady work.
        rate = load_fraction * measure_events / measured.elapsed_s
        report["max_events_per_s_per_origin"] = round(measure_events / measured.elapsed_s, 1)
        report["offered_events_per_s_per_origin"] = round(rate, 1)
        progress(
            f"  maximum {measure_events / measured.elapsed_s:,.0f} events/s per origin; "
            f"offering {rate:,.0f}/s per origin ({load_fraction:.0%}) while recording"
        )
        # More than the window needs (py-spy takes a while to attach); stopped after it.
        events = int(rate * (seconds + _SETTLE_SECONDS + 120))
        spec = LoadSpec(tuple(system.origins()), 3, events, event_bytes, rate)
        files = [work_dir / f"sustained-{x}.json" for x in ("spec", "result")]
        files[0].write_text(json.dumps(spec.to_json()))
        load = Child(
            _python_module("kdsync.benchmark.load", *map(str, files)),
            work_dir / "sustained.log",
            work_dir,
        )
        time.sleep(_SETTLE_SECONDS)  # let the offered load reach a steady state first
        report["profile"] = _record(system, brokers, py_spy, work_dir, seconds, progress)
        report["profile"]["kept_up"] = (
            report["profile"]["events_written_per_s"] >= 0.9 * rate * members * members
        )
        load.kill()
    finally:
        system.stop()
    _print(report, progress)
    report["call_counts"] = count_calls(
        clusters,
        brokers,
        work_dir / "calls",
        event_bytes=event_bytes,
        events_per_origin=call_count_events,
        partitions=partitions,
        progress=progress,
    )
    return report


def _record(
    system: KdsyncSystem,
    brokers: Mapping[str, int],
    py_spy: str,
    work_dir: Path,
    seconds: float,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    assert system.group is not None
    pids = {name: m.process.pid for name, m in system.group.members.items() if m.process}
    progress(f"  recording {seconds:.0f}s with py-spy on {len(pids)} sidecars")
    statuses_before = _statuses(system)
    events_before = _events_out(statuses_before)
    threads_before = {name: thread_cpu_seconds(pid) for name, pid in pids.items()}
    waits_before = {name: run_queue_wait_seconds(pid) or 0.0 for name, pid in pids.items()}
    brokers_before = {name: cpu_seconds(pid) or 0.0 for name, pid in brokers.items()}
    prober = HealthProber({n: m.http for n, m in system.group.members.items()})
    prober.start()
    raw = {name: work_dir / f"py-spy-{name}.txt" for name in pids}
    spies = {
        name: subprocess.Popen(
            [
                py_spy, "record", "--pid", str(pid), "--duration", str(int(seconds)),
                "--rate", str(RATE), "--format", "raw", "--output", str(raw[name]),
                "--threads", "--gil", "--native", "--function",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(work_dir / f"py-spy-{name}.log").open("wb"),
        )
        for name, pid in pids.items()
    }  # fmt: skip
    started = time.monotonic()
    for spy in spies.values():
        spy.wait(timeout=seconds + 120)
    elapsed = time.monotonic() - started
    health = prober.stop()
    threads_after = {name: thread_cpu_seconds(pid) for name, pid in pids.items()}
    waits_after = {name: run_queue_wait_seconds(pid) or 0.0 for name, pid in pids.items()}
    brokers_after = {name: cpu_seconds(pid) or 0.0 for name, pid in brokers.items()}
    events_after = _events_out(_statuses(system))

    per_sidecar: dict[str, Any] = {}
    all_stacks = []
    for name, pid in pids.items():
        text = raw[name].read_text() if raw[name].exists() else ""
        stacks = parse_raw(text)
        all_stacks += stacks
        cpu = thread_cpu_kinds(threads_before[name], threads_after[name], pid)
        events = (
            events_after[name] - events_before[name]
            if name in events_after and name in events_before
            else 0
        )
        total_cpu = sum(cpu.values())
        per_sidecar[name] = {
            "role": statuses_before.get(name, {}).get("role"),
            "cpu_seconds_by_thread_kind": cpu,
            "cpu_seconds": round(total_cpu, 2),
            "cores": round(total_cpu / elapsed, 2),
            # Runnable but not running: CPU the machine's other tenants took.
            "waited_for_cpu_seconds": round(waits_after[name] - waits_before[name], 2),
            "events_written": events,
            "cpu_us_per_event_written": round(1e6 * total_cpu / events, 1) if events else None,
            "py_spy": summarise(stacks, seconds, RATE, limit=12),
            "py_spy_raw": str(raw[name]),
        }
    return {
        "elapsed_s": round(elapsed, 1),
        "sidecars": per_sidecar,
        "all_sidecars": summarise(all_stacks, seconds, RATE, processes=len(pids), limit=25),
        "healthz_ms": health,
        "broker_cpu_seconds": {
            n: round(brokers_after[n] - brokers_before[n], 2) for n in brokers_before
        },
        "events_out_start": events_before,
        "events_out_end": events_after,
        "events_written_per_s": round(
            sum(per_sidecar[n]["events_written"] for n in per_sidecar) / elapsed, 1
        ),
    }


def _print(report: dict[str, Any], progress: Callable[[str], None]) -> None:
    profile = report.get("profile")
    if not profile:
        return
    progress(
        f"profile over {profile['elapsed_s']}s: {profile['events_written_per_s']:,.0f} events/s "
        f"written into the T-globals (kept up with the offered load: {profile['kept_up']})"
    )
    for name, sidecar in profile["sidecars"].items():
        progress(
            f"  {name} ({sidecar['role']}): {sidecar['cores']} cores, "
            f"{sidecar['events_written']:,} events written, "
            f"{sidecar['cpu_us_per_event_written']} us CPU/event, "
            f"waited {sidecar['waited_for_cpu_seconds']}s for a CPU; "
            f"GIL busy {sidecar['py_spy'].get('gil_busy_percent')}%; "
            f"threads {sidecar['cpu_seconds_by_thread_kind']}"
        )
    summary = profile["all_sidecars"]
    for title, key in (
        ("kdsync functions (with the library code they call)", "kdsync_function_with_callees"),
        ("Python functions by self time", "self_python"),
        ("leaf frames", "leaf"),
    ):
        progress(f"  {title}, % of GIL-holding samples:")
        for row in summary.get(key, [])[:12]:
            progress(f"    {row['percent']:5.1f}%  {row['name']}")
    for name, health in profile["healthz_ms"].items():
        percentiles = health["percentiles_ms"]
        progress(
            f"  /healthz {name}: p50 {percentiles.get('p50', 0):.0f} ms, "
            f"p99 {percentiles.get('p99', 0):.0f} ms, max {health['max_ms'] or 0:.0f} ms"
        )
