"""One single-node KRaft Kafka cluster (broker and controller in one JVM) on loopback."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

from kdsync.localkafka.config import (
    BrokerPorts,
    PropertyValue,
    ScramUser,
    broker_properties,
    render_properties,
)
from kdsync.localkafka.distribution import KafkaDistribution
from kdsync.localkafka.probe import (
    ProbeDeadlineExceeded,
    ProbeTargetDied,
    wait_until_transactional_produce,
)
from kdsync.localkafka.process import PidRegistry, ProcessIdentity, spawn_tied_to_parent

DEFAULT_HEAP = "768m"
# Startup matters more than peak throughput for test clusters on a small machine: the
# client compiler only, one GC thread, no shared perf-data file in /tmp.
DEFAULT_JVM_OPTIONS: tuple[str, ...] = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
)
LOG_TAIL_LINES = 40
_TOOL_TIMEOUT_SECONDS = 120.0

_CLUSTER_ID = re.compile(r"^[A-Za-z0-9_-]{22}$")
_BIND_FAILURE = re.compile(r"BindException|Address already in use")
_ERROR_LINE = re.compile(r"^\[[^]]*\] (ERROR|FATAL) ")


class BrokerError(RuntimeError):
    """A local broker could not be formatted, started or stopped."""


class BrokerStartupError(BrokerError):
    """The broker exited or did not become ready; the message ends with its log tail."""

    def __init__(self, message: str, *, port_in_use: bool = False) -> None:
        super().__init__(message)
        # True when the log says a listener could not bind: retrying on other ports helps.
        self.port_in_use = port_in_use


def _read_lines(path: Path, since: int = 0) -> list[str]:
    """Lines of ``path`` from byte offset ``since`` on (a broker log can be large, but a
    startup failure happens within its first few thousand lines)."""
    try:
        with path.open("rb") as handle:
            handle.seek(since)
            return handle.read().decode("utf-8", "replace").splitlines()
    except FileNotFoundError:
        return []


def _tail(path: Path, lines: int, since: int = 0) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(since)
            kept = deque(handle, maxlen=lines)
    except FileNotFoundError:
        return "(no log written)"
    return b"".join(kept).decode("utf-8", "replace").rstrip("\n")


class LocalKafkaBroker:
    """A one-node Kafka cluster: its own folder, ports, data and log file.

    The folder holds ``server.properties``, ``data/`` (the log dir; kept across
    :meth:`restart`), ``broker.log`` (stdout and stderr of every run, appended) and
    ``cluster.id``. Spawn it (:meth:`start`) from a thread that outlives it; see
    :mod:`kdsync.localkafka.process`.
    """

    def __init__(
        self,
        name: str,
        *,
        distribution: KafkaDistribution,
        work_dir: Path,
        ports: BrokerPorts,
        host: str = "127.0.0.1",
        overrides: Mapping[str, PropertyValue] | None = None,
        extra_listeners: Mapping[str, str] | None = None,
        advertised: Mapping[str, str] | None = None,
        scram_users: Sequence[ScramUser] = (),
        heap: str = DEFAULT_HEAP,
        jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS,
        pid_registry: PidRegistry | None = None,
    ) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"broker name {name!r}: use letters, digits, '.', '_' or '-'")
        self.name = name
        self.distribution = distribution
        self.work_dir = work_dir
        self.host = host
        self.overrides: dict[str, PropertyValue] = dict(overrides or {})
        # Client listeners besides PLAINTEXT: name -> security protocol (see broker_properties).
        self.extra_listeners: dict[str, str] = dict(extra_listeners or {})
        # Extra listener -> the host:port clients are told to use (e.g. a proxy's).
        self.advertised: dict[str, str] = dict(advertised or {})
        # SCRAM users written into the metadata when the data folder is formatted.
        self.scram_users = tuple(scram_users)
        self.heap = heap
        self.jvm_options = tuple(jvm_options)
        self._pid_registry = pid_registry
        self._ports = ports
        self._process: subprocess.Popen[bytes] | None = None
        # Where the current run's output starts in broker.log (the file is appended to).
        self._log_offset = 0
        self._identity: ProcessIdentity | None = None
        # Validates overrides now rather than at start.
        self._properties()

    # -- where things are --------------------------------------------------------------

    @property
    def ports(self) -> BrokerPorts:
        return self._ports

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self._ports.broker}"

    def listener_address(self, listener: str) -> str:
        """``host:port`` of an extra listener, e.g. ``listener_address("SSL")``."""
        if listener not in self.extra_listeners:
            raise KeyError(f"broker {self.name} has no extra listener {listener!r}")
        return f"{self.host}:{self._ports.extra_port(listener)}"

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    @property
    def config_path(self) -> Path:
        return self.work_dir / "server.properties"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "broker.log"

    @property
    def pid(self) -> int | None:
        """The broker JVM's pid while it runs."""
        if self._process is None or self._process.poll() is not None:
            return None
        return self._process.pid

    @property
    def process_identity(self) -> ProcessIdentity | None:
        """Pid and start time of the current JVM (None when stopped)."""
        return self._identity if self.is_running else None

    @property
    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def is_formatted(self) -> bool:
        return (self.data_dir / "meta.properties").is_file()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return _tail(self.log_path, lines)

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.is_running else "stopped"
        return f"LocalKafkaBroker({self.name!r}, {self.bootstrap_servers}, {state})"

    # -- lifecycle ---------------------------------------------------------------------

    def reassign_ports(self, ports: BrokerPorts) -> None:
        """Use other ports; wipes the data, since the controller's address is formatted in."""
        if self.is_running:
            raise BrokerError(f"broker {self.name}: cannot change ports while running")
        self._ports = ports
        self._wipe_data()

    def format(self) -> None:
        """Write ``server.properties`` and format the data folder (once; idempotent)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._write_properties()
        if self.is_formatted:
            return
        self._wipe_data()  # a half-formatted folder from an interrupted run
        cluster_id = self._run_tool("random-uuid").strip()
        if not _CLUSTER_ID.match(cluster_id):
            raise BrokerError(
                f"broker {self.name}: StorageTool random-uuid printed {cluster_id!r}, "
                "not a cluster id"
            )
        (self.work_dir / "cluster.id").write_text(cluster_id + "\n")
        scram = [
            arg for user in self.scram_users for arg in ("--add-scram", user.storage_argument())
        ]
        self._run_tool(
            "format", "--standalone", "-t", cluster_id, "-c", str(self.config_path), *scram
        )

    def start(self) -> None:
        """Spawn the broker JVM (formatting first if needed); returns without waiting."""
        if self.is_running:
            raise BrokerError(f"broker {self.name} is already running (pid {self.pid})")
        self.format()
        self._write_properties()
        argv = self.distribution.java_command(
            "kafka.Kafka",
            [str(self.config_path)],
            jvm_options=[f"-Xmx{self.heap}", "-Xms128m", *self.jvm_options],
        )
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            log.write(f"=== kdsync: starting {self.name} at {stamp}: {argv} ===\n".encode())
            log.flush()
            self._process = spawn_tied_to_parent(argv, log_file=log, cwd=self.work_dir)
        identity = ProcessIdentity.of(self._process.pid)
        self._identity = identity or ProcessIdentity(self._process.pid, 0)
        if self._pid_registry is not None:
            self._pid_registry.register(self.name, self._identity)

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Block until the broker commits a transactional produce, or raise.

        Raises :class:`BrokerStartupError` (with the first errors and the tail of the log)
        if the JVM exits or the deadline passes first; in the latter case the JVM is left
        running for the caller to inspect or :meth:`stop`.
        """
        if self._process is None:
            raise BrokerError(f"broker {self.name} was never started")
        deadline = time.monotonic() + timeout
        try:
            wait_until_transactional_produce(
                self.bootstrap_servers,
                transactional_id=f"kdsync-localkafka-probe-{self.name}",
                deadline=deadline,
                alive=lambda: self.is_running,
            )
        except ProbeTargetDied as error:
            code = self._process.returncode
            self._forget_process()
            raise self._startup_error(f"exited with code {code} during startup ({error})") from None
        except ProbeDeadlineExceeded as error:
            raise self._startup_error(f"was not ready within {timeout:.0f}s ({error})") from None

    def send_signal(self, signum: int) -> None:
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.send_signal(signum)

    def wait_stopped(self, timeout: float) -> bool:
        """Wait for the JVM to exit; True if it did (or was not running)."""
        if self._process is None:
            return True
        try:
            self._process.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return False
        self._forget_process()
        return True

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful shutdown (SIGTERM); SIGKILL if it has not exited after ``timeout``."""
        self.send_signal(signal.SIGTERM)
        if not self.wait_stopped(timeout):
            self.kill()

    def kill(self) -> None:
        """SIGKILL, as in a crash: no controlled shutdown, no flush."""
        self.send_signal(signal.SIGKILL)
        # SIGKILL cannot be ignored; the wait only reaps the zombie.
        self.wait_stopped(timeout=60.0)

    def restart(self, timeout: float = 90.0) -> None:
        """Stop if running, start again with the same ports and data, wait until ready."""
        if self.is_running:
            self.stop()
        self.start()
        self.wait_ready(timeout)

    # -- internals ---------------------------------------------------------------------

    def _properties(self) -> dict[str, str]:
        return broker_properties(
            host=self.host,
            ports=self._ports,
            data_dir=self.data_dir,
            overrides=self.overrides,
            extra_listeners=self.extra_listeners,
            advertised=self.advertised,
        )

    def _write_properties(self) -> None:
        text = render_properties(
            self._properties(), header=f"Written by kdsync.localkafka for cluster {self.name}."
        )
        partial = self.config_path.with_suffix(".partial")
        partial.write_text(text)
        partial.replace(self.config_path)

    def _wipe_data(self) -> None:
        if self.data_dir.exists():
            for path in sorted(self.data_dir.rglob("*"), reverse=True):
                if path.is_dir() and not path.is_symlink():
                    path.rmdir()
                else:
                    path.unlink()
            self.data_dir.rmdir()

    def _run_tool(self, *args: str) -> str:
        argv = self.distribution.java_command(
            "kafka.tools.StorageTool", args, jvm_options=["-Xmx256m", *self.jvm_options]
        )
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                cwd=self.work_dir,
                timeout=_TOOL_TIMEOUT_SECONDS,
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            raise BrokerError(
                f"broker {self.name}: StorageTool {args[0]} did not finish in "
                f"{_TOOL_TIMEOUT_SECONDS:.0f}s"
            ) from error
        output = done.stdout.decode("utf-8", "replace")
        shown = " ".join(self._hide_passwords(args))
        with self.log_path.open("ab") as log:
            log.write(f"=== kdsync: StorageTool {shown} ===\n".encode())
            log.write(done.stdout + done.stderr)
        if done.returncode != 0:
            raise BrokerError(
                f"broker {self.name}: StorageTool {shown} failed with code "
                f"{done.returncode}:\n{done.stderr.decode('utf-8', 'replace')[-4000:]}"
            )
        return output

    def _hide_passwords(self, args: Sequence[str]) -> list[str]:
        """``args`` with SCRAM passwords masked, for the log and error messages."""
        shown = list(args)
        for user in self.scram_users:
            shown = [arg.replace(user.password, "***") for arg in shown]
        return shown

    def _forget_process(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        if self._pid_registry is not None:
            self._pid_registry.unregister(self.name)

    def _startup_error(self, what: str) -> BrokerStartupError:
        run_lines = _read_lines(self.log_path, self._log_offset)
        # The cause is usually the first ERROR; the tail is then shutdown noise.
        first_errors = [line for line in run_lines if _ERROR_LINE.match(line)][:3]
        causes = "".join(f"\n  {line[:500]}" for line in first_errors)
        tail = _tail(self.log_path, LOG_TAIL_LINES, self._log_offset)
        return BrokerStartupError(
            f"Kafka broker {self.name} ({self.bootstrap_servers}) {what}.\n"
            + (f"First errors in its log:{causes}\n" if causes else "")
            + f"Last {LOG_TAIL_LINES} lines of {self.log_path}:\n{tail}",
            port_in_use=any(_BIND_FAILURE.search(line) for line in run_lines),
        )
