"""One sidecar: drives an ``OrderingNode`` with real I/O, in the order the core requires.

For every ``Ready`` of the core, strictly in sequence: persist term/vote/entries to the
internal log topic (acknowledged by the cluster), then send the messages, then hand the
deliveries to the delivery task, which writes them to ``T-global`` in a Kafka transaction
together with the ledger and the source offsets, and only then tells the core they are
applied. A crash anywhere in between is what the deterministic simulator exercises.

Everything that touches the core runs on the event loop thread; blocking Kafka calls run
in worker threads (``asyncio.to_thread``) and never touch the core.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import random
import time
from collections import deque
from dataclasses import dataclass, field

from kdsync.config import SidecarConfig
from kdsync.kafka.errors import KafkaShellError, KafkaUnavailable, ProducerFenced, RecordTooLarge
from kdsync.kafka.global_writer import GlobalWriter
from kdsync.kafka.log_store import LogStore
from kdsync.kafka.source_reader import SourceReader
from kdsync.kafka.topics import ClusterTopics
from kdsync.ordering import (
    Delivery,
    LedgerState,
    OrderingNode,
    OriginBatch,
    Ready,
    RecoveredState,
    Role,
)
from kdsync.runtime.latency_window import LatencyWindow
from kdsync.runtime.metrics import SidecarMetrics
from kdsync.transport import LinkStatus, TransportClosed
from kdsync.transport.tcp import TcpTransport
from kdsync.wire_format import WireFormatError, decode_message, encode_message

log = logging.getLogger(__name__)

# A member is caught up (ready) when it has applied all but this many committed entries.
READY_LAG_ENTRIES = 256
# Retry delays for delivery while a destination refuses a record or is unreachable.
HALT_RETRY_SECONDS = 2.0
UNAVAILABLE_RETRY_SECONDS = (0.2, 5.0)
# How often the internal log topic is trimmed of entries no member needs any more.
TRIM_SECONDS = 30.0
# Upper bound of events in one T-global transaction (several Readys are grouped).
MAX_EVENTS_PER_TRANSACTION = 50_000


@dataclass
class _Chunk:
    """The deliveries of one ``Ready`` and the ledger right after them."""

    deliveries: list[Delivery]
    ledger: LedgerState

    @property
    def events(self) -> int:
        return sum(len(d.events) for d in self.deliveries)


@dataclass
class SidecarState:
    """What /readyz, /status and the metrics report (updated by the loop)."""

    started_at: float = field(default_factory=time.time)
    phase: str = "starting"  # starting, recovering, running, stopping, failed
    halted: str | None = None
    fatal: str | None = None
    last_delivery_error: str | None = None
    events_in: int = 0
    events_out: int = 0
    transactions: int = 0
    delivered_seq: dict[str, int] = field(default_factory=dict)


class Sidecar:
    def __init__(self, config: SidecarConfig) -> None:
        self.config = config
        self.member = config.member
        self.is_witness = config.is_witness
        self.metrics = SidecarMetrics()
        self.state = SidecarState()
        self.latency = LatencyWindow()
        self.node: OrderingNode | None = None
        self.transport: TcpTransport | None = None
        self._log_store: LogStore | None = None
        self._writer: GlobalWriter | None = None
        self._reader: SourceReader | None = None
        self._topics: ClusterTopics | None = None
        self._wake = asyncio.Event()
        self._deliver_wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._chunks: deque[_Chunk] = deque()
        self._held: OriginBatch | None = None
        self._loading = False
        self._global_partitions: dict[str, int] = {}
        self._durable_applied = 0
        self._load_task: asyncio.Task[None] | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self.metrics.info.labels(config.group, self.member, str(self.is_witness).lower()).set(1)
        self.metrics.group_members.set(len(config.members))

    # ------------------------------------------------------------------ lifecycle

    def request_stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._deliver_wake.set()

    async def run(self) -> int:
        """Run until ``request_stop`` or a fatal error; returns the process exit code."""
        self._event_loop = asyncio.get_running_loop()
        try:
            recovered = await self._recover()
        except KafkaShellError as exc:
            self.state.phase = "failed"
            self.state.fatal = str(exc)
            log.error("%s", exc)
            await self._close()
            return 2
        config = self.config
        self.node = OrderingNode(
            self.member,
            config.group_spec(),
            config.timing(),
            incarnation=random.SystemRandom().getrandbits(62),
            recovered=recovered,
        )
        self.transport = TcpTransport(config.transport_config())
        await self.transport.start()
        if self._reader is not None:
            await asyncio.to_thread(self._reader.start)
        self.state.phase = "running"
        log.info(
            "member %s of group %s running (%s); peers %s",
            self.member,
            config.group,
            "witness" if self.is_witness else "data member",
            ", ".join(m.name for m in config.members if m.name != self.member),
        )
        tasks = [
            asyncio.create_task(self._receive_loop(), name="receive"),
            asyncio.create_task(self._tick_loop(), name="tick"),
            asyncio.create_task(self._drive_loop(), name="drive"),
        ]
        if not self.is_witness:
            tasks.append(asyncio.create_task(self._deliver_loop(), name="deliver"))
            tasks.append(asyncio.create_task(self._trim_loop(), name="trim"))
        stop_wait = asyncio.create_task(self._stopping.wait())
        done, _ = await asyncio.wait([stop_wait, *tasks], return_when=asyncio.FIRST_COMPLETED)
        code = 0
        for task in done:
            if task is stop_wait or task.cancelled():
                continue
            failure = task.exception()
            if failure is not None:
                self.state.fatal = self.state.fatal or f"{task.get_name()} failed: {failure!r}"
                log.error("sidecar stopping: %s", self.state.fatal, exc_info=failure)
                code = 1
        if self.state.fatal and code == 0:
            code = 1
        self.state.phase = "stopping"
        self._stopping.set()
        self._deliver_wake.set()
        # Let an in-flight transaction finish (its deliveries then count as applied).
        deliver = next((t for t in tasks if t.get_name() == "deliver"), None)
        if deliver is not None and not deliver.done():
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(deliver), timeout=30)
        for task in [*tasks, stop_wait]:
            task.cancel()
        await asyncio.gather(*tasks, stop_wait, return_exceptions=True)
        await self._close()
        self.state.phase = "stopped" if code == 0 else "failed"
        return code

    async def _recover(self) -> RecoveredState | None:
        """Data members: create topics, fence older instances, read ledger and log back."""
        if self.is_witness:
            return None
        self.state.phase = "recovering"
        config = self.config
        kafka = config.own_member.kafka
        assert kafka is not None
        properties = kafka.client_properties()
        self._topics = ClusterTopics(properties)
        await asyncio.to_thread(self._topics.partitions)  # fail early if unreachable
        await asyncio.to_thread(self._topics.ensure_internal, config.group)
        self._writer = GlobalWriter(
            properties,
            config.group,
            self.member,
            config.topics.global_topic,
            self._global_partition_count,
        )
        ledger = await asyncio.to_thread(self._writer.start)
        self._durable_applied = ledger.applied_index
        # Our source positions are the marks of our own origin partitions in the ledger.
        positions = {
            (topic, partition): mark
            for (origin, topic, partition), mark in ledger.marks.items()
            if origin == self.member
        }
        self._reader = SourceReader(
            properties,
            config.group,
            self.member,
            self._topics,
            config.topics.selects,
            positions,
            config.ordering.max_batch_events,
            config.ordering.max_batch_bytes,
            self._batches_waiting,
        )
        self._log_store = LogStore(properties, config.group, self.member)
        recovered_log = await asyncio.to_thread(self._log_store.recover, ledger.applied_index)
        for topic, seq in ledger.next_seq.items():
            self.state.delivered_seq[topic] = seq - 1
            self.metrics.delivered_seq.labels(topic).set(seq - 1)
        log.info(
            "recovered: term %d, applied index %d, %d unapplied log entries, %d origin partitions",
            recovered_log.hard_state.term,
            ledger.applied_index,
            len(recovered_log.entries),
            len(ledger.marks),
        )
        return RecoveredState(recovered_log.hard_state, ledger, recovered_log.entries)

    def _global_partition_count(self, topic: str) -> int:
        """Partitions of ``topic``'s T-global, creating it on first use."""
        count = self._global_partitions.get(topic)
        if count is None:
            assert self._topics is not None
            name = self.config.topics.global_topic(topic)
            wanted = self.config.topics.global_partitions
            self._topics.ensure_global(name, wanted)
            existing = self._topics.global_partition_count(name) or wanted
            if existing != wanted:
                # Partitioning must be identical in every cluster: refuse to guess.
                raise KafkaUnavailable(
                    f"{name} has {existing} partition(s) but topics.globalPartitions is "
                    f"{wanted}. Fix: make them equal in every member cluster"
                )
            count = existing
            self._global_partitions[topic] = count
        return count

    async def _close(self) -> None:
        if self._reader is not None:
            await asyncio.to_thread(self._reader.stop)
        if self.transport is not None:
            await self.transport.close()
        if self._writer is not None:
            await asyncio.to_thread(self._writer.close)
        if self._log_store is not None:
            await asyncio.to_thread(self._log_store.close)

    # ------------------------------------------------------------------ inputs

    def _batches_waiting(self) -> None:
        """Called from the reader thread."""
        loop = self._event_loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop.call_soon_threadsafe(self._wake.set)

    async def _receive_loop(self) -> None:
        assert self.transport is not None and self.node is not None
        while True:
            try:
                frame = await self.transport.receive()
            except TransportClosed:
                return
            try:
                message = decode_message(frame.payload)
            except WireFormatError as exc:
                self.metrics.decode_errors.inc()
                log.warning("dropped an undecodable frame from %s: %s", frame.peer, exc)
                continue
            self.node.receive(frame.peer, message)
            self._wake.set()

    async def _tick_loop(self) -> None:
        assert self.node is not None
        period = self.config.ordering.tick_ms / 1000
        loop = asyncio.get_running_loop()
        next_tick = loop.time() + period
        while True:
            await asyncio.sleep(max(0.0, next_tick - loop.time()))
            next_tick = max(next_tick + period, loop.time())
            self.node.tick()
            self._wake.set()
            self._refresh_gauges()

    def _offer_sources(self) -> None:
        node, reader = self.node, self._reader
        if node is None or reader is None:
            return
        while True:
            batch = self._held
            if batch is None:
                try:
                    batch = reader.batches.get_nowait()
                except queue.Empty:
                    return
            if not node.offer(batch):
                self._held = batch
                return
            self._held = None
            self.metrics.events_in.labels(batch.topic).inc(len(batch.events))
            self.state.events_in += len(batch.events)

    # ------------------------------------------------------------------ outputs

    async def _drive_loop(self) -> None:
        node = self.node
        assert node is not None and self.transport is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._offer_sources()
            for _ in range(64):  # bounded: let ticks and receives interleave
                ready = node.ready()
                if ready.is_empty():
                    break
                await self._handle(ready)

    async def _handle(self, ready: Ready) -> None:
        assert self.transport is not None
        if self._log_store is not None and (
            ready.hard_state is not None or ready.persist_from is not None
        ):
            await asyncio.to_thread(
                self._log_store.persist, ready.hard_state, ready.entries, ready.persist_from
            )
        for out in ready.messages:
            self.transport.send(out.to, encode_message(out.message))
        if ready.loads and self._log_store is not None and not self._loading:
            self._loading = True
            self._load_task = asyncio.create_task(self._load(ready.loads))
        if ready.deliveries:
            assert ready.ledger is not None
            self._chunks.append(_Chunk(ready.deliveries, ready.ledger))
            self._deliver_wake.set()

    async def _load(self, spans: list[tuple[int, int]]) -> None:
        assert self._log_store is not None and self.node is not None
        try:
            for first, last in spans:
                entries = await asyncio.to_thread(self._log_store.load, first, last)
                self.node.entries_loaded(entries)
        except KafkaShellError as exc:
            log.warning("reading log entries back failed (retried later): %s", exc)
            self.node.entries_loaded([])
        finally:
            self._loading = False
            self._wake.set()

    async def _deliver_loop(self) -> None:
        writer, node = self._writer, self.node
        assert writer is not None and node is not None
        backoff = UNAVAILABLE_RETRY_SECONDS[0]
        while True:
            if not self._chunks:
                if self._stopping.is_set():
                    return
                await self._deliver_wake.wait()
                self._deliver_wake.clear()
                continue
            take: list[_Chunk] = []
            events = 0
            for chunk in self._chunks:
                if take and events + chunk.events > MAX_EVENTS_PER_TRANSACTION:
                    break
                take.append(chunk)
                events += chunk.events
            deliveries = [d for chunk in take for d in chunk.deliveries]
            try:
                result = await asyncio.to_thread(writer.write, deliveries, take[-1].ledger)
            except RecordTooLarge as exc:
                self._halt(str(exc))
                if await self._pause(HALT_RETRY_SECONDS):
                    return
                continue
            except ProducerFenced as exc:
                self.state.fatal = str(exc)
                raise
            except KafkaUnavailable as exc:
                self.state.last_delivery_error = str(exc)
                self.metrics.transactions.labels("failed").inc()
                log.warning("delivery failed, retrying in %.1fs: %s", backoff, exc)
                if await self._pause(backoff):
                    return
                backoff = min(backoff * 2, UNAVAILABLE_RETRY_SECONDS[1])
                continue
            backoff = UNAVAILABLE_RETRY_SECONDS[0]
            for _ in take:
                self._chunks.popleft()
            self._delivered(deliveries, take[-1].ledger, result.seconds)
            self._durable_applied = deliveries[-1].index
            node.applied(deliveries[-1].index)
            if self._reader is not None:
                own = take[-1].ledger.marks
                self._reader.commit(
                    {(t, p): mark for (o, t, p), mark in own.items() if o == self.member}
                )
            self._wake.set()

    async def _pause(self, seconds: float) -> bool:
        """Wait before a retry, but wake at once on stop; True when stopping."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)
        return self._stopping.is_set()

    def _halt(self, reason: str) -> None:
        if self.state.halted != reason:
            log.error("delivery halted: %s", reason)
            self.metrics.halted.clear()
            self.metrics.halted.labels("record_too_large").set(1)
        self.state.halted = reason
        self.metrics.transactions.labels("refused").inc()

    def _delivered(self, deliveries: list[Delivery], ledger: LedgerState, seconds: float) -> None:
        if self.state.halted is not None:
            log.info("delivery resumed")
            self.state.halted = None
            self.metrics.halted.clear()
        self.state.last_delivery_error = None
        self.metrics.commit_seconds.observe(seconds)
        self.metrics.transactions.labels("committed").inc()
        self.state.transactions += 1
        now_ms = time.time() * 1000
        counts: dict[str, int] = {}
        for delivery in deliveries:
            for delivered in delivery.events:
                counts[delivered.topic] = counts.get(delivered.topic, 0) + 1
                timestamp = delivered.event.timestamp_ms
                if timestamp > 0:
                    latency = max(0.0, now_ms - timestamp)
                    self.metrics.latency.observe(latency / 1000)
                    self.latency.add(latency)
        for topic, count in counts.items():
            self.metrics.events_out.labels(topic).inc(count)
            self.state.events_out += count
        for topic, seq in ledger.next_seq.items():
            self.state.delivered_seq[topic] = seq - 1
            self.metrics.delivered_seq.labels(topic).set(seq - 1)

    async def _trim_loop(self) -> None:
        node, store = self.node, self._log_store
        assert node is not None and store is not None
        margin = 4 * self.config.ordering.retained_applied
        while True:
            await asyncio.sleep(TRIM_SECONDS)
            applied = self.applied_index
            below = min(node.all_durable, applied) - margin
            if below > 1:
                await asyncio.to_thread(store.trim, below)

    # ------------------------------------------------------------------ reporting

    @property
    def applied_index(self) -> int:
        """The last log index whose deliveries are committed to T-global."""
        return self._durable_applied

    def readiness(self) -> tuple[bool, list[str]]:
        """Ready = in a majority view, following a leader, caught up and not halted."""
        node = self.node
        if node is None or self.state.phase != "running":
            return False, [f"phase {self.state.phase}"]
        reasons: list[str] = []
        status = node.status()
        view = node.view()
        quorum = node.group.quorum
        if status.role == Role.RECOVERING:
            reasons.append("witness still recovering its state from the other members")
        if len(view) < quorum:
            reasons.append(f"in a view of {len(view)} member(s), a majority is {quorum}")
        if status.leader is None:
            reasons.append("no leader known")
        if self.state.halted:
            reasons.append(f"delivery halted: {self.state.halted}")
        if node.ledger is not None:
            lag = node.known_commit - self.applied_index
            if lag > READY_LAG_ENTRIES:
                reasons.append(f"catching up: {lag} committed entries not yet applied")
        if self.state.fatal:
            reasons.append(self.state.fatal)
        return not reasons, reasons

    def _refresh_gauges(self) -> None:
        node = self.node
        if node is None:
            return
        status = node.status()
        m = self.metrics
        m.term.set(status.term)
        m.is_leader.set(1 if status.role == Role.LEADER else 0)
        view = node.view()
        m.view_size.set(len(view))
        for member in node.group.members:
            m.view_member.labels(member).set(1 if member in view else 0)
        m.commit_index.set(status.commit_index)
        m.applied_index.set(self.applied_index)
        lag = self.member_lag()
        for member, entries in lag.items():
            m.member_lag.labels(member).set(entries)
        if self.transport is not None:
            for peer in self.transport.peer_states().values():
                m.peer_connected.labels(peer.peer).set(
                    1 if peer.outbound == LinkStatus.CONNECTED else 0
                )
        m.ready.set(1 if self.readiness()[0] else 0)

    def member_lag(self) -> dict[str, int]:
        node = self.node
        if node is None:
            return {}
        status = node.status()
        lag: dict[str, int] = {}
        if status.role == Role.LEADER:
            for peer, match in node.peer_match().items():
                lag[peer] = max(0, status.last_index - match)
        if node.ledger is not None:
            lag[self.member] = max(0, node.known_commit - self.applied_index)
        else:
            lag[self.member] = max(0, node.known_commit - status.commit_index)
        return lag

    def status_document(self) -> dict[str, object]:
        """The JSON served at /status and printed by ``kdsync status``."""
        node = self.node
        ready, reasons = self.readiness()
        doc: dict[str, object] = {
            "group": self.config.group,
            "member": self.member,
            "witness": self.is_witness,
            "phase": self.state.phase,
            "ready": ready,
            "notReadyReasons": reasons,
            "halted": self.state.halted,
            "fatal": self.state.fatal,
            "lastDeliveryError": self.state.last_delivery_error,
            "uptimeSeconds": round(time.time() - self.state.started_at, 1),
            "eventsIn": self.state.events_in,
            "eventsOut": self.state.events_out,
            "transactions": self.state.transactions,
            "deliveredSeq": dict(self.state.delivered_seq),
            "latencyMs": {
                "p50": self.latency.percentile(0.50),
                "p99": self.latency.percentile(0.99),
                "samples": self.latency.count,
            },
        }
        if node is not None:
            status = node.status()
            doc.update(
                {
                    "role": status.role.value,
                    "term": status.term,
                    "leader": status.leader,
                    "view": sorted(node.view()),
                    "members": list(node.group.members),
                    "commitIndex": status.commit_index,
                    "knownCommit": node.known_commit,
                    "appliedIndex": self.applied_index,
                    "memberLag": self.member_lag(),
                }
            )
        if self.transport is not None:
            doc["peers"] = {
                p.peer: {"link": p.outbound.value, "lastError": p.last_error}
                for p in self.transport.peer_states().values()
            }
        return doc
