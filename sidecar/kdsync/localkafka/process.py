"""Child processes that cannot outlive us, and a registry to clean up after a crash.

Three layers make sure no broker JVM is left behind:

1. the fleet stops its brokers on normal exit, on exceptions and KeyboardInterrupt, and
   from ``atexit``;
2. every broker is started with ``PR_SET_PDEATHSIG=SIGKILL``, so the kernel kills it when
   the Python process dies, even by SIGKILL (Linux only);
3. each broker's pid is written to a registry file in its run folder; a later start finds
   registries whose owner is dead and kills any broker still alive (in case 2 was not
   available or the parent thread rule below bit).

``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child exits, not the process:
brokers must therefore be spawned from a long-lived thread (the fleet spawns from the
caller's thread and only waits in worker threads).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcessIdentity:
    """A pid plus its kernel start time, so a recycled pid is never mistaken for ours."""

    pid: int
    start_ticks: int

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity | None:
        """The identity of a running process, or None if there is no such process."""
        ticks = _start_ticks(pid)
        return None if ticks is None else cls(pid, ticks)

    @classmethod
    def current(cls) -> ProcessIdentity:
        me = cls.of(os.getpid())
        # Without /proc (not Linux) identities degrade to the bare pid.
        return me if me is not None else cls(os.getpid(), 0)

    def is_alive(self) -> bool:
        ticks = _start_ticks(self.pid)
        if ticks is None:
            return False
        if ticks != self.start_ticks:
            return False  # the pid now belongs to another process
        return _state(self.pid) not in {"Z", "X"}

    def to_json(self) -> dict[str, int]:
        return {"pid": self.pid, "start_ticks": self.start_ticks}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessIdentity:
        return cls(int(data["pid"]), int(data["start_ticks"]))


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) may contain spaces and parentheses; split after it.
    return text[text.rfind(")") + 2 :].split()


def _start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    if fields is None:
        if not Path("/proc/self/stat").exists():
            # No procfs: fall back to "a process with this pid exists".
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return None
            except PermissionError:
                return 0
            return 0
        return None
    # Field 22 (starttime); fields[0] is field 3 (state).
    return int(fields[19])


def _state(pid: int) -> str:
    fields = _stat_fields(pid)
    return fields[0] if fields else "?"


def _load_prctl() -> Callable[..., int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        prctl: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return prctl


# Looked up once in the parent: loading libraries in a forked child is not safe.
_PRCTL = _load_prctl()


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:
        # Runs in the child between fork and exec: ask the kernel for SIGKILL when the
        # parent goes away, then close the race where it already went away.
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


def spawn_tied_to_parent(
    argv: Sequence[str],
    *,
    log_file: IO[bytes],
    cwd: Path,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stdout and stderr in ``log_file``; it dies if we die.

    The child gets its own session so a Ctrl-C in the terminal reaches only us; we then
    stop it in order (a broker killed mid-shutdown would leave a slower recovery).
    """
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=None if env is None else dict(env),
        start_new_session=True,
        # preexec_fn is the only way to call prctl in the child before exec; it runs no
        # Python code that takes locks other threads could hold (prctl was looked up here).
        preexec_fn=_die_with_parent(os.getpid()),  # noqa: PLW1509
    )


@dataclass(frozen=True)
class RegisteredProcess:
    """One registry entry: a child process and the process that owns it."""

    name: str
    process: ProcessIdentity
    owner: ProcessIdentity
    path: Path


class PidRegistry:
    """``<folder>/<name>.json`` files naming live children and their owner."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def register(
        self, name: str, process: ProcessIdentity, owner: ProcessIdentity | None = None
    ) -> Path:
        """Record ``process``, owned by ``owner`` (default: this process)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{name}.json"
        owner = owner if owner is not None else ProcessIdentity.current()
        entry = {"process": process.to_json(), "owner": owner.to_json()}
        partial = path.with_suffix(".json.partial")
        partial.write_text(json.dumps(entry))
        partial.replace(path)  # atomic: a reader never sees half an entry
        return path

    def unregister(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.folder / f"{name}.json").unlink()

    def entries(self) -> list[RegisteredProcess]:
        found: list[RegisteredProcess] = []
        if not self.folder.is_dir():
            return found
        for path in sorted(self.folder.glob("*.json")):
            try:
                data = json.loads(path.read_text())
                found.append(
                    RegisteredProcess(
                        name=path.stem,
                        process=ProcessIdentity.from_json(data["process"]),
                        owner=ProcessIdentity.from_json(data["owner"]),
                        path=path,
                    )
                )
            except (OSError, ValueError, KeyError, TypeError):
                continue  # unreadable entry: nothing we can safely act on
        return found


def kill_orphans(registry: PidRegistry) -> list[RegisteredProcess]:
    """SIGKILL registered processes whose owner is dead; returns the ones killed.

    Entries whose owner is alive belong to another running session and are left alone.
    """
    killed: list[RegisteredProcess] = []
    for entry in registry.entries():
        if entry.owner.is_alive():
            continue
        if entry.process.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(entry.process.pid, signal.SIGKILL)
            killed.append(entry)
        with contextlib.suppress(FileNotFoundError):
            entry.path.unlink()
    return killed


def owner_alive(registry: PidRegistry) -> bool:
    """Whether any entry's owner is still running (the folder is in use)."""
    return any(entry.owner.is_alive() for entry in registry.entries())
