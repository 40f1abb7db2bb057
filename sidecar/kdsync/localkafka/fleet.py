"""N independent single-node Kafka clusters on loopback, started together, always cleaned up.

Layout under ``run_root`` (one folder per fleet, so several sessions can share a root)::

    run_root/run-<owner pid>-<owner start ticks>-<random>/
        pids/<cluster>.json     registry of live broker JVMs (see kdsync.localkafka.process)
        <cluster>/              server.properties, data/, broker.log, cluster.id

The owner's pid and start time are in the folder name, so a later fleet can tell a
folder of a crashed session (owner gone: kill its brokers, delete it) from one in use.
"""

from __future__ import annotations

import atexit
import contextlib
import secrets
import shutil
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from kdsync.localkafka.broker import (
    DEFAULT_HEAP,
    DEFAULT_JVM_OPTIONS,
    BrokerError,
    BrokerStartupError,
    LocalKafkaBroker,
)
from kdsync.localkafka.config import BrokerPorts, PropertyValue, ScramUser, allocate_ports
from kdsync.localkafka.distribution import KafkaDistribution, cache_dir, find_distribution
from kdsync.localkafka.process import PidRegistry, ProcessIdentity, kill_orphans

RUN_DIR_PREFIX = "run-"
DEFAULT_START_TIMEOUT = 120.0
DEFAULT_STOP_TIMEOUT = 30.0


@dataclass(frozen=True)
class ClusterSpec:
    """One cluster of a fleet: its name and broker properties that differ from the default.

    ``extra_listeners`` (listener name -> security protocol, e.g. ``{"SSL": "SSL"}``) adds
    client listeners on ports of their own besides the PLAINTEXT one; configure them with
    ``listener.name.<name>.*`` overrides (see :func:`kdsync.localkafka.config.broker_properties`).
    """

    name: str
    overrides: Mapping[str, PropertyValue] = field(default_factory=dict)
    extra_listeners: Mapping[str, str] = field(default_factory=dict)
    # Extra listener -> host:port advertised to its clients instead of its own (a proxy).
    advertised: Mapping[str, str] = field(default_factory=dict)
    # SCRAM users added when the cluster is formatted (see kdsync.localkafka.sasl).
    scram_users: tuple[ScramUser, ...] = ()


class FleetStartupError(BrokerError):
    """One or more clusters of a fleet did not start; the message holds each one's log tail."""


def default_run_root() -> Path:
    return cache_dir() / "runs" / "kafka"


def _owner_of_run_dir(path: Path) -> ProcessIdentity | None:
    parts = path.name.split("-")
    if len(parts) != 4 or f"{parts[0]}-" != RUN_DIR_PREFIX:
        return None
    try:
        return ProcessIdentity(int(parts[1]), int(parts[2]))
    except ValueError:
        return None


def reap_stale_runs(run_root: Path) -> list[Path]:
    """Kill brokers of fleets whose owner process is gone; delete their folders.

    Folders whose owner still runs (another test session, a demo) are left alone.
    Returns the folders removed.
    """
    removed: list[Path] = []
    if not run_root.is_dir():
        return removed
    for run_dir in sorted(run_root.glob(f"{RUN_DIR_PREFIX}*")):
        owner = _owner_of_run_dir(run_dir)
        if owner is None or owner.is_alive():
            continue
        kill_orphans(PidRegistry(run_dir / "pids"))
        shutil.rmtree(run_dir, ignore_errors=True)
        removed.append(run_dir)
    return removed


def _specs(clusters: int | Sequence[str | ClusterSpec]) -> list[ClusterSpec]:
    if isinstance(clusters, int):
        if clusters < 1:
            raise ValueError("a fleet needs at least one cluster")
        return [ClusterSpec(f"kafka-{index}") for index in range(1, clusters + 1)]
    if isinstance(clusters, str):
        raise TypeError("pass a list of cluster names, not a single string")
    specs = [c if isinstance(c, ClusterSpec) else ClusterSpec(c) for c in clusters]
    if not specs:
        raise ValueError("a fleet needs at least one cluster")
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"cluster names must be unique: {names}")
    return specs


