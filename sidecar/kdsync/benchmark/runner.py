"""A whole benchmark run: every system on the same running clusters, one after another.

For each system: create a fresh source topic in its clusters, start it, warm it up (which
also proves every flow works end to end), then for each event size a throughput phase and
latency phases at fixed fractions of the throughput just measured; read each process's
peak memory, stop it, and delete every topic the run created, so the next system starts
on clean brokers. The ceiling (Kafka's perf tools) runs last.

That is one round. ``repeat`` rounds run one after another, each measuring every system
afresh in the same order (round 1: every system; round 2: every system; ...), so a drift
of the machine hits every system alike; :mod:`.medians` reduces the rounds to one figure
each. Every round's raw figures are kept (``SystemRun.round``, ``CeilingRound.round``).
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from kdsync.benchmark.ceiling import CeilingResult, ToolRun, run_ceiling
from kdsync.benchmark.phases import PhaseResult, PhaseSpec, run_phase
from kdsync.benchmark.probe import LatencySummary
from kdsync.benchmark.procstats import memory
from kdsync.benchmark.systems import (
    KdsyncSystem,
    MirrorMakerSystem,
    ReplicationSystem,
    delete_topics,
    list_topics,
)
from kdsync.local_group import DEFAULT_ORDERING
from kdsync.localkafka.distribution import KafkaDistribution

KDSYNC = "kdsync"
MM2_EOS = "MM2-EOS"
MM2 = "MM2"
SYSTEM_KINDS = (KDSYNC, MM2_EOS, MM2)


@dataclass(frozen=True)
class BenchSettings:
    kdsync_members: tuple[int, ...] = (2, 3, 5)
    mm2_members: tuple[int, ...] = (3,)
    ceiling_members: int = 3
    sizes: tuple[int, ...] = (100, 1024)
    events_per_origin: int = 20_000  # per throughput phase
    warmup_events: int = 2_000  # per origin, before the measured phases
    load_fractions: tuple[float, ...] = (0.25, 0.5)
    latency_seconds: float = 5.0  # offered load per latency phase
    partitions: int = 3  # of every source topic
    ceiling_mb: float = 100.0  # written per cluster by ProducerPerformance, per size
    mm2_tasks: int = 1
    systems: tuple[str, ...] = (*SYSTEM_KINDS, "ceiling")
    start_timeout: float = 300.0
    phase_deadline: float = 300.0
    repeat: int = 1  # rounds: every system measured this many times, interleaved
    # Further kdsync systems measured in the same rounds, each with these ``ordering``
    # settings over LocalSidecarGroup's ((camelCase key, value), ...): A/B on one machine.
    kdsync_variants: tuple[tuple[tuple[str, int], ...], ...] = ()

    def cluster_count(self) -> int:
        wanted = [self.ceiling_members] if "ceiling" in self.systems else []
        if KDSYNC in self.systems:
            wanted += self.kdsync_members
        if MM2 in self.systems or MM2_EOS in self.systems:
            wanted += self.mm2_members
        return max(wanted, default=2)


@dataclass
class SystemRun:
    label: str
    members: int
    settings: dict[str, Any] = field(default_factory=dict)
    phases: list[PhaseResult] = field(default_factory=list)
    memory: dict[str, dict[str, int]] = field(default_factory=dict)  # process -> bytes
    error: str | None = None
    seconds: float = 0.0
    round: int = 1  # of BenchSettings.repeat

    def phase(
        self, kind: str, event_bytes: int, fraction: float | None = None
    ) -> PhaseResult | None:
        for phase in self.phases:
            if (
                phase.kind == kind
                and phase.event_bytes == event_bytes
                and (fraction is None or phase.load_fraction == fraction)
            ):
                return phase
        return None

    @property
    def peak_rss_bytes(self) -> int:
        return max((m["peak_rss_bytes"] for m in self.memory.values()), default=0)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "members": self.members,
            "settings": self.settings,
            "phases": [p.to_json() for p in self.phases],
            "memory": self.memory,
            "error": self.error,
            "seconds": self.seconds,
            "round": self.round,
        }


@dataclass(frozen=True)
class CeilingRound(CeilingResult):
    """The ceiling at one size, measured in one round."""

    round: int = 1

    @classmethod
    def of(cls, ceiling: CeilingResult, round_number: int) -> CeilingRound:
        return cls(
            ceiling.event_bytes, ceiling.clusters, ceiling.produce, ceiling.consume, round_number
        )


@dataclass
class BenchResult:
    settings: BenchSettings
    systems: list[SystemRun] = field(default_factory=list)  # every round's, in run order
    ceilings: list[CeilingRound] = field(default_factory=list)
    ceiling_error: str | None = None
    broker_memory: dict[str, dict[str, int]] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    started_at: float = 0.0
    seconds: float = 0.0

    def measured(self) -> list[tuple[str, int]]:
        """Every (system, members) measured, in the order of the first round."""
        return list(dict.fromkeys((s.label, s.members) for s in self.systems))

    def rounds_of(self, label: str, members: int) -> list[SystemRun]:
        return [s for s in self.systems if s.label == label and s.members == members]

    def ceilings_at(self, event_bytes: int) -> list[CeilingRound]:
        return [c for c in self.ceilings if c.event_bytes == event_bytes]

    def to_json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at)),
            "seconds": self.seconds,
            "machine": self.machine,
            "settings": asdict(self.settings),
            "systems": [s.to_json() for s in self.systems],
            "ceilings": [
                {
                    **asdict(c),
                    "produce_per_s": c.produce_per_s,
                    "consume_per_s": c.consume_per_s,
                    "ceiling_per_s": c.ceiling_per_s,
                }
                for c in self.ceilings
            ],
            "ceilingError": self.ceiling_error,
            "brokerMemory": self.broker_memory,
        }


Progress = Callable[[str], None]


def _memory_of(pids: Mapping[str, int]) -> dict[str, dict[str, int]]:
    found: dict[str, dict[str, int]] = {}
    for name, pid in pids.items():
        reading = memory(pid)
        if reading is not None:
            found[name] = {"rss_bytes": reading.rss_bytes, "peak_rss_bytes": reading.peak_rss_bytes}
    return found


def _describe(phase: PhaseResult) -> str:
    state = "ok" if phase.complete else f"FAILED ({phase.error})"
    rate = f"{phase.deliveries_per_s:,.0f} deliveries/s" if phase.deliveries_per_s else "-"
    p99 = phase.latency.percentiles_ms.get("p99")
    ack = phase.origin_ack.percentiles_ms.get("p99")
    latency = f", p99 {p99:,.0f} ms" if p99 is not None else ""
    latency += f" (origin ack p99 {ack:,.0f} ms)" if ack is not None else ""
    waited = sum(phase.cpu_wait_s.values())
    latency += f"; waited {waited:.1f}s for a CPU" if waited >= 0.05 else ""
    return (
        f"{phase.deliveries:,} deliveries in {phase.elapsed_s or 0:.1f}s, {rate}{latency}: {state}"
    )


def measure_system(
    system: ReplicationSystem,
    settings: BenchSettings,
    brokers: Mapping[str, int],
    work_dir: Path,
    progress: Progress,
) -> SystemRun:
    run = SystemRun(system.label, system.members)
    started = time.monotonic()
    phase_ids = iter(range(1, 256))
    try:
        progress(f"{system.label} on {system.members} clusters: starting")
        system.start(settings.start_timeout)
        run.settings = system.settings()
        warmup = run_phase(
            system,
            brokers,
            PhaseSpec("warmup", next(phase_ids), settings.sizes[0], settings.warmup_events,
                      deadline_seconds=settings.start_timeout),
            work_dir,
        )  # fmt: skip
        progress(f"  warm-up: {_describe(warmup)}")
        run.phases.append(warmup)
        if not warmup.complete:
            run.error = f"warm-up failed: {warmup.error}"
            return run
        for size in settings.sizes:
            _measure_size(system, settings, brokers, work_dir, progress, run, size, phase_ids)
    except Exception as exc:  # one system failing must not lose the others' figures
        run.error = f"{type(exc).__name__}: {exc}"
        progress(f"  {system.label} failed: {run.error}")
    finally:
        run.memory = _memory_of(system.processes())  # peaks so far, before they exit
        run.settings = run.settings or system.settings()
        system.stop()
        run.seconds = time.monotonic() - started
    return run


def _measure_size(
    system: ReplicationSystem,
    settings: BenchSettings,
    brokers: Mapping[str, int],
    work_dir: Path,
    progress: Progress,
    run: SystemRun,
    size: int,
    phase_ids: Any,
) -> None:
    spec = PhaseSpec(
        "throughput", next(phase_ids), size, settings.events_per_origin,
        deadline_seconds=settings.phase_deadline,
    )  # fmt: skip
    throughput = run_phase(system, brokers, spec, work_dir)
    run.phases.append(throughput)
    progress(f"  {size} B throughput: {_describe(throughput)}")
    if not throughput.complete or not throughput.elapsed_s:
        return
    origins = system.members
    # The offered rate per origin that produced this many cross-cluster deliveries/s.
    max_per_origin = settings.events_per_origin / throughput.elapsed_s
    for fraction in settings.load_fractions:
        rate = max_per_origin * fraction
        events = max(10, math.ceil(rate * settings.latency_seconds))
        spec = PhaseSpec(
            "latency", next(phase_ids), size, events, rate_per_origin=rate,
            load_fraction=fraction,
            deadline_seconds=settings.latency_seconds + settings.phase_deadline,
        )  # fmt: skip
        latency = run_phase(system, brokers, spec, work_dir)
        run.phases.append(latency)
        progress(
            f"  {size} B at {fraction:.0%} ({rate * origins:,.0f} events/s offered in all): "
            f"{_describe(latency)}"
        )


def _cleanup_topics(clusters: Mapping[str, str], before: Mapping[str, set[str]]) -> None:
    for name, bootstrap in clusters.items():
        created = sorted(list_topics(bootstrap) - before[name])
        delete_topics(bootstrap, [t for t in created if not t.startswith("__")])


def variant_label(ordering: tuple[tuple[str, int], ...]) -> str:
    """``kdsync sourceLingerMs=20``: the system's name in tables and JSON."""
    return f"{KDSYNC} " + ",".join(f"{key}={value}" for key, value in ordering)


