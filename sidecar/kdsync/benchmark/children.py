"""Child processes whose exact CPU time and peak memory we want (from ``wait4``)."""

from __future__ import annotations

import os
import resource
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kdsync.localkafka.process import spawn_tied_to_parent


@dataclass(frozen=True)
class Finished:
    returncode: int
    cpu_seconds: float  # user + system of the child (all its threads)
    peak_rss_bytes: int
    log: Path


class Child:
    """A child process tied to us (it dies if we die), its output in ``log``."""

    def __init__(
        self, argv: Sequence[str], log: Path, cwd: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.log = log
        self._log_file = log.open("ab")
        self.process: subprocess.Popen[bytes] = spawn_tied_to_parent(
            argv, log_file=self._log_file, cwd=cwd, env=env
        )
        self.finished: Finished | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def done(self) -> bool:
        """True once the child exited (reaps it with ``wait4`` for its usage)."""
        if self.finished is not None:
            return True
        pid, status, usage = os.wait4(self.process.pid, os.WNOHANG)
        if pid == 0:
            return False
        self._finish(status, usage)
        return True

    def wait(self, timeout: float) -> Finished:
        deadline = time.monotonic() + timeout
        while not self.done():
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(
                    f"{self.log.stem} did not finish in {timeout:.0f}s; see {self.log}"
                )
            time.sleep(0.02)  # polling the child's exit, with a deadline
        assert self.finished is not None
        return self.finished

    def kill(self) -> None:
        if self.finished is None:
            self.process.kill()
            _, status, usage = os.wait4(self.process.pid, 0)
            self._finish(status, usage)

    def _finish(self, status: int, usage: resource.struct_rusage) -> None:
        code = os.waitstatus_to_exitcode(status)
        self.process.returncode = code  # reaped here: tell Popen so it never waits again
        self._log_file.close()
        self.finished = Finished(
            code,
            usage.ru_utime + usage.ru_stime,
            usage.ru_maxrss * 1024,  # kB on Linux
            self.log,
        )
