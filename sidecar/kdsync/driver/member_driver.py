"""Drives one member's ``OrderingNode``: everything between the core and its I/O.

Sans-I/O like the core: no asyncio, threads, sockets, clocks or Kafka. The sidecar
(``kdsync.runtime``) wires it to Kafka and TCP; the simulator (``kdsync.simulation``)
wires this very class to simulated ports, so every crash interleaving of its bookkeeping
is simulated, not a copy of it.

The rules it keeps (docs/ordering.md, "The driver"):

1. Readys are handled in order. A Ready's term, vote and entries are made durable
   (``LogPort.persist``) before its messages are sent — except messages that state
   nothing about what this member stored (``may_precede_persist``: a leader's Appends,
   pre-votes), which leave at once, so a slow disk never delays a heartbeat. One write
   is in flight at a time; Readys taken meanwhile are merged into the next write (group
   commit), and each write's messages and deliveries wait for it.
2. Deliveries queue as chunks (one per Ready, each with the ledger right after it).
   One transaction at a time writes a run of chunks with the last chunk's ledger, the
   next starting no sooner than ``transaction_interval_ticks`` after the last. Only
   when it has committed are the entries marked applied (``node.applied``) and the
   source positions committed: never ahead of what ``T-global`` holds.
3. A source batch the node refuses (its outbox is full) is held and offered again
   first, so sources are offered in order and none is skipped.
4. Reading entries back for lagging peers runs one request at a time.

Time is counted in ticks (the shell calls ``tick`` every ``tick_ms``), so retry delays
are deterministic under simulation.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from kdsync.driver.ports import DriverPorts, WriteFailure
from kdsync.ordering import (
    Configuration,
    Delivery,
    Entry,
    HardState,
    LedgerState,
    NodeEvent,
    OrderingNode,
    OriginBatch,
    Ready,
    may_precede_persist,
)
from kdsync.ordering.messages import Outbound
from kdsync.wire_format.envelope import WireFormatError
from kdsync.wire_format.messages import decode_message, encode_message

# Frames a shell hands the driver back to back before ticks and timers get a turn: a
# burst of frames must not starve the heartbeat (the simulator models the same turns).
FRAMES_PER_TURN = 16


@dataclass(frozen=True, slots=True)
class DriverLimits:
    """How the driver paces its I/O, in events and ticks."""

    max_events_per_transaction: int = 50_000
    halt_retry_ticks: int = 40  # a halted transaction is retried this often
    retry_ticks: tuple[int, int] = (4, 100)  # backoff after a failed transaction, min..max
    trim_ticks: int = 600  # how often the durable log is trimmed
    trim_margin: int = 4096  # entries kept below what every member stored and we applied
    # Ticks from one transaction's start to the next one's at the least (0: back to back).
    transaction_interval_ticks: int = 0


@dataclass
class DriverState:
    """What the member reports (``/status``, metrics); updated by the driver only."""

    halted: str | None = None
    fatal: str | None = None
    last_delivery_error: str | None = None
    events_in: int = 0
    events_out: int = 0
    transactions: int = 0
    durable_applied: int = 0  # the last log index whose deliveries are in T-global
    delivered_seq: dict[str, int] = field(default_factory=dict)


class DriverObserver:
    """Hooks for metrics and logs; the default does nothing (the simulator's choice)."""

    def offered(self, batch: OriginBatch) -> None:
        pass

    def node_events(self, events: list[NodeEvent]) -> None:
        pass

    def delivered(self, deliveries: Sequence[Delivery], ledger: LedgerState) -> None:
        pass

    def transaction_failed(self, failure: WriteFailure, reason: str) -> None:
        pass

    def halted(self, reason: str) -> None:
        pass

    def resumed(self) -> None:
        pass

    def undecodable_frame(self, peer: str, error: WireFormatError) -> None:
        pass

    def load_failed(self, reason: str) -> None:
        pass


@dataclass(slots=True)
class _Chunk:
    """The deliveries of one ``Ready`` and the ledger right after them."""

    deliveries: list[Delivery]
    ledger: LedgerState
    events: int


@dataclass(slots=True)
class _Write:
    """One write to the durable log (merged from one or more Readys) and what waits
    for it: the messages that depend on it and the deliveries after it."""

    hard_state: HardState | None = None
    truncate_from: int | None = None
    entries: list[Entry] = field(default_factory=list)
    number: int = 0  # the last Ready merged in (for node.persisted)
    messages: list[Outbound] = field(default_factory=list)
    chunks: list[_Chunk] = field(default_factory=list)

    @property
    def durable(self) -> bool:
        return self.hard_state is not None or self.truncate_from is not None

    def merge(self, ready: Ready) -> None:
        self.number = max(self.number, ready.number)
        if ready.hard_state is not None:
            self.hard_state = ready.hard_state
        start = ready.persist_from
        if start is None:
            return
        if self.truncate_from is None:
            self.truncate_from, self.entries = start, list(ready.entries)
        else:
            # A later Ready rewrites the log from `start`: what we hold from there goes.
            self.entries = [e for e in self.entries if e.index < start] + ready.entries
            self.truncate_from = min(self.truncate_from, start)


class MemberDriver:
    def __init__(
        self,
        node: OrderingNode,
        ports: DriverPorts,
        limits: DriverLimits | None = None,
        observer: DriverObserver | None = None,
        recovered_ledger: LedgerState | None = None,
    ) -> None:
        self.node = node
        self.ports = ports
        self.limits = limits or DriverLimits()
        self.observer = observer or DriverObserver()
        self.state = DriverState()
        if recovered_ledger is not None:
            self.state.durable_applied = recovered_ledger.applied_index
            self.state.delivered_seq = {t: s - 1 for t, s in recovered_ledger.next_seq.items()}
        self.stopping = False  # no new transaction starts once set
        self._ticks = 0
        self._writing_log: _Write | None = None  # in flight
        self._next_write: _Write | None = None  # gathering Readys while one is in flight
        self._chunks: deque[_Chunk] = deque()
        self._writing: list[_Chunk] | None = None  # the transaction in flight
        self._retry_at = 0  # no transaction starts before this tick
        self._backoff = self.limits.retry_ticks[0]
        self._held: OriginBatch | None = None
        self._load_retry_at: int | None = None  # after a failed read-back
        self._next_trim = self.limits.trim_ticks
        self._followed: Configuration | None = None  # last told to the frames port
        self._heard: tuple[Configuration, ...] = ()  # recovery's, last told to it
        self._follow_configuration()

    # ------------------------------------------------------------------ inputs

    def tick(self) -> None:
        self._ticks += 1
        self.node.tick()
        self._maybe_trim()
        self._maybe_retry_load()
        self._pump()

    def receive_frame(self, peer: str, frame: bytes) -> None:
        try:
            message = decode_message(frame)
        except WireFormatError as exc:
            self.observer.undecodable_frame(peer, exc)
            return
        self.node.receive(peer, message)
        self._pump()

    def propose_configuration(self, proposed: Configuration) -> str | None:
        """Ask the node to append a membership change: None when appended, else why not
        (``OrderingNode.propose_configuration``)."""
        refused = self.node.propose_configuration(proposed)
        self._pump()
        return refused

    def sources_ready(self) -> None:
        """The source port has batches waiting."""
        self._pump()

    # ------------------------------------------------------------------ completions

    def log_persisted(self) -> None:
        write = self._writing_log
        assert write is not None, "log_persisted without a write in flight"
        self._writing_log = None
        if write.number:
            self.node.persisted(write.number)
        self._release(write)
        if self._next_write is not None:
            self._start_write(self._next_write)
            self._next_write = None
        self._pump()

    def log_persist_failed(self, reason: str) -> None:
        # The core's durable state is uncertain: stop; a restart recovers from Kafka.
        self.state.fatal = f"could not store the ordering log: {reason}"

    def entries_loaded(self, entries: list[Entry]) -> None:
        self.node.entries_loaded(entries)
        self._pump()

    def load_failed(self, reason: str) -> None:
        """A read-back failed: after a pause, the node asks again if it still needs it
        (applying entries past ``max_log_bytes`` waits on read-backs)."""
        self.observer.load_failed(reason)
        self._load_retry_at = self._ticks + self.limits.retry_ticks[0]

    def _maybe_retry_load(self) -> None:
        if self._load_retry_at is not None and self._ticks >= self._load_retry_at:
            self._load_retry_at = None
            self.entries_loaded([])

    def transaction_committed(self) -> None:
        taken = self._writing
        assert taken is not None, "transaction_committed without a transaction in flight"
        self._writing = None
        self._backoff = self.limits.retry_ticks[0]
        for _ in taken:
            self._chunks.popleft()
        deliveries = [d for chunk in taken for d in chunk.deliveries]
        ledger = taken[-1].ledger
        state = self.state
        if state.halted is not None:
            state.halted = None
            self.observer.resumed()
        state.last_delivery_error = None
        state.transactions += 1
        state.events_out += sum(chunk.events for chunk in taken)
        for topic, seq in ledger.next_seq.items():
            state.delivered_seq[topic] = seq - 1
        state.durable_applied = deliveries[-1].index
        self.observer.delivered(deliveries, ledger)
        self.node.applied(state.durable_applied)
        if self.ports.source is not None:
            self.ports.source.commit(ledger.positions_of(self.node.member))
        self._pump()

    def transaction_failed(self, failure: WriteFailure, reason: str) -> None:
        assert self._writing is not None, "transaction_failed without a transaction in flight"
        self._writing = None
        self.observer.transaction_failed(failure, reason)
        if failure in (WriteFailure.FENCED, WriteFailure.OUTCOME_UNKNOWN):
            self.state.fatal = reason
            return
        if failure in (WriteFailure.TOO_LARGE, WriteFailure.GLOBAL_TOPIC_LOST):
            if self.state.halted != reason:
                self.observer.halted(reason)
            self.state.halted = reason
            self._retry_at = max(self._retry_at, self._ticks + self.limits.halt_retry_ticks)
            return
        self.state.last_delivery_error = reason
        # max: a retry also keeps to the interval since the failed transaction started.
        self._retry_at = max(self._retry_at, self._ticks + self._backoff)
        self._backoff = min(self._backoff * 2, self.limits.retry_ticks[1])

    # ------------------------------------------------------------------ reporting

    @property
    def source_held(self) -> bool:
        """A source batch waits for room in the node's outbox."""
        return self._held is not None

    @property
    def transaction_in_flight(self) -> bool:
        return self._writing is not None

    @property
    def pending_events(self) -> int:
        """Delivered by the core but not yet committed to ``T-global``."""
        return sum(chunk.events for chunk in self._chunks)

    # ------------------------------------------------------------------ the pump

    def _pump(self) -> None:
        if self.state.fatal:
            return
        self._offer_sources()
        while True:
            ready = self.node.ready()
            if ready.is_empty():
                break
            self._follow_configuration()
            self._handle(ready)
        self._maybe_write()

    def _follow_configuration(self) -> None:
        node = self.node
        heard = node.heard_configurations
        if heard is not self._heard:
            self._heard = heard
            for shown in heard:  # adding links is idempotent: all of them, again
                self.ports.frames.reach_members(shown)
        config = node.config
        if config is not self._followed:
            self._followed = config
            self.ports.frames.follow_configuration(config, node.config_index)

    def _handle(self, ready: Ready) -> None:
        if ready.events:
            self.observer.node_events(ready.events)
        log = self.ports.log
        if ready.loads and log is not None:  # the core keeps one read-back out at a time
            log.load(ready.loads, self.node.timing.max_load_bytes)
        pending = self._next_write or self._writing_log
        durable = log is not None and (
            ready.hard_state is not None or ready.persist_from is not None
        )
        if not durable and pending is None:
            self._release_ready(ready)
            return
        # Something to write, or an earlier write still pending that this Ready's
        # acknowledgements and deliveries may depend on: they wait for it.
        if durable:
            if self._writing_log is None:
                write = _Write()
                self._wait_for(write, ready)
                self._start_write(write)
                return
            if self._next_write is None:
                self._next_write = _Write()
            pending = self._next_write
        assert pending is not None
        self._wait_for(pending, ready)

    def _wait_for(self, write: _Write, ready: Ready) -> None:
        write.merge(ready)
        free = ready.hard_state is None
        frames = self.ports.frames
        for out in ready.messages:
            if free and may_precede_persist(out.message):
                frames.send(out.to, encode_message(out.message))
            else:
                write.messages.append(out)
        if ready.deliveries:
            write.chunks.append(self._chunk(ready))

    def _start_write(self, write: _Write) -> None:
        log = self.ports.log
        assert log is not None
        self._writing_log = write
        log.persist(write.hard_state, write.entries, write.truncate_from)

    def _release(self, write: _Write) -> None:
        frames = self.ports.frames
        for out in write.messages:
            frames.send(out.to, encode_message(out.message))
        self._chunks.extend(write.chunks)

    def _release_ready(self, ready: Ready) -> None:
        frames = self.ports.frames
        for out in ready.messages:
            frames.send(out.to, encode_message(out.message))
        if ready.deliveries:
            self._chunks.append(self._chunk(ready))

    @staticmethod
    def _chunk(ready: Ready) -> _Chunk:
        assert ready.ledger is not None
        events = sum(len(d.events) for d in ready.deliveries)
        return _Chunk(ready.deliveries, ready.ledger, events)

    def _offer_sources(self) -> None:
        source = self.ports.source
        if source is None:
            return
        while True:
            batch = self._held if self._held is not None else source.take()
            if batch is None:
                return
            if not self.node.offer(batch):
                self._held = batch
                return
            self._held = None
            self.state.events_in += len(batch.events)
            self.observer.offered(batch)

    def _maybe_write(self) -> None:
        delivery = self.ports.delivery
        if (
            delivery is None
            or self._writing is not None
            or not self._chunks
            or self.stopping
            or self._ticks < self._retry_at
        ):
            return
        take: list[_Chunk] = []
        events = 0
        for chunk in self._chunks:
            if take and events + chunk.events > self.limits.max_events_per_transaction:
                break
            take.append(chunk)
            events += chunk.events
        self._writing = take
        self._retry_at = self._ticks + self.limits.transaction_interval_ticks
        delivery.write([d for chunk in take for d in chunk.deliveries], take[-1].ledger)

    def _maybe_trim(self) -> None:
        log = self.ports.log
        if log is None or self._ticks < self._next_trim:
            return
        self._next_trim = self._ticks + self.limits.trim_ticks
        below = min(self.node.all_durable, self.state.durable_applied) - self.limits.trim_margin
        if below > 1:
            log.trim(below)