def _new_system(
    label: str, clusters: Mapping[str, str], system_dir: Path, settings: BenchSettings
) -> ReplicationSystem:
    topic = f"bench-{label.split(maxsplit=1)[0].lower()}-{len(clusters)}-{secrets.token_hex(3)}"
    if label == KDSYNC:
        return KdsyncSystem(clusters, system_dir, topic, settings.partitions)
    variants = {variant_label(v): v for v in settings.kdsync_variants}
    if label in variants:
        ordering = {**DEFAULT_ORDERING, **dict(variants[label])}
        return KdsyncSystem(clusters, system_dir, topic, settings.partitions, ordering, label=label)
    return MirrorMakerSystem(
        clusters, system_dir, topic, settings.partitions,
        exactly_once=label == MM2_EOS, tasks_max=settings.mm2_tasks,
    )  # fmt: skip


def _measure_ceiling(
    result: BenchResult,
    clusters: Mapping[str, str],
    kafka: KafkaDistribution,
    run_dir: Path,
    round_number: int,
    progress: Progress,
) -> None:
    settings = result.settings
    in_round = f"round {round_number}: " if settings.repeat > 1 else ""
    for size in settings.sizes:
        records = max(1000, int(settings.ceiling_mb * 1e6 / size))
        progress(f"ceiling, {size} B: ProducerPerformance/ConsumerPerformance x {len(clusters)}")
        try:
            ceiling = run_ceiling(clusters, kafka, size, records, settings.partitions, run_dir)
        except Exception as exc:
            result.ceiling_error = f"{in_round}{type(exc).__name__}: {exc}"
            progress(f"  ceiling failed: {result.ceiling_error}")
            continue
        result.ceilings.append(CeilingRound.of(ceiling, round_number))
        progress(
            f"  produce {ceiling.produce_per_s:,.0f}/s, consume {ceiling.consume_per_s:,.0f}/s"
        )


