"""One sidecar: the asyncio wiring around a ``MemberDriver``.

Everything that decides anything lives in the driver (``kdsync.driver``) and the core,
and runs the same way under simulation. This module only opens the member's Kafka
cluster and the peer transport, feeds the driver ticks, frames and source batches on the
event loop thread, runs blocking Kafka calls in worker threads (``kafka_ports``), and
reports through metrics and ``/status``.

The event loop must stay responsive under any load (a late heartbeat costs an
election), so no step on it runs long: frames are handled a bounded number at a time
and the loop's own lag is measured (``kdsync_event_loop_lag_seconds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from typing import Any

from kdsync import naming
from kdsync.config import SidecarConfig
from kdsync.driver import FRAMES_PER_TURN, DriverLimits, DriverPorts, MemberDriver
from kdsync.driver.peer_links import PeerLinks
from kdsync.driver.report import delivery_section, member_lag, node_section, readiness
from kdsync.failover.group_sync import GroupOffsetSync
from kdsync.kafka.errors import KafkaShellError
from kdsync.kafka.global_topic_check import GlobalTopicConfigCheck
from kdsync.kafka.heartbeats import (
    INTERVAL_SECONDS,
    RETENTION_MS,
    HeartbeatEmitter,
    ensure_heartbeat_topics,
)
from kdsync.kafka.member_cluster import MemberCluster, MemberClusterSettings, open_member_cluster
from kdsync.ordering import OrderingNode, Role
from kdsync.runtime.kafka_ports import KafkaDeliveryPort, KafkaLogPort, KafkaSourcePort
from kdsync.runtime.latency_window import LatencyWindow
from kdsync.runtime.metrics import GroupSyncMetrics, SidecarMetrics, TopicConfigMetrics
from kdsync.runtime.mirror_metrics import MirrorMetrics
from kdsync.runtime.observer import SidecarObserver
from kdsync.transport import LinkStatus, PeerTransport, TransportClosed
from kdsync.transport.rdma import RdmaTransport, RdmaUnavailable
from kdsync.transport.tcp import TcpTransport

log = logging.getLogger(__name__)

# How long a stopping sidecar lets an open transaction finish (its deliveries then count).
STOP_GRACE_SECONDS = 30.0
# How often the durable log is trimmed of entries no member needs any more.
TRIM_SECONDS = 30.0
# How often the event loop's lag is sampled.
LAG_SAMPLE_SECONDS = 0.1
# How often this member's T-global configs are checked against the rule (and at start).
TOPIC_CONFIG_CHECK_SECONDS = 30.0


class Sidecar:
    def __init__(self, config: SidecarConfig) -> None:
        self.config = config
        self.member = config.member
        self.is_witness = config.is_witness
        self.metrics = SidecarMetrics()
        self.latency = LatencyWindow()
        self.heartbeat_topic = naming.heartbeat_topic(config.group)
        self.mirror = MirrorMetrics(self.metrics.registry, config.member, self.heartbeat_topic)
        self._heartbeats: HeartbeatEmitter | None = None
        self._observer = SidecarObserver(self.metrics, self.latency, self.mirror, config.member)
        self.phase = "starting"  # starting, recovering, running, stopping, stopped, failed
        self.started_at = time.time()
        self.startup_error: str | None = None
        self.driver: MemberDriver | None = None
        self.transport: PeerTransport | None = None
        self.peer_links: PeerLinks | None = None  # the driver's port over the transport
        self._cluster: MemberCluster | None = None
        self._stopping = asyncio.Event()
        self._sources_signalled = False
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._group_sync: GroupOffsetSync | None = None
        self._topic_config: GlobalTopicConfigCheck | None = None
        self.max_loop_lag = 0.0
        self.metrics.info.labels(config.group, self.member, str(self.is_witness).lower()).set(1)
        self.metrics.group_members.set(len(config.members))

    # ------------------------------------------------------------------ lifecycle

    def request_stop(self) -> None:
        self._stopping.set()

    @property
    def fatal(self) -> str | None:
        if self.startup_error:
            return self.startup_error
        return self.driver.state.fatal if self.driver is not None else None

    async def run(self) -> int:
        """Run until ``request_stop`` or a fatal error; returns the process exit code."""
        self._event_loop = asyncio.get_running_loop()
        config = self.config
        recovered = None
        rdma = config.rdma_settings()
        if rdma is None:
            self.transport = TcpTransport(config.transport_config(), registry=self.metrics.registry)
        else:
            self.transport = RdmaTransport(
                config.transport_config(), rdma, registry=self.metrics.registry
            )
            try:  # before anything else is set up: a member without RDMA stops here
                self.transport.open_device()
            except RdmaUnavailable as exc:
                self.phase = "failed"
                self.startup_error = (
                    f"transport.type is rdma, but {exc} (or set transport.rdma.fallbackToTcp: "
                    "true to run on TCP where RDMA is missing)"
                )
                log.error("%s", self.startup_error)
                return 2
        if not self.is_witness:
            self.phase = "recovering"
            try:
                self._cluster = await asyncio.to_thread(
                    open_member_cluster, self._cluster_settings(), self._batches_waiting
                )
            except KafkaShellError as exc:
                self.phase = "failed"
                self.startup_error = str(exc)
                log.error("%s", exc)
                return 2
            recovered = self._cluster.recovered
            try:
                await asyncio.to_thread(
                    ensure_heartbeat_topics,
                    self._cluster.topics,
                    self.heartbeat_topic,
                    config.topics.global_topic(self.heartbeat_topic),
                    config.topics.global_partitions,
                )
            except KafkaShellError as exc:
                self.phase = "failed"
                self.startup_error = str(exc)
                log.error("%s", exc)
                return 2
        node = OrderingNode(
            self.member,
            config.group_spec(),
            config.timing(),
            incarnation=random.SystemRandom().getrandbits(62),
            recovered=recovered,
        )
        if node.config_index and set(node.config.members) != {m.name for m in config.members}:
            # Expected after `kdsync members remove|add`: the ledger's configuration wins.
            log.warning(
                "the membership in force is %s (changed at log index %d, from this member's "
                "ledger); the startup file lists %s, which no longer applies",
                node.config.describe(),
                node.config_index,
                ", ".join(m.name for m in config.members),
            )
        transport = self.transport
        assert transport is not None
        log_port = delivery_port = None
        source_port = None
        if self._cluster is not None:
            log_port = KafkaLogPort(self._cluster.log_store, self.metrics)
            delivery_port = KafkaDeliveryPort(self._cluster.writer, self.metrics)
            source_port = KafkaSourcePort(self._cluster.reader)
        ticks_per_second = 1000 / config.ordering.tick_ms
        self.peer_links = PeerLinks(transport)
        driver = MemberDriver(
            node,
            DriverPorts(log_port, delivery_port, source_port, self.peer_links),
            DriverLimits(
                halt_retry_ticks=max(1, round(2.0 * ticks_per_second)),
                retry_ticks=(max(1, round(0.2 * ticks_per_second)), round(5 * ticks_per_second)),
                trim_ticks=max(1, round(TRIM_SECONDS * ticks_per_second)),
                trim_margin=4 * config.ordering.retained_applied,
                transaction_interval_ticks=math.ceil(
                    config.ordering.transaction_interval_ms / config.ordering.tick_ms
                ),
            ),
            self._observer,
            recovered.ledger if recovered is not None else None,
        )
        for port in (log_port, delivery_port):
            if port is not None:
                port.driver = driver
        self.driver = driver
        for topic, seq in driver.state.delivered_seq.items():
            if topic != self.heartbeat_topic:
                self.metrics.delivered_seq.labels(topic).set(seq)
        await transport.start()
        if self._cluster is not None:
            await asyncio.to_thread(self._cluster.reader.start)
        self.phase = "running"
        log.info(
            "member %s of group %s running (%s); peers %s",
            self.member,
            config.group,
            "witness" if self.is_witness else "data member",
            ", ".join(m.name for m in config.members if m.name != self.member),
        )
        tasks = [
            asyncio.create_task(self._receive_loop(driver, transport), name="receive"),
            asyncio.create_task(self._tick_loop(driver), name="tick"),
            asyncio.create_task(self._lag_loop(), name="loop-lag"),
        ]
        if self._cluster is not None:
            kafka = config.own_member.kafka
            assert kafka is not None
            self._heartbeats = HeartbeatEmitter(
                kafka.client_properties(), self.heartbeat_topic, self.member
            )
            tasks.append(asyncio.create_task(self._heartbeat_loop(), name="heartbeats"))
            tasks.append(asyncio.create_task(self._topic_config_loop(), name="topic-config"))
            if config.group_offset_sync.enabled:
                tasks.append(asyncio.create_task(self._group_sync_loop(), name="group-sync"))
        stop_wait = asyncio.create_task(self._stopping.wait())
        done, _ = await asyncio.wait([stop_wait, *tasks], return_when=asyncio.FIRST_COMPLETED)
        code = 0
        for task in done:
            if task is stop_wait or task.cancelled():
                continue
            failure = task.exception()
            if failure is not None:
                driver.state.fatal = driver.state.fatal or f"{task.get_name()} failed: {failure!r}"
                log.error("sidecar stopping: %s", driver.state.fatal, exc_info=failure)
        if driver.state.fatal:
            code = 1
            log.error("sidecar stopping: %s", driver.state.fatal)
        self.phase = "stopping"
        await self._let_transaction_finish(driver)
        for task in [*tasks, stop_wait]:
            task.cancel()
        await asyncio.gather(*tasks, stop_wait, return_exceptions=True)
        await self._close()
        self.phase = "stopped" if code == 0 else "failed"
        return code

    def _cluster_settings(self) -> MemberClusterSettings:
        config = self.config
        kafka = config.own_member.kafka
        assert kafka is not None, "a data member has a Kafka cluster"
        return MemberClusterSettings(
            kafka.client_properties(),
            config.group,
            config.member,
            config.topics.global_topic,
            config.topics.global_partitions,
            self._selects,
            config.ordering.max_batch_events,
            config.ordering.max_batch_bytes,
            config.ordering.source_linger_ms,
        )

    def _selects(self, topic: str) -> bool:
        """The configured source topics, and this group's heartbeat topic."""
        return topic == self.heartbeat_topic or self.config.topics.selects(topic)

    async def _heartbeat_loop(self) -> None:
        """One heartbeat a second, and the per-partition record lag of this origin."""
        while True:
            if self._heartbeats is not None:
                self._heartbeats.beat()
            if self._cluster is not None:
                marks = self._observer.own_marks
                for (topic, partition), end in self._cluster.reader.end_offsets().items():
                    self.mirror.lag(topic, partition, end - marks.get((topic, partition), 0))
            await asyncio.sleep(INTERVAL_SECONDS)

    async def _group_sync_loop(self) -> None:
        """Group offset sync rounds in a worker thread (they block on Kafka), one at a
        time; a round never raises (failures are counted and shown in /status)."""
        interval = self.config.group_offset_sync.interval_seconds
        observer = GroupSyncMetrics(self.metrics)
        sync: GroupOffsetSync | None = None
        while sync is None:
            try:
                sync = await asyncio.to_thread(GroupOffsetSync, self.config, observer)
            except Exception as exc:  # clients that cannot be made now may be later
                observer.failed("clients")
                log.warning("group offset sync cannot start yet: %s", exc)
                await asyncio.sleep(max(interval, 5.0))
        self._group_sync = sync
        while True:
            await asyncio.to_thread(sync.run_round)
            await asyncio.sleep(interval)

    async def _topic_config_loop(self) -> None:
        """Checks of this member's T-global configs in a worker thread (they block on
        Kafka), one at a time; a check never raises (failures are counted)."""
        kafka = self.config.own_member.kafka
        assert kafka is not None
        topics = self.config.topics
        check = await asyncio.to_thread(
            GlobalTopicConfigCheck,
            kafka.client_properties(),
            topics.global_suffix,
            self._selects,
            topics.global_partitions,
            TopicConfigMetrics(self.metrics),
            {topics.global_topic(self.heartbeat_topic): RETENTION_MS},
        )
        self._topic_config = check
        while True:
            await asyncio.to_thread(check.run_round)
            await asyncio.sleep(TOPIC_CONFIG_CHECK_SECONDS)

    async def _let_transaction_finish(self, driver: MemberDriver) -> None:
        driver.stopping = True
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while driver.transaction_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # polling a condition with a deadline

    async def _close(self) -> None:
        if self._group_sync is not None:
            await asyncio.to_thread(self._group_sync.close)  # waits for a round under way
        if self._heartbeats is not None:
            await asyncio.to_thread(self._heartbeats.close)
        if self._cluster is not None:
            await asyncio.to_thread(self._cluster.reader.stop)
        if self.transport is not None:
            await self.transport.close()
        if self._cluster is not None:
            await asyncio.to_thread(self._cluster.writer.close)
            await asyncio.to_thread(self._cluster.log_store.close)

    # ------------------------------------------------------------------ inputs

    def _batches_waiting(self) -> None:
        """Called from the reader thread: coalesced into one call on the loop."""
        loop = self._event_loop
        if loop is None or self._sources_signalled:
            return
        self._sources_signalled = True
        with contextlib.suppress(RuntimeError):  # the loop is closing
            loop.call_soon_threadsafe(self._offer_sources)

    def _offer_sources(self) -> None:
        self._sources_signalled = False
        if self.driver is not None:
            self.driver.sources_ready()
            self._stop_if_fatal()

    async def _receive_loop(self, driver: MemberDriver, transport: PeerTransport) -> None:
        handled = 0
        while True:
            try:
                frame = await transport.receive()
            except TransportClosed:
                return
            driver.receive_frame(frame.peer, frame.payload)
            self._stop_if_fatal()
            handled += 1
            if handled % FRAMES_PER_TURN == 0:
                await asyncio.sleep(0)  # let ticks and timers run between frames

    async def _tick_loop(self, driver: MemberDriver) -> None:
        period = self.config.ordering.tick_ms / 1000
        loop = asyncio.get_running_loop()
        next_tick = loop.time() + period
        while True:
            await asyncio.sleep(max(0.0, next_tick - loop.time()))
            next_tick = max(next_tick + period, loop.time())
            driver.tick()
            self._stop_if_fatal()
            self._refresh_gauges()

    async def _lag_loop(self) -> None:
        """Measures how late the loop wakes up: a long step on it shows here."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(LAG_SAMPLE_SECONDS)
            lag = max(0.0, loop.time() - started - LAG_SAMPLE_SECONDS)
            self.max_loop_lag = max(self.max_loop_lag, lag)
            self.metrics.loop_lag.observe(lag)

    def _stop_if_fatal(self) -> None:
        if self.driver is None:
            return
        state = self.driver.state
        if self._cluster is not None and self._cluster.reader.failure and not state.fatal:
            state.fatal = self._cluster.reader.failure
        if state.fatal:
            self._stopping.set()

    # ------------------------------------------------------------------ reporting

    def readiness(self) -> tuple[bool, list[str]]:
        if self.startup_error:
            return False, [self.startup_error]
        return readiness(self.phase, self.driver)

    def _refresh_gauges(self) -> None:
        driver = self.driver
        if driver is None:
            return
        node = driver.node
        status = node.status()
        m = self.metrics
        m.term.set(status.term)
        m.is_leader.set(1 if status.role == Role.LEADER else 0)
        view = node.view()
        m.view_size.set(len(view))
        for member in node.config.members:
            m.view_member.labels(member).set(1 if member in view else 0)
        m.commit_index.set(status.commit_index)
        m.applied_index.set(driver.state.durable_applied)
        m.log_memory.set(node.log_memory_bytes())
        config = node.config
        m.group_members.set(len(config.members))
        if self.peer_links is not None:
            # A member whose removal committed is gone for good: drop its series too.
            self.mirror.members_in_force(config.members)
            for name in self.peer_links.retire_departed(node):
                m.forget_member(name)
                self.mirror.forget_source(name)
        for member, entries in member_lag(driver).items():
            m.member_lag.labels(member).set(entries)
        if self.transport is not None:
            # A retired peer stays known to the transport, but its series are gone.
            linked = [
                peer
                for peer in self.transport.peer_states().values()
                if peer.outbound != LinkStatus.RETIRED
            ]
            for peer in linked:
                m.peer_connected.labels(peer.peer).set(
                    1 if peer.outbound == LinkStatus.CONNECTED else 0
                )
            m.peer_rejected.set(self.transport.rejected_connections)
            if isinstance(self.transport, RdmaTransport):
                rdma = self.transport
                for name in (peer.peer for peer in linked):
                    m.peer_rdma.labels(name, "out").set(1 if name in rdma.rdma_outbound else 0)
                    m.peer_rdma.labels(name, "in").set(1 if name in rdma.rdma_inbound else 0)
                m.transport_fallback.set(1 if rdma.fallback_reason is not None else 0)
        if self._cluster is not None:
            m.source_errors.set(self._cluster.reader.errors)
        m.ready.set(1 if self.readiness()[0] else 0)

    async def source_backlog(self) -> dict[str, int]:
        """Own source records not yet in this member's T-global, by partition: the
        brokers' current ends (read_committed), asked now, against the positions this
        member has delivered, read after them (so an empty answer means everything up to
        those ends is ordered). Raises KafkaException when the brokers do not answer."""
        cluster = self._cluster
        if cluster is None:
            raise LookupError("a witness reads no source topics")
        topics = cluster.topics

        def ask() -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
            found = topics.source_partitions(self.config.topics.selects)
            partitions = [(t, p) for t, count in found.items() for p in range(count)]
            return topics.earliest_offsets(partitions), topics.committed_ends(partitions)

        earliest, ends = await asyncio.to_thread(ask)
        marks = self._observer.own_marks  # after the ends: it only grows
        backlog: dict[str, int] = {}
        for where, end in sorted(ends.items()):
            done = max(marks.get(where, 0), earliest.get(where, 0))
            if end > done:
                backlog[f"{where[0]}[{where[1]}]"] = end - done
        return backlog

    def status_document(self) -> dict[str, Any]:
        """The JSON served at /status and printed by ``kdsync status``."""
        ready, reasons = self.readiness()
        doc: dict[str, Any] = {
            "group": self.config.group,
            "member": self.member,
            "witness": self.is_witness,
            # Where the others dial this member (from its own file): `kdsync members add`
            # records it in the group's configuration.
            "peer": self.config.own_member.peer,
            "phase": self.phase,
            "ready": ready,
            "notReadyReasons": reasons,
            "halted": None,
            "fatal": self.fatal,
            "lastDeliveryError": None,
            "uptimeSeconds": round(time.time() - self.started_at, 1),
            "latencyMs": {
                "p50": self.latency.percentile(0.50),
                "p99": self.latency.percentile(0.99),
                "samples": self.latency.count,
            },
            "maxEventLoopLagSeconds": round(self.max_loop_lag, 3),
        }
        doc.update(delivery_section(self.driver))
        # Heartbeats travel like events; the counts here are the user's events only.
        observer = self._observer
        doc["eventsIn"] = doc.get("eventsIn", 0) - observer.heartbeats_in
        doc["eventsOut"] = doc.get("eventsOut", 0) - observer.heartbeats_out
        doc["heartbeatsOut"] = observer.heartbeats_out
        doc.get("deliveredSeq", {}).pop(self.heartbeat_topic, None)
        if self.driver is not None:
            doc.update(node_section(self.driver))
        if self._cluster is not None:
            doc["sourceReadErrors"] = self._cluster.reader.errors
            doc["lastSourceError"] = self._cluster.reader.last_error
            doc["sourceQueued"] = self._cluster.reader.batches.qsize()
            doc["sourceReadAgoSeconds"] = round(time.monotonic() - self._cluster.reader.read_at, 1)
            doc["stoppedSources"] = {
                f"{topic}[{partition}]": reason
                for (topic, partition), reason in sorted(self._cluster.reader.stopped.items())
            }
        if self._group_sync is not None:
            doc["groupOffsetSync"] = self._group_sync.status()
        if self._topic_config is not None:
            doc["globalTopicConfig"] = self._topic_config.status()
        if self.transport is not None:
            doc["peers"] = {
                p.peer: {"link": p.outbound.value, "lastError": p.last_error}
                for p in self.transport.peer_states().values()
            }
            doc["transport"] = _transport_section(self.transport)
        return doc


def _transport_section(transport: PeerTransport) -> dict[str, Any]:
    """How peer links move frames: TCP, or RDMA (per peer and direction, with the
    device, or why a member configured for RDMA fell back to TCP)."""
    if not isinstance(transport, RdmaTransport):
        return {"type": "tcp"}
    return {
        "type": "rdma",
        "device": transport.device_description,
        "fallbackReason": transport.fallback_reason,
        "rdmaTo": sorted(transport.rdma_outbound),
        "rdmaFrom": sorted(transport.rdma_inbound),
        "creditWaits": dict(transport.credit_waits),
    }
