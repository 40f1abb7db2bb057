"""CPU time and memory of processes (and their threads), read from Linux's /proc."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(path: Path) -> list[str] | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return text[text.rfind(")") + 2 :].split()


def _cpu(fields: list[str]) -> float:
    # Fields 14 and 15 (utime, stime); fields[0] is field 3.
    return (int(fields[11]) + int(fields[12])) / _TICKS


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of every thread of ``pid`` so far (None if it is gone)."""
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    return None if fields is None else _cpu(fields)


def cpu_and_start(pid: int) -> tuple[float, int] | None:
    """``pid``'s CPU seconds so far (as :func:`cpu_seconds`) and when it started, in clock
    ticks since boot, from one read (None if it is gone). With the pid, the start names a
    process even after the pid is reused."""
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    return None if fields is None else (_cpu(fields), int(fields[19]))  # field 22


def ticks_since_boot() -> int:
    """Now, in the clock ticks that :func:`cpu_and_start`'s start is counted in."""
    return int(float(Path("/proc/uptime").read_text().split()[0]) * _TICKS)


@dataclass(frozen=True)
class Memory:
    rss_bytes: int
    peak_rss_bytes: int  # VmHWM: the highest resident set size since the process started


def memory(pid: int) -> Memory | None:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    values: dict[str, int] = {}
    for line in lines:
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024  # reported in kB
    if "VmHWM" not in values:
        return None  # a zombie has no memory lines
    return Memory(values.get("VmRSS", 0), values["VmHWM"])


def thread_cpu_seconds(pid: int) -> dict[tuple[int, str], float]:
    """CPU per thread of ``pid``: (tid, thread name) -> seconds."""
    result: dict[tuple[int, str], float] = {}
    task_dir = Path(f"/proc/{pid}/task")
    try:
        tids = [int(entry.name) for entry in task_dir.iterdir()]
    except OSError:
        return result
    for tid in tids:
        try:
            name = (task_dir / str(tid) / "comm").read_text().strip()
        except OSError:
            continue
        fields = _stat_fields(task_dir / str(tid) / "stat")
        if fields is not None:
            result[(tid, name)] = _cpu(fields)
    return result


def run_queue_wait_seconds(pid: int) -> float | None:
    """How long the threads of ``pid`` were runnable but waiting for a CPU, so far.

    From ``/proc/<pid>/task/*/schedstat`` (second field, nanoseconds): on a shared machine
    this is the time other tenants took from the process.
    """
    task_dir = Path(f"/proc/{pid}/task")
    try:
        tasks = list(task_dir.iterdir())
    except OSError:
        return None
    waited = 0
    for task in tasks:
        try:
            waited += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return waited / 1e9


class CpuMeter:
    """CPU used by a set of processes between :meth:`start` and :meth:`stop`.

    A process that exits in between counts with its last reading.
    """

    def __init__(self, pids: Mapping[str, int]) -> None:
        self.pids = dict(pids)
        self._start: dict[str, float] = {}
        self._last: dict[str, float] = {}

    def start(self) -> None:
        self._start = self._read(self.pids.items())
        self._last = dict(self._start)

    def sample(self) -> None:
        self._last.update(self._read(self.pids.items()))

    def stop(self) -> dict[str, float]:
        """Seconds of CPU per process name since :meth:`start`."""
        self.sample()
        return {name: self._last[name] - self._start[name] for name in self._start}

    @staticmethod
    def _read(pids: Iterable[tuple[str, int]]) -> dict[str, float]:
        readings: dict[str, float] = {}
        for name, pid in pids:
            seconds = cpu_seconds(pid)
            if seconds is not None:
                readings[name] = seconds
        return readings
