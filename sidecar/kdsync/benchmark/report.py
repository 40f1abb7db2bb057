"""The benchmark's table: per event size, every system side by side, then the ratios.

Rendered as aligned text for the terminal and as Markdown for ``docs/performance.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kdsync.benchmark.phases import PhaseResult
from kdsync.benchmark.runner import KDSYNC, MM2, MM2_EOS, BenchResult, SystemRun

MIB = 1024 * 1024


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def _latency(phase: PhaseResult | None) -> str:
    if phase is None or not phase.latency.count:
        return "-"
    p = phase.latency.percentiles_ms
    return f"{p['p50']:,.0f} / {p['p99']:,.0f} / {p['p99.9']:,.0f}"


def _delivery(run: SystemRun, size: int) -> str:
    if run.error:
        return f"FAILED: {run.error[:60]}"
    phases = [p for p in run.phases if p.event_bytes == size]
    measured = [p for p in phases if p.kind != "warmup"]
    missing = sum(p.missing for p in phases)
    duplicates = sum(p.duplicates for p in phases)
    incomplete = [p for p in measured if not p.complete]
    if incomplete:
        phase = incomplete[0]
        return (
            f"INCOMPLETE: {phase.kind} phase, {phase.missing:,} of "
            f"{phase.expected_deliveries:,} missing at the deadline"
        )
    if missing:
        return f"{missing:,} MISSING"
    if duplicates:
        return f"all, {duplicates:,} duplicates"
    return "exactly once" if measured else "-"


def _efficiency(phase: PhaseResult | None) -> float | None:
    """Cross-cluster deliveries per CPU-second of the system's own processes."""
    if phase is None or not phase.system_cpu_s or not phase.deliveries:
        return None
    return phase.deliveries / phase.system_cpu_s


def _complete(phase: PhaseResult | None) -> PhaseResult | None:
    return phase if phase is not None and phase.complete else None


def _p99(phase: PhaseResult | None) -> float | None:
    if phase is None or not phase.complete:
        return None
    return phase.latency.percentiles_ms.get("p99")


def system_rows(result: BenchResult, size: int) -> list[list[str]]:
    header = [
        "system", "N", "deliveries/s", "MB/s", "elapsed s", "CPU s per M", "cores",
        "brokers' CPU s per M",
        "p50/p99/p99.9 ms @25%", "p50/p99/p99.9 ms @50%", "peak RSS MiB (max, sum)", "delivery",
    ]  # fmt: skip
    rows = [header]
    for run in result.systems:
        phase = run.phase("throughput", size)
        if phase is not None and not phase.complete:
            phase = None  # an incomplete phase has no rate; the delivery column says why
        rss = run.memory.values()
        rows.append(
            [
                run.label,
                str(run.members),
                _num(phase.deliveries_per_s if phase else None),
                _num(phase.mb_per_s if phase else None, 1),
                _num(phase.elapsed_s if phase else None, 1),
                _num(phase.cpu_s_per_million if phase else None, 1),
                _num(phase.cores_used if phase else None, 2),
                _num(phase.broker_cpu_s_per_million if phase else None, 1),
                _latency(_complete(run.phase("latency", size, 0.25))),
                _latency(_complete(run.phase("latency", size, 0.5))),
                f"{_num(run.peak_rss_bytes / MIB)}, "
                f"{_num(sum(m['peak_rss_bytes'] for m in rss) / MIB)}"
                if run.memory
                else "-",
                _delivery(run, size),
            ]
        )
    ceiling = result.ceiling(size)
    if ceiling is not None:
        tools = ceiling.produce + ceiling.consume
        rows.append(
            [
                "ceiling",
                str(ceiling.clusters),
                _num(ceiling.ceiling_per_s),
                _num(ceiling.ceiling_per_s * size / 1e6, 1),
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                f"{_num(max(t.peak_rss_bytes for t in tools) / MIB)} (one perf tool)",
                f"produce {_num(ceiling.produce_per_s)}/s, consume {_num(ceiling.consume_per_s)}/s",
            ]
        )
    return rows


def ratio_rows(result: BenchResult, size: int) -> list[list[str]]:
    header = [
        "N", "throughput kdsync/MM2-EOS", "kdsync/MM2", "kdsync/ceiling",
        "per-CPU kdsync/MM2-EOS", "per-CPU kdsync/MM2",
        "p99@50% kdsync/MM2-EOS", "p99@50% kdsync/MM2",
    ]  # fmt: skip
    rows = [header]
    ceiling = result.ceiling(size)
    for run in result.systems:
        if run.label != KDSYNC:
            continue
        mine = _complete(run.phase("throughput", size))
        mine_rate = mine.deliveries_per_s if mine else None
        others: dict[str, PhaseResult | None] = {}
        p99s: dict[str, float | None] = {}
        for label in (MM2_EOS, MM2):
            other = result.system(label, run.members)
            others[label] = _complete(other.phase("throughput", size)) if other else None
            p99s[label] = _p99(other.phase("latency", size, 0.5)) if other else None
        my_p99 = _p99(run.phase("latency", size, 0.5))
        rows.append(
            [
                str(run.members),
                *[
                    _ratio(mine_rate, o.deliveries_per_s if o else None)
                    for o in (others[MM2_EOS], others[MM2])
                ],
                _ratio(mine_rate, ceiling.ceiling_per_s if ceiling else None),
                *[_ratio(_efficiency(mine), _efficiency(others[x])) for x in (MM2_EOS, MM2)],
                *[_ratio(my_p99, p99s[x]) for x in (MM2_EOS, MM2)],
            ]
        )
    return rows


def _text_table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _markdown_table(rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def render(result: BenchResult, markdown: bool = False) -> str:
    table = _markdown_table if markdown else _text_table

    def heading(text: str) -> str:
        return f"### {text}" if markdown else f"== {text} =="

    parts: list[str] = []
    for size in result.settings.sizes:
        parts.append(heading(f"{size}-byte events"))
        if markdown:
            parts.append("")
        parts.append(table(system_rows(result, size)))
        parts.append("")
        parts.append(table(ratio_rows(result, size)))
        parts.append("")
    return "\n".join(parts)
