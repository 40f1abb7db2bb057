"""The benchmark's table: per event size, every system side by side, then the ratios.

Rendered as aligned text for the terminal and as Markdown for ``docs/performance.md``.
With several rounds (``--repeat N``) every figure is the median of the rounds that
delivered everything (:mod:`.medians`), with a column for the spread of deliveries/s;
with one round the table is that round's.
"""

from __future__ import annotations

from collections.abc import Sequence

from kdsync.benchmark.medians import (
    LatencyMedians,
    ceiling_medians,
    medians_at,
)
from kdsync.benchmark.runner import KDSYNC, MM2, MM2_EOS, BenchResult, SystemRun

MIB = 1024 * 1024
EN_DASH = "\N{EN DASH}"  # ranges, as docs/performance.md writes them


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def _counted(counted: int, rounds: int) -> str:
    """Nothing when every round counted, else how many did."""
    return "" if counted == rounds else f" ({counted} of {rounds} counted)"


def _latency(medians: LatencyMedians | None, rounds: int) -> str:
    if medians is None or not medians.counted:
        return "-"
    p = medians.percentiles_ms
    return (
        f"{p['p50']:,.0f} / {p['p99']:,.0f} / {p['p99.9']:,.0f}{_counted(medians.counted, rounds)}"
    )


def _spread(low: float | None, high: float | None, counted: int, rounds: int) -> str:
    if low is None or high is None:
        return "-"
    return f"{_num(low)}{EN_DASH}{_num(high)}{_counted(counted, rounds)}"


def _round_delivery(run: SystemRun, size: int) -> str:
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


def _delivery(runs: Sequence[SystemRun], size: int) -> str:
    """What each round delivered; with several rounds, only the rounds that fell short."""
    if len(runs) == 1:
        return _round_delivery(runs[0], size)
    found = [(run.round, _round_delivery(run, size)) for run in runs]
    if all(text == "exactly once" for _, text in found):
        return "exactly once"
    return "; ".join(f"round {n}: {text}" for n, text in found if text != "exactly once")


def _several_rounds(result: BenchResult) -> bool:
    return result.settings.repeat > 1


def system_rows(result: BenchResult, size: int) -> list[list[str]]:
    several = _several_rounds(result)
    spread = [f"deliveries/s (min{EN_DASH}max of {result.settings.repeat})"] if several else []
    header = [
        "system", "N", "deliveries/s", *spread, "MB/s", "elapsed s", "CPU s per M", "cores",
        "brokers' CPU s per M",
        "p50/p99/p99.9 ms @25%", "p50/p99/p99.9 ms @50%", "peak RSS MiB (max, sum)", "delivery",
    ]  # fmt: skip
    rows = [header]
    for m in medians_at(result, size):
        rows.append(
            [
                m.label,
                str(m.members),
                _num(m.deliveries_per_s),
                *(
                    [_spread(m.deliveries_per_s_min, m.deliveries_per_s_max, m.counted, m.rounds)]
                    if several
                    else []
                ),
                _num(m.mb_per_s, 1),
                _num(m.elapsed_s, 1),
                _num(m.cpu_s_per_million, 1),
                _num(m.cores_used, 2),
                _num(m.broker_cpu_s_per_million, 1),
                _latency(m.at_load(0.25), m.rounds),
                _latency(m.at_load(0.5), m.rounds),
                f"{_num(m.peak_rss_bytes / MIB)}, {_num(m.peak_rss_sum_bytes / MIB)}"
                if m.peak_rss_bytes is not None and m.peak_rss_sum_bytes is not None
                else "-",
                _delivery(result.rounds_of(m.label, m.members), size),
            ]
        )
    ceiling = ceiling_medians(result.ceilings_at(size))
    if ceiling is not None:
        rounds = result.settings.repeat
        spread_cell = (
            [_spread(ceiling.ceiling_per_s_min, ceiling.ceiling_per_s_max, ceiling.counted, rounds)]
            if several
            else []
        )
        rows.append(
            [
                "ceiling",
                str(ceiling.clusters),
                _num(ceiling.ceiling_per_s),
                *spread_cell,
                _num(ceiling.ceiling_per_s * size / 1e6, 1),
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                f"{_num(ceiling.tool_peak_rss_bytes / MIB)} (one perf tool)",
                f"produce {_num(ceiling.produce_per_s)}/s, consume {_num(ceiling.consume_per_s)}/s",
            ]
        )
    return rows


def ratio_rows(result: BenchResult, size: int) -> list[list[str]]:
    """kdsync over each peer at the same N; with several rounds, of their medians."""
    header = [
        "N", "throughput kdsync/MM2-EOS", "kdsync/MM2", "kdsync/ceiling",
        "per-CPU kdsync/MM2-EOS", "per-CPU kdsync/MM2",
        "p99@50% kdsync/MM2-EOS", "p99@50% kdsync/MM2",
    ]  # fmt: skip
    rows = [header]
    ceiling = ceiling_medians(result.ceilings_at(size))
    medians = medians_at(result, size)
    by_system = {(m.label, m.members): m for m in medians}
    for mine in (m for m in medians if m.label == KDSYNC):
        others = [by_system.get((label, mine.members)) for label in (MM2_EOS, MM2)]
        rows.append(
            [
                str(mine.members),
                *[_ratio(mine.deliveries_per_s, o.deliveries_per_s if o else None) for o in others],
                _ratio(mine.deliveries_per_s, ceiling.ceiling_per_s if ceiling else None),
                *[
                    _ratio(mine.deliveries_per_cpu_s, o.deliveries_per_cpu_s if o else None)
                    for o in others
                ],
                *[_ratio(mine.p99(0.5), o.p99(0.5) if o else None) for o in others],
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

    rounds = result.settings.repeat
    of_rounds = f" (medians of {rounds} rounds)" if _several_rounds(result) else ""
    parts: list[str] = []
    for size in result.settings.sizes:
        parts.append(heading(f"{size}-byte events{of_rounds}"))
        if markdown:
            parts.append("")
        parts.append(table(system_rows(result, size)))
        parts.append("")
        parts.append(table(ratio_rows(result, size)))
        parts.append("")
    return "\n".join(parts)
