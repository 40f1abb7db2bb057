"""Reads py-spy's ``raw`` output (collapsed stacks) and says where the time goes.

The profiles are recorded with ``--gil --threads --native --function``: a sample is taken
only while some thread holds the GIL, so samples / (rate x seconds) is the share of wall
time the interpreter was busy, and every sample is a moment of Python execution (or of C
code running under the GIL: confluent-kafka's C layer, ssl, compression of Python objects).
Each line is ``thread (tid): name;frame;frame;...;leaf count``, frames root first; a
Python frame is ``function (package/module.py:line)``, a native one ``symbol (library)``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# "<string>" is code made by exec: the __init__/__eq__ that @dataclass generates.
_PYTHON_FRAME = re.compile(r"^(?P<function>.+) \((?P<path>[^()]+\.py|<string>):\d+\)$")
_NATIVE_FRAME = re.compile(r"^(?P<function>.+) \((?P<where>[^():]+)(?::\d+)?\)$")
_THREAD_FRAME = re.compile(r"^thread \((?P<tid>\w+)\): ?(?P<name>.*)$")


@dataclass(frozen=True)
class Frame:
    function: str
    where: str  # module path for Python frames, library or C file for native ones
    python: bool

    @property
    def label(self) -> str:
        return f"{self.where}:{self.function}"


@dataclass(frozen=True)
class Stack:
    thread: str
    frames: tuple[Frame, ...]  # root first
    count: int


def parse_frame(text: str) -> Frame:
    match = _PYTHON_FRAME.match(text)
    if match:
        return Frame(match["function"], match["path"], True)
    match = _NATIVE_FRAME.match(text)
    if match:
        return Frame(match["function"], match["where"], False)
    return Frame(text, "?", False)


def parse_raw(text: str) -> list[Stack]:
    stacks: list[Stack] = []
    for line in text.splitlines():
        body, _, count = line.rpartition(" ")
        if not body or not count.isdigit():
            continue
        parts = body.split(";")
        thread = "?"
        match = _THREAD_FRAME.match(parts[0])
        if match:
            thread = match["name"] or match["tid"]
            parts = parts[1:]
        stacks.append(Stack(thread, tuple(parse_frame(p) for p in parts), int(count)))
    return stacks


def native_category(frame: Frame) -> str:
    """Which library a native leaf frame belongs to."""
    where, function = frame.where.lower(), frame.function.lower()
    if "rdkafka" in where or function.startswith("rd_"):
        return "librdkafka (called under the GIL)"
    if "confluent_kafka" in where or "cimpl" in where or where.startswith("confluent_kafka"):
        return "confluent-kafka C layer"
    if "ssl" in where or "crypto" in where:
        return "OpenSSL"
    if "libpython" in where or where.endswith(".c") or where.endswith(".h"):
        return "CPython runtime (objects, allocation, builtins)"
    if "libc" in where or "ld-linux" in where:
        return "libc"
    return f"other native ({frame.where})"


def _deepest(frames: Sequence[Frame], wanted: str | None = None) -> Frame | None:
    for frame in reversed(frames):
        if frame.python and (wanted is None or frame.where.startswith(wanted)):
            return frame
    return None


def _top(counter: Counter[str], total: int, limit: int) -> list[dict[str, object]]:
    return [
        {"name": name, "samples": count, "percent": round(100 * count / total, 1)}
        for name, count in counter.most_common(limit)
    ]


def summarise(
    stacks: Iterable[Stack], seconds: float, rate: float, processes: int = 1, limit: int = 15
) -> dict[str, object]:
    """Where the GIL-holding time went, over ``processes`` sidecars profiled together."""
    stacks = list(stacks)
    total = sum(s.count for s in stacks)
    if not total:
        return {"samples": 0}
    self_python: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    kdsync_owner: Counter[str] = Counter()
    module_owner: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    leaf_kind: Counter[str] = Counter()
    for stack in stacks:
        frames, count = stack.frames, stack.count
        threads[_thread_kind(stack.thread)] += count
        deepest_python = _deepest(frames)
        if deepest_python is not None:
            self_python[deepest_python.label] += count
        for label in {f.label for f in frames if f.python}:
            inclusive[label] += count
        owner = _deepest(frames, "kdsync/")
        if owner is not None:
            kdsync_owner[owner.label] += count
            module_owner[owner.where] += count
        else:
            top = _deepest(frames)
            module_owner[f"(no kdsync frame) {top.where if top else '?'}"] += count
        leaf = frames[-1] if frames else None
        if leaf is None or leaf.python:
            leaf_kind["Python code"] += count
        else:
            leaf_kind[native_category(leaf)] += count
    possible = seconds * rate * processes
    return {
        "samples": total,
        "gil_busy_percent": round(100 * total / possible, 1) if possible else None,
        "threads": _top(threads, total, limit),
        "leaf": _top(leaf_kind, total, limit),
        "self_python": _top(self_python, total, limit),
        "inclusive_python": _top(inclusive, total, limit),
        "kdsync_function_with_callees": _top(kdsync_owner, total, limit),
        "kdsync_module_with_callees": _top(module_owner, total, limit),
    }


def _thread_kind(name: str) -> str:
    if name == "MainThread":
        return "MainThread (asyncio event loop)"
    if name.startswith("asyncio_"):
        return "asyncio.to_thread workers"
    return name


def thread_cpu_kinds(
    before: Mapping[tuple[int, str], float], after: Mapping[tuple[int, str], float], pid: int
) -> dict[str, float]:
    """CPU seconds per kind of OS thread between two /proc readings of one process."""
    kinds: dict[str, float] = {}
    for key, seconds in after.items():
        tid, name = key
        used = seconds - before.get(key, 0.0)
        if tid == pid:
            kind = "Python main thread (event loop)"
        elif name.startswith("rdk:"):
            kind = "librdkafka threads (rdk:*)"
        else:
            kind = "other Python threads (source reader, to_thread workers)"
        kinds[kind] = kinds.get(kind, 0.0) + used
    return {k: round(v, 2) for k, v in kinds.items()}