def _round_summary(result: BenchResult, round_number: int) -> str:
    """One line per round: each system's throughput at each size ("-" if incomplete)."""
    figures = []
    for run in (s for s in result.systems if s.round == round_number):
        for size in result.settings.sizes:
            phase = run.phase("throughput", size)
            rate = phase.deliveries_per_s if phase is not None and phase.complete else None
            figures.append(
                f"{run.label}-{run.members} {size} B "
                + (f"{rate:,.0f}/s" if rate is not None else "-")
            )
    return ", ".join(figures)


def run_benchmark(
    settings: BenchSettings,
    clusters: Mapping[str, str],
    brokers: Mapping[str, int],
    kafka: KafkaDistribution,
    work_dir: Path,
    progress: Progress,
    after_round: Callable[[BenchResult], None] | None = None,
) -> BenchResult:
    """Measure every selected system on ``clusters`` (name -> bootstrap, in order).

    ``brokers``: name -> pid of each cluster's broker JVM, measured separately. With
    ``settings.repeat`` above 1, every system (the ceiling too) is measured once per round,
    started afresh and warmed up each time, in the same order in every round.
    ``after_round`` sees the result so far after each round (the command line saves it,
    so a failure in a late round keeps the rounds before it).
    """
    if len(clusters) < settings.cluster_count():
        raise ValueError(f"{settings.cluster_count()} clusters needed, {len(clusters)} given")
    if settings.repeat < 1:
        raise ValueError(f"repeat must be at least 1, not {settings.repeat}")
    result = BenchResult(settings, started_at=time.time())
    names = list(clusters)
    plan: list[tuple[str, int]] = []
    if KDSYNC in settings.systems:
        plan += [(KDSYNC, n) for n in settings.kdsync_members]
        for variant in settings.kdsync_variants:
            plan += [(variant_label(variant), n) for n in settings.kdsync_members]
    for label in (MM2_EOS, MM2):
        if label in settings.systems:
            plan += [(label, n) for n in settings.mm2_members]
    for round_number in range(1, settings.repeat + 1):
        # One folder per system (and per round, when there are several).
        suffix = f"-round{round_number}" if settings.repeat > 1 else ""
        round_started = time.monotonic()
        if settings.repeat > 1:
            progress(f"round {round_number} of {settings.repeat}")
        for label, members in plan:
            chosen = {n: clusters[n] for n in names[:members]}
            folder = label.lower().replace(" ", "-").replace(",", "-").replace("=", "")
            system_dir = work_dir / f"{folder}-{members}{suffix}"
            before = {n: list_topics(b) for n, b in chosen.items()}
            system = _new_system(label, chosen, system_dir, settings)
            chosen_brokers = {n: brokers[n] for n in chosen if n in brokers}
            run = measure_system(system, settings, chosen_brokers, system_dir, progress)
            run.round = round_number
            result.systems.append(run)
            _cleanup_topics(chosen, before)
        if "ceiling" in settings.systems:
            chosen = {n: clusters[n] for n in names[: settings.ceiling_members]}
            ceiling_dir = work_dir / f"ceiling{suffix}"
            _measure_ceiling(result, chosen, kafka, ceiling_dir, round_number, progress)
        if settings.repeat > 1:
            minutes = (time.monotonic() - round_started) / 60
            progress(
                f"round {round_number} of {settings.repeat} done in {minutes:.1f} min: "
                f"{_round_summary(result, round_number) or 'no system measured'}"
            )
        if after_round is not None:
            result.seconds = time.time() - result.started_at
            after_round(result)
    result.broker_memory = _memory_of({f"broker {n}": p for n, p in brokers.items()})
    result.seconds = time.time() - result.started_at
    return result


