"""``--profile``'s second pass: exact call counts per event, from a deterministic profiler.

Every sidecar runs under :mod:`kdsync.benchmark.count_calls`; the group replicates a known
number of events; at exit each sidecar writes pstats. Dividing each function's call count
by the events that sidecar wrote into its ``T-global`` tells per-event work (about one call
or more per event) from per-batch work (far fewer). Timings under a deterministic profiler
are inflated; the counts are exact.
"""

from __future__ import annotations

import os
import pstats
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kdsync.benchmark.phases import PhaseSpec, run_phase
from kdsync.benchmark.systems import KdsyncSystem
from kdsync.local_group import LocalSidecarGroup
from kdsync.localkafka.process import spawn_tied_to_parent

# Folders up to the package: .../sidecar/kdsync/x.py -> kdsync/x.py, and the same for the
# standard library and site-packages.
_SHORT_PATH = re.compile(r"^.*/(sidecar|site-packages|lib/python3\.\d+)/")
# A function called at least this often per event written is per-event work.
PER_EVENT = 0.5


class CallCountingGroup(LocalSidecarGroup):
    """A local group whose sidecars run under the all-threads deterministic profiler.

    Starts members like :meth:`LocalSidecarGroup.start_member`, with
    ``kdsync.benchmark.count_calls <stats file>`` in front of the ``kdsync`` arguments.
    """

    def stats_path(self, name: str) -> Path:
        return self.run_dir / f"calls-{name}.pstats"

    def start_member(self, name: str) -> None:
        member = self.members[name]
        if member.running:
            return
        if member.log_file is not None:
            member.log_file.close()
        member.log_file = member.log_path.open("ab")
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        member.process = spawn_tied_to_parent(
            [
                sys.executable, "-m", "kdsync.benchmark.count_calls", str(self.stats_path(name)),
                "run", "--config", str(member.config_path),
            ],
            log_file=member.log_file,
            cwd=self.run_dir,
            env=env,
        )  # fmt: skip


def _label(key: tuple[str, int, str]) -> str:
    path, _, function = key
    if path == "~":
        return function  # a builtin, e.g. <method 'produce' of 'cimpl.Producer' objects>
    return f"{_SHORT_PATH.sub('', path)}:{function}"


def summarise_calls(stats_file: Path, events: int, limit: int = 25) -> dict[str, Any]:
    """The busiest functions (own wall time, waiting included: cProfile measures wall
    time) with their calls per event, and the functions called about once per event or more
    (``<string>`` ones are dataclass-generated ``__init__``s)."""
    stats: Mapping[tuple[str, int, str], tuple[Any, ...]] = pstats.Stats(  # type: ignore[attr-defined]
        str(stats_file)
    ).stats
    total_own = sum(v[2] for v in stats.values()) or 1.0
    rows = []
    for key, (_, calls, own, cumulative, _) in stats.items():
        rows.append(
            {
                "function": _label(key),
                "calls": calls,
                "calls_per_event": round(calls / events, 3) if events else None,
                "own_percent": round(100 * own / total_own, 1),
                "cumulative_s": round(cumulative, 2),
            }
        )
    by_own = sorted(rows, key=lambda r: r["own_percent"], reverse=True)[:limit]
    per_event = sorted(
        (
            r
            for r in rows
            if r["calls_per_event"] is not None
            and r["calls_per_event"] >= PER_EVENT
            and str(r["function"]).startswith(("kdsync/", "<method", "<built-in", "<string>"))
        ),
        key=lambda r: r["calls_per_event"],
        reverse=True,
    )[:limit]
    return {"events_written": events, "by_own_time": by_own, "per_event_functions": per_event}


def count_calls(
    clusters: Mapping[str, str],
    brokers: Mapping[str, int],
    work_dir: Path,
    *,
    event_bytes: int,
    events_per_origin: int,
    partitions: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    group_dir = work_dir / "group"
    system = KdsyncSystem(
        clusters, group_dir, f"bench-calls-{os.getpid()}", partitions,
        group_class=CallCountingGroup,
    )  # fmt: skip
    progress(
        f"call counts: kdsync on {len(clusters)} clusters under a deterministic profiler, "
        f"{events_per_origin:,} events per origin"
    )
    events_out: dict[str, int] = {}
    try:
        system.start(300)
        phase = run_phase(
            system,
            brokers,
            PhaseSpec("throughput", 1, event_bytes, events_per_origin, deadline_seconds=600),
            work_dir,
        )
        if not phase.complete:
            raise RuntimeError(f"the counted run did not complete: {phase.error}")
        assert system.group is not None
        for name in system.group.members:
            status = system.group.status(name) or {}
            events_out[name] = int(status.get("eventsOut", 0))
    finally:
        system.stop()
    group = system.group
    assert isinstance(group, CallCountingGroup)
    result: dict[str, Any] = {}
    for name, events in events_out.items():
        stats = group.stats_path(name)
        if stats.exists():
            result[name] = summarise_calls(stats, events)
    _print(result, progress)
    return result


def _print(result: Mapping[str, Any], progress: Callable[[str], None]) -> None:
    for name, summary in list(result.items())[:1]:  # one sidecar is representative
        progress(f"  {name}: functions called per event written ({summary['events_written']:,}):")
        for row in summary["per_event_functions"][:20]:
            progress(f"    {row['calls_per_event']:8.2f}  {row['function']}")
