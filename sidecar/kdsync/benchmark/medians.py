"""One figure per system, event size and load out of a run's rounds (``--repeat N``).

Every round measures each system afresh (started, warmed up, measured at every size,
stopped), so the rounds are independent samples of one measurement. Each figure of the
table is the median (``statistics.median``) over the rounds that count for it:

- throughput figures (deliveries/s, MB/s, elapsed, CPU per million, cores, the brokers'
  CPU): the rounds whose throughput phase delivered every event by its deadline, with the
  lowest and highest deliveries/s among them as the spread;
- latency at each load: the rounds whose phase at that load delivered every event; each
  percentile on its own (the median p99 need not come from the round of the median p50).
  Each round offered its loads as fractions of its own maximum;
- peak memory: the rounds in which it was read;
- the ceiling: the rounds in which the perf tools finished.

A round that missed deliveries is left out, not counted as zero: ``counted`` says how many
remained. With one round every median is that round's figure.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kdsync.benchmark.ceiling import CeilingResult
from kdsync.benchmark.phases import PhaseResult
from kdsync.benchmark.runner import BenchResult, SystemRun


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values given (``None``: not measured, left out)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


@dataclass(frozen=True)
class LatencyMedians:
    load_fraction: float
    counted: int  # rounds whose phase at this load delivered everything
    percentiles_ms: dict[str, float]  # p50, p99, p99.9: each the median over those rounds


@dataclass(frozen=True)
class SystemMedians:
    label: str
    members: int
    event_bytes: int
    rounds: int  # rounds run
    counted: int  # rounds whose throughput phase delivered everything
    deliveries_per_s: float | None = None
    deliveries_per_s_min: float | None = None
    deliveries_per_s_max: float | None = None
    mb_per_s: float | None = None
    elapsed_s: float | None = None
    cpu_s_per_million: float | None = None
    cores_used: float | None = None
    broker_cpu_s_per_million: float | None = None
    latency: tuple[LatencyMedians, ...] = ()
    peak_rss_bytes: float | None = None  # the largest process's peak
    peak_rss_sum_bytes: float | None = None  # the peaks of all its processes, summed

    def at_load(self, fraction: float) -> LatencyMedians | None:
        found = (m for m in self.latency if m.load_fraction == fraction and m.counted)
        return next(found, None)

    def p99(self, fraction: float) -> float | None:
        at = self.at_load(fraction)
        return at.percentiles_ms.get("p99") if at else None

    @property
    def deliveries_per_cpu_s(self) -> float | None:
        """Cross-cluster deliveries per CPU-second of the system's own processes."""
        return 1e6 / self.cpu_s_per_million if self.cpu_s_per_million else None


@dataclass(frozen=True)
class CeilingMedians:
    event_bytes: int
    clusters: int
    counted: int  # rounds in which the perf tools finished
    ceiling_per_s: float
    ceiling_per_s_min: float
    ceiling_per_s_max: float
    produce_per_s: float
    consume_per_s: float
    tool_peak_rss_bytes: float  # the largest perf tool's peak


def _complete(phase: PhaseResult | None) -> PhaseResult | None:
    return phase if phase is not None and phase.complete else None


def _latency(runs: Sequence[SystemRun], size: int, fraction: float) -> LatencyMedians:
    phases = [
        p
        for run in runs
        if (p := _complete(run.phase("latency", size, fraction))) is not None and p.latency.count
    ]
    names = dict.fromkeys(name for p in phases for name in p.latency.percentiles_ms)
    percentiles = {
        name: statistics.median(
            p.latency.percentiles_ms[name] for p in phases if name in p.latency.percentiles_ms
        )
        for name in names
    }
    return LatencyMedians(fraction, len(phases), percentiles)


def system_medians(
    runs: Sequence[SystemRun], size: int, load_fractions: Sequence[float]
) -> SystemMedians:
    """The medians of one system's rounds (``runs``, all the same system) at one size."""
    first = runs[0]
    phases = [p for run in runs if (p := _complete(run.phase("throughput", size))) is not None]
    rates = [p.deliveries_per_s for p in phases if p.deliveries_per_s is not None]
    memories = [run.memory.values() for run in runs if run.memory]
    return SystemMedians(
        first.label,
        first.members,
        size,
        rounds=len(runs),
        counted=len(phases),
        deliveries_per_s=median(rates),
        deliveries_per_s_min=min(rates, default=None),
        deliveries_per_s_max=max(rates, default=None),
        mb_per_s=median(p.mb_per_s for p in phases),
        elapsed_s=median(p.elapsed_s for p in phases),
        cpu_s_per_million=median(p.cpu_s_per_million for p in phases),
        cores_used=median(p.cores_used for p in phases),
        broker_cpu_s_per_million=median(p.broker_cpu_s_per_million for p in phases),
        latency=tuple(_latency(runs, size, f) for f in load_fractions),
        peak_rss_bytes=median(max(m["peak_rss_bytes"] for m in ms) for ms in memories),
        peak_rss_sum_bytes=median(sum(m["peak_rss_bytes"] for m in ms) for ms in memories),
    )


def ceiling_medians(ceilings: Sequence[CeilingResult]) -> CeilingMedians | None:
    """The medians of the ceiling's rounds at one size; ``None`` if none finished."""
    if not ceilings:
        return None
    rates = [c.ceiling_per_s for c in ceilings]
    return CeilingMedians(
        ceilings[0].event_bytes,
        ceilings[0].clusters,
        counted=len(ceilings),
        ceiling_per_s=statistics.median(rates),
        ceiling_per_s_min=min(rates),
        ceiling_per_s_max=max(rates),
        produce_per_s=statistics.median(c.produce_per_s for c in ceilings),
        consume_per_s=statistics.median(c.consume_per_s for c in ceilings),
        tool_peak_rss_bytes=statistics.median(
            max(t.peak_rss_bytes for t in c.produce + c.consume) for c in ceilings
        ),
    )


def medians_at(result: BenchResult, size: int) -> list[SystemMedians]:
    """Every system's medians at one size, in the order the systems ran."""
    return [
        system_medians(result.rounds_of(label, members), size, result.settings.load_fractions)
        for label, members in result.measured()
    ]


def medians_json(result: BenchResult) -> dict[str, Any]:
    ceilings = (ceiling_medians(result.ceilings_at(s)) for s in result.settings.sizes)
    return {
        "rounds": result.settings.repeat,
        "systems": [asdict(m) for s in result.settings.sizes for m in medians_at(result, s)],
        "ceilings": [asdict(c) for c in ceilings if c is not None],
    }


def result_document(result: BenchResult) -> dict[str, Any]:
    """What ``hack/bench-replication`` writes: every round's figures, then their medians."""
    return {**result.to_json(), "medians": medians_json(result)}
