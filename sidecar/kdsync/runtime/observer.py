"""The sidecar's view of its driver: Prometheus metrics, replication latency and logs."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from kdsync.driver import DriverObserver, WriteFailure
from kdsync.ordering import Delivery, LedgerState, NodeEvent, OriginBatch
from kdsync.runtime.latency_window import LatencyWindow
from kdsync.runtime.metrics import SidecarMetrics
from kdsync.runtime.mirror_metrics import MirrorMetrics
from kdsync.wire_format.envelope import WireFormatError

log = logging.getLogger(__name__)

_FAILURE_OUTCOME = {
    WriteFailure.TOO_LARGE: "refused",
    WriteFailure.GLOBAL_TOPIC_LOST: "refused",
    WriteFailure.UNAVAILABLE: "failed",
    WriteFailure.FENCED: "fenced",
    WriteFailure.OUTCOME_UNKNOWN: "unknown",
}


class SidecarObserver(DriverObserver):
    def __init__(
        self,
        metrics: SidecarMetrics,
        latency: LatencyWindow,
        mirror: MirrorMetrics | None = None,
        member: str = "",
    ) -> None:
        self.metrics = metrics
        self.latency = latency
        self.mirror = mirror
        self.member = member
        # This member's own source positions that are in its T-global (for record lag).
        self.own_marks: dict[tuple[str, int], int] = {}
        # Heartbeat events among the driver's counts: /status reports user events only.
        self.heartbeats_in = 0
        self.heartbeats_out = 0
        self._last_failure: WriteFailure | None = None  # what a halt that follows is about

    def _is_heartbeat(self, topic: str) -> bool:
        return self.mirror is not None and topic == self.mirror.heartbeat_topic

    def offered(self, batch: OriginBatch) -> None:
        self.metrics.events_in.labels(batch.topic).inc(len(batch.events))
        if self._is_heartbeat(batch.topic):
            self.heartbeats_in += len(batch.events)
        if self.mirror is not None:
            now = time.time()
            ages = [now * 1000 - e.timestamp_ms for e in batch.events if e.timestamp_ms > 0]
            self.mirror.consumed(batch.topic, [max(0.0, a) for a in ages], now)

    def node_events(self, events: list[NodeEvent]) -> None:
        for event in events:
            # Elections are rare in a healthy group: each one is worth a line, with why.
            log.info("term %d: %s: %s", event.term, event.kind, event.detail)
            if event.kind in ("pre-vote", "campaign", "leader", "step-down"):
                self.metrics.elections.labels(event.kind).inc()
            elif event.kind == "vote-refused":
                self.metrics.votes_refused.inc()

    def delivered(self, deliveries: Sequence[Delivery], ledger: LedgerState) -> None:
        metrics = self.metrics
        metrics.transactions.labels("committed").inc()
        now = time.time()
        now_ms = now * 1000
        heartbeats = self.mirror.heartbeat_topic if self.mirror is not None else None
        counts: dict[str, int] = {}
        pairs: dict[tuple[str, str], tuple[list[float], list[int]]] = {}
        user_latencies: list[float] = []
        # Per delivery, not per event: all events of one delivery share origin and topic.
        for delivery in deliveries:
            where = delivery.origin_partition
            if not delivery.events or where is None:
                continue
            origin, topic, _ = where
            counts[topic] = counts.get(topic, 0) + len(delivery.events)
            latencies, sizes = pairs.setdefault((origin, topic), ([], []))
            events = [delivered.event for delivered in delivery.events]
            sizes += [len(e.key or b"") + len(e.value or b"") for e in events]
            stamped = [max(0.0, now_ms - e.timestamp_ms) for e in events if e.timestamp_ms > 0]
            latencies += stamped
            if topic != heartbeats:  # user events only: status p50/p99
                user_latencies += stamped
        if user_latencies:
            metrics.latency.observe_many([ms / 1000 for ms in user_latencies])
            self.latency.extend(user_latencies)
        if self.mirror is not None:
            for (origin, topic), (latencies, sizes) in pairs.items():
                self.mirror.replicated(origin, topic, latencies, sizes, now)
            self.own_marks = ledger.positions_of(self.member)
        for topic, count in counts.items():
            metrics.events_out.labels(topic).inc(count)
            if self._is_heartbeat(topic):
                self.heartbeats_out += count
        for topic, seq in ledger.next_seq.items():
            if not self._is_heartbeat(topic):  # the operator reads it as user progress
                metrics.delivered_seq.labels(topic).set(seq - 1)

    def transaction_failed(self, failure: WriteFailure, reason: str) -> None:
        self.metrics.transactions.labels(_FAILURE_OUTCOME[failure]).inc()
        self._last_failure = failure
        if failure is WriteFailure.UNAVAILABLE:
            log.warning("delivery failed, retrying with backoff: %s", reason)
        elif failure in (WriteFailure.FENCED, WriteFailure.OUTCOME_UNKNOWN):
            log.error("%s", reason)

    def halted(self, reason: str) -> None:
        log.error("delivery halted: %s", reason)
        self.metrics.halted.clear()
        reason_label = (
            "global_topic_lost"
            if self._last_failure is WriteFailure.GLOBAL_TOPIC_LOST
            else "record_too_large"
        )
        self.metrics.halted.labels(reason_label).set(1)

    def resumed(self) -> None:
        log.info("delivery resumed")
        self.metrics.halted.clear()

    def undecodable_frame(self, peer: str, error: WireFormatError) -> None:
        self.metrics.decode_errors.inc()
        log.warning("dropped an undecodable frame from %s: %s", peer, error)

    def load_failed(self, reason: str) -> None:
        log.warning("reading log entries back failed (retried later): %s", reason)
