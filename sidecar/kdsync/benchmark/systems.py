"""The systems under test, on clusters that are already running.

Each system knows its origins (where the load generator writes), its destinations (what
the probe reads in each cluster, and which events there are local copies rather than
deliveries) and its processes (whose CPU and memory are measured):

- :class:`KdsyncSystem`: a kdsync group, one sidecar process per cluster
  (:class:`kdsync.local_group.LocalSidecarGroup`); destinations are the ``T-global`` topics.
- :class:`MirrorMakerSystem`: MirrorMaker 2 in dedicated mode (one JVM) replicating every
  cluster to every other one, active/active, with or without exactly-once; destinations
  are the prefixed remote topics ``<source alias>.T`` in each cluster.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kdsync.benchmark.load import Origin
from kdsync.benchmark.probe import Destination
from kdsync.local_group import LocalSidecarGroup
from kdsync.localkafka.distribution import KAFKA_VERSION, KafkaDistribution, cache_dir, find_java
from kdsync.localkafka.process import spawn_tied_to_parent

# What hack/fetch-mirrormaker provides.
MIRRORMAKER_LIBS_ENV = "KDSYNC_MIRRORMAKER_LIBS"
MIRRORMAKER_MAIN = "org.apache.kafka.connect.mirror.MirrorMaker"
# The JVM settings of Kafka's own bin/connect-mirror-maker.sh and kafka-run-class.sh.
MIRRORMAKER_JVM_OPTIONS = (
    "-Xms256M",
    "-Xmx2G",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
)


class MirrorMakerNotProvisioned(RuntimeError):
    """The MirrorMaker 2 jars are not on this machine."""


class ReplicationSystem(Protocol):
    label: str  # kdsync, MM2-EOS, MM2
    members: int

    def start(self, timeout: float) -> None: ...
    def origins(self) -> list[Origin]: ...
    def destinations(self) -> list[Destination]: ...
    def processes(self) -> dict[str, int]: ...
    def settings(self) -> dict[str, Any]: ...
    def stop(self) -> None: ...


def _admin(bootstrap: str) -> AdminClient:
    # Warnings and errors only: librdkafka's informational lines would clutter the output.
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = _admin(bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(60)


def list_topics(bootstrap: str) -> set[str]:
    admin = _admin(bootstrap)
    return set(admin.list_topics(timeout=30).topics)


def delete_topics(bootstrap: str, topics: Sequence[str]) -> None:
    if not topics:
        return
    admin = _admin(bootstrap)
    for future in admin.delete_topics(list(topics), operation_timeout=60).values():
        future.result(90)


class KdsyncSystem:
    """A kdsync group over the given clusters: one sidecar each, exactly-once as always."""

    label = "kdsync"

    def __init__(
        self,
        clusters: Mapping[str, str],
        run_dir: Path,
        topic: str,
        partitions: int,
        ordering: Mapping[str, Any] | None = None,
        group_class: type[LocalSidecarGroup] = LocalSidecarGroup,
        label: str = "kdsync",
    ) -> None:
        self.label = label  # a variant's own name (runner.variant_label)
        self.clusters = dict(clusters)
        self.members = len(self.clusters)
        self.run_dir = run_dir
        self.topic = topic
        self.partitions = partitions
        self.ordering = dict(ordering) if ordering else None
        self.group_class = group_class
        self.group_name = f"bench-{secrets.token_hex(4)}"
        self.group: LocalSidecarGroup | None = None

    def start(self, timeout: float) -> None:
        for bootstrap in self.clusters.values():
            create_topic(bootstrap, self.topic, self.partitions)
        self.group = self.group_class(
            self.group_name,
            self.clusters,
            self.run_dir,
            topics={"names": [self.topic]},
            ordering=self.ordering,
        )
        self.group.start()
        # Not /readyz: in a group of 4 or more an idle follower hears only from the leader,
        # so its view stays below a majority and it never reports ready (a known gap, see
        # docs/performance.md). A leader every member agrees on is enough here; the
        # warm-up phase then proves that every flow delivers.
        deadline = time.monotonic() + timeout
        while True:
            statuses = self.group.wait_until(
                "a leader",
                lambda s: s.get("phase") == "running" and s.get("leader") is not None,
                max(1.0, deadline - time.monotonic()),
            )
            leaders = {str(s.get("leader")) for s in statuses.values()}
            if len(leaders) == 1:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"kdsync members disagree on the leader: {sorted(leaders)}")
            time.sleep(0.2)  # polling a condition with a deadline
        leader = leaders.pop()
        self.group.wait_ready(timeout, names=[leader])

    def origins(self) -> list[Origin]:
        return [Origin(i, b, self.topic) for i, b in enumerate(self.clusters.values())]

    def destinations(self) -> list[Destination]:
        return [
            Destination(name, bootstrap, (f"{self.topic}-global",), local_origin=i)
            for i, (name, bootstrap) in enumerate(self.clusters.items())
        ]

    def processes(self) -> dict[str, int]:
        if self.group is None:
            return {}
        return {
            f"sidecar {name}": member.process.pid
            for name, member in self.group.members.items()
            if member.process is not None and member.running
        }

    def settings(self) -> dict[str, Any]:
        return {
            "group": self.group_name,
            "members": list(self.clusters),
            "ordering": self.ordering or "LocalSidecarGroup default",
            "sourcePartitions": self.partitions,
            "globalPartitions": 1,
        }

    def stop(self) -> None:
        if self.group is not None:
            self.group.close()


def find_mirrormaker(environ: Mapping[str, str] | None = None) -> KafkaDistribution:
    """The MirrorMaker classpath from hack/fetch-mirrormaker, or a clear error."""
    env = os.environ if environ is None else environ
    configured = env.get(MIRRORMAKER_LIBS_ENV)
    libs = (
        Path(configured) if configured else cache_dir(env) / "mirrormaker" / KAFKA_VERSION / "libs"
    )
    if not (libs / f"connect-mirror-{KAFKA_VERSION}.jar").is_file():
        raise MirrorMakerNotProvisioned(
            f"MirrorMaker {KAFKA_VERSION} jars not found in {libs}; run hack/fetch-mirrormaker "
            "(it downloads connect-mirror from Maven Central)"
        )
    log4j = libs.parent / "log4j2.xml"
    return KafkaDistribution(libs, find_java(env), log4j if log4j.is_file() else None)


def mirrormaker_properties(
    aliases: Mapping[str, str], topic: str, exactly_once: bool, tasks_max: int
) -> str:
    """mm2.properties for active/active replication of ``topic`` between every pair.

    ``aliases``: alias -> bootstrap servers. Everything else is MirrorMaker's default, except
    replication factor 1 (single-broker clusters).
    """
    lines = [
        "# Written by kdsync's hack/bench-replication: MirrorMaker 2, dedicated mode,",
        "# every cluster replicated to every other one.",
        f"clusters = {', '.join(aliases)}",
        f"topics = {topic}",
        f"tasks.max = {tasks_max}",
        "replication.factor = 1",
        "checkpoints.topic.replication.factor = 1",
        "heartbeats.topic.replication.factor = 1",
        "offset-syncs.topic.replication.factor = 1",
        "offset.storage.replication.factor = 1",
        "status.storage.replication.factor = 1",
        "config.storage.replication.factor = 1",
        "sync.topic.acls.enabled = false",
    ]
    for alias, bootstrap in aliases.items():
        lines.append(f"{alias}.bootstrap.servers = {bootstrap}")
        if exactly_once:
            lines.append(f"{alias}.exactly.once.source.support = enabled")
    for source in aliases:
        for target in aliases:
            if source != target:
                lines.append(f"{source}->{target}.enabled = true")
    return "\n".join(lines) + "\n"


class MirrorMakerSystem:
    """MirrorMaker 2 (one dedicated-mode JVM) replicating the clusters active/active."""

    def __init__(
        self,
        clusters: Mapping[str, str],
        run_dir: Path,
        topic: str,
        partitions: int,
        *,
        exactly_once: bool,
        tasks_max: int = 1,
        distribution: KafkaDistribution | None = None,
    ) -> None:
        self.clusters = dict(clusters)
        self.members = len(self.clusters)
        self.run_dir = run_dir
        self.topic = topic
        self.partitions = partitions
        self.exactly_once = exactly_once
        self.tasks_max = tasks_max
        self.label = "MM2-EOS" if exactly_once else "MM2"
        self.distribution = distribution if distribution is not None else find_mirrormaker()
        # Aliases unique to this run, so that its internal topics, worker groups and
        # transactional ids are never those of an earlier MirrorMaker run on these brokers.
        tag = secrets.token_hex(2)
        self.aliases = {f"{name}x{tag}": name for name in self.clusters}
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.run_dir / "mirrormaker.log"

    def start(self, timeout: float) -> None:
        for bootstrap in self.clusters.values():
            create_topic(bootstrap, self.topic, self.partitions)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = self.run_dir / "mm2.properties"
        config.write_text(
            mirrormaker_properties(
                {a: self.clusters[c] for a, c in self.aliases.items()},
                self.topic,
                self.exactly_once,
                self.tasks_max,
            )
        )
        argv = self.distribution.java_command(
            MIRRORMAKER_MAIN, [str(config)], jvm_options=MIRRORMAKER_JVM_OPTIONS
        )
        self._log = self.log_path.open("ab")
        self.process = spawn_tied_to_parent(argv, log_file=self._log, cwd=self.run_dir)
        self._wait_for_remote_topics(timeout)

    def _remote_topics(self, cluster: str) -> list[str]:
        return [f"{alias}.{self.topic}" for alias, c in self.aliases.items() if c != cluster]

    def _wait_for_remote_topics(self, timeout: float) -> None:
        """MirrorMaker creates ``<alias>.T`` in each target once its flows are running."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"MirrorMaker exited during startup; see {self.log_path}")
            missing = [
                topic
                for cluster, bootstrap in self.clusters.items()
                for topic in self._remote_topics(cluster)
                if topic not in list_topics(bootstrap)
            ]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"MirrorMaker did not create {missing} within {timeout:.0f}s; "
                    f"see {self.log_path}"
                )
            time.sleep(0.5)  # polling a condition with a deadline

    def origins(self) -> list[Origin]:
        return [Origin(i, b, self.topic) for i, b in enumerate(self.clusters.values())]

    def destinations(self) -> list[Destination]:
        return [
            Destination(name, bootstrap, tuple(self._remote_topics(name)), local_origin=i)
            for i, (name, bootstrap) in enumerate(self.clusters.items())
        ]

    def processes(self) -> dict[str, int]:
        if self.process is None or self.process.poll() is not None:
            return {}
        return {"mirrormaker": self.process.pid}

    def settings(self) -> dict[str, Any]:
        return {
            "mode": "dedicated (connect-mirror MirrorMaker main class)",
            "exactlyOnceSourceSupport": "enabled" if self.exactly_once else "default (off)",
            "tasksMax": self.tasks_max,
            "aliases": self.aliases,
            "jvm": list(MIRRORMAKER_JVM_OPTIONS),
            "sourcePartitions": self.partitions,
        }

    def stop(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
        if self._log is not None:
            self._log.close()
            self._log = None