def _phase_from_json(data: Mapping[str, Any]) -> PhaseResult:
    names = {f.name for f in fields(PhaseResult)}
    values = {k: v for k, v in data.items() if k in names}
    values["latency"] = LatencySummary(**data["latency"])
    values["origin_ack"] = LatencySummary(**data["origin_ack"])
    return PhaseResult(**values)


def result_from_json(data: Mapping[str, Any]) -> BenchResult:
    """A saved run (the JSON ``hack/bench-replication`` writes), to render it again.

    Reads files written before ``--repeat`` too: one round, no ``repeat`` setting. The
    medians a file holds are derived data and not read back: :mod:`.medians` recomputes
    them from the rounds.
    """
    saved: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in data["settings"].items()
    }
    saved["kdsync_variants"] = tuple(
        tuple(tuple(pair) for pair in variant) for variant in saved.get("kdsync_variants", ())
    )
    settings = BenchSettings(**saved)
    result = BenchResult(
        settings,
        ceiling_error=data.get("ceilingError"),
        broker_memory=data.get("brokerMemory", {}),
        machine=data.get("machine", {}),
        command=data.get("command", ""),
        seconds=data.get("seconds", 0.0),
    )
    for system in data["systems"]:
        run = SystemRun(
            system["label"],
            system["members"],
            system["settings"],
            [_phase_from_json(p) for p in system["phases"]],
            system["memory"],
            system["error"],
            system["seconds"],
            system.get("round", 1),  # files written before --repeat: one round
        )
        result.systems.append(run)
    for ceiling in data["ceilings"]:
        result.ceilings.append(
            CeilingRound(
                ceiling["event_bytes"],
                ceiling["clusters"],
                [ToolRun(**r) for r in ceiling["produce"]],
                [ToolRun(**r) for r in ceiling["consume"]],
                ceiling.get("round", 1),
            )
        )
    return result