class LocalKafkaFleet:
    """Several independent one-node Kafka clusters, for tests and the local demo.

    Use as a context manager (or call :meth:`start` and :meth:`close`)::

        with LocalKafkaFleet(3) as fleet:
            for broker in fleet:
                print(broker.name, broker.bootstrap_servers)

    Brokers are stopped on exit, on exceptions and KeyboardInterrupt, at interpreter exit,
    and by the kernel if this process dies (see :mod:`kdsync.localkafka.process`). Call
    :meth:`start`, :meth:`LocalKafkaBroker.start` and :meth:`LocalKafkaBroker.restart`
    from a thread that lives as long as the brokers should (normally the main thread).
    """

    def __init__(
        self,
        clusters: int | Sequence[str | ClusterSpec] = 3,
        *,
        run_root: Path | None = None,
        distribution: KafkaDistribution | None = None,
        host: str = "127.0.0.1",
        heap: str = DEFAULT_HEAP,
        jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS,
        keep_run_dir: bool = False,
        start_attempts: int = 3,
    ) -> None:
        self.specs = _specs(clusters)
        # Resolved now so a missing download fails before anything is created.
        self.distribution = distribution if distribution is not None else find_distribution()
        self.run_root = run_root if run_root is not None else default_run_root()
        self.host = host
        self.heap = heap
        self.jvm_options = tuple(jvm_options)
        self.keep_run_dir = keep_run_dir
        self.start_attempts = max(1, start_attempts)
        self._brokers: dict[str, LocalKafkaBroker] = {}
        self._run_dir: Path | None = None
        self._state = "new"  # new -> started -> closed

    # -- access ------------------------------------------------------------------------

    @property
    def run_dir(self) -> Path:
        if self._run_dir is None:
            raise BrokerError("the fleet has not been started")
        return self._run_dir

    @property
    def brokers(self) -> Mapping[str, LocalKafkaBroker]:
        return dict(self._brokers)

    @property
    def names(self) -> list[str]:
        return [spec.name for spec in self.specs]

    def __getitem__(self, name: str) -> LocalKafkaBroker:
        return self._brokers[name]

    def __iter__(self) -> Iterator[LocalKafkaBroker]:
        return iter(list(self._brokers.values()))

    def __len__(self) -> int:
        return len(self._brokers)

    def bootstrap_servers(self) -> dict[str, str]:
        return {name: broker.bootstrap_servers for name, broker in self._brokers.items()}

    def pids(self) -> dict[str, int]:
        """Pids of the broker JVMs running now."""
        return {
            name: pid for name, broker in self._brokers.items() if (pid := broker.pid) is not None
        }

    def process_identities(self) -> dict[str, ProcessIdentity]:
        """Pid and start time of each running JVM: lets a caller check they are gone later."""
        return {
            name: identity
            for name, broker in self._brokers.items()
            if (identity := broker.process_identity) is not None
        }

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> LocalKafkaFleet:
        if self._state == "new":
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def start(self, timeout: float = DEFAULT_START_TIMEOUT) -> LocalKafkaFleet:
        """Start every cluster in parallel and wait until each accepts transactions."""
        if self._state != "new":
            raise BrokerError(f"a fleet can be started once (it is {self._state})")
        self._state = "started"
        atexit.register(self.close)
        try:
            self._start(time.monotonic() + timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _start(self, deadline: float) -> None:
        self.run_root.mkdir(parents=True, exist_ok=True)
        reap_stale_runs(self.run_root)
        owner = ProcessIdentity.current()
        run_dir = self.run_root / (
            f"{RUN_DIR_PREFIX}{owner.pid}-{owner.start_ticks}-{secrets.token_hex(3)}"
        )
        run_dir.mkdir()
        self._run_dir = run_dir
        registry = PidRegistry(run_dir / "pids")
        ports = self._allocate(self.specs)
        for spec, spec_ports in zip(self.specs, ports, strict=True):
            self._brokers[spec.name] = LocalKafkaBroker(
                spec.name,
                distribution=self.distribution,
                work_dir=run_dir / spec.name,
                ports=spec_ports,
                host=self.host,
                overrides=spec.overrides,
                extra_listeners=spec.extra_listeners,
                advertised=spec.advertised,
                scram_users=spec.scram_users,
                heap=self.heap,
                jvm_options=self.jvm_options,
                pid_registry=registry,
            )

        pending = list(self._brokers.values())
        for attempt in range(1, self.start_attempts + 1):
            pool = ThreadPoolExecutor(max_workers=len(pending))
            try:
                # Formatting runs a JVM per cluster: in parallel. Spawning brokers stays on
                # this thread (their parent-death signal is tied to the spawning thread).
                list(pool.map(LocalKafkaBroker.format, pending))
                for broker in pending:
                    broker.start()
                outcomes = list(
                    pool.map(lambda b: _ready_or_error(b, deadline - time.monotonic()), pending)
                )
            finally:
                # No waiting here: on Ctrl-C, close() must kill the brokers first, which is
                # what makes the probing threads give up.
                pool.shutdown(wait=False, cancel_futures=True)
            failed = [(b, e) for b, e in zip(pending, outcomes, strict=True) if e is not None]
            if not failed:
                return
            retry = attempt < self.start_attempts and all(
                isinstance(error, BrokerStartupError) and error.port_in_use for _, error in failed
            )
            if not retry:
                message = "\n\n".join(str(error) for _, error in failed)
                raise FleetStartupError(message) from failed[0][1]
            # Someone took a port between our check and the broker's bind: new ports.
            pending = [broker for broker, _ in failed]
            wanted = [self._spec(broker.name) for broker in pending]
            for broker, new_ports in zip(pending, self._allocate(wanted), strict=True):
                broker.stop()
                broker.reassign_ports(new_ports)

    def _spec(self, name: str) -> ClusterSpec:
        return next(spec for spec in self.specs if spec.name == name)

    def _allocate(self, specs: Sequence[ClusterSpec]) -> list[BrokerPorts]:
        free = iter(allocate_ports(sum(2 + len(spec.extra_listeners) for spec in specs), self.host))
        return [
            BrokerPorts(
                next(free),
                next(free),
                tuple((listener, next(free)) for listener in spec.extra_listeners),
            )
            for spec in specs
        ]

    def close(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> None:
        """Stop every broker (SIGTERM, then SIGKILL after ``timeout``); idempotent."""
        if self._state == "closed":
            return
        self._state = "closed"
        atexit.unregister(self.close)
        brokers = list(self._brokers.values())
        try:
            for broker in brokers:
                broker.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for broker in brokers:
                if not broker.wait_stopped(deadline - time.monotonic()):
                    broker.kill()
        except BaseException:
            # Interrupted while waiting (a second Ctrl-C): do not leave anything behind.
            for broker in brokers:
                with contextlib.suppress(Exception):
                    broker.kill()
            raise
        finally:
            if self._run_dir is not None and not self.keep_run_dir:
                shutil.rmtree(self._run_dir, ignore_errors=True)

    def __repr__(self) -> str:
        return f"LocalKafkaFleet({self.names}, {self._state})"


def _ready_or_error(broker: LocalKafkaBroker, timeout: float) -> BrokerError | None:
    try:
        broker.wait_ready(max(0.0, timeout))
    except BrokerError as error:
        return error
    return None
