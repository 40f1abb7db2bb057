"""The sidecar's Prometheus metrics (names follow Prometheus conventions; MirrorMaker 2
users will recognise replication latency and record counts)."""

from __future__ import annotations

import contextlib
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kdsync.runtime.admin_site import AdminRefusal
from kdsync.runtime.bulk_histogram import BulkHistogram

_LATENCY_BUCKETS = (
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
_COMMIT_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class SidecarMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.info = Gauge(
            "kdsync_member_info",
            "This sidecar's group and member (value 1)",
            ["group", "member", "witness"],
            registry=r,
        )
        self.events_in = Counter(
            "kdsync_events_in",
            "Events read from this member's source topics and offered",
            ["topic"],
            registry=r,
        )
        self.events_out = Counter(
            "kdsync_events_out",
            "Events committed to this member's T-global topics",
            ["topic"],
            registry=r,
        )
        self.delivered_seq = Gauge(
            "kdsync_delivered_seq",
            "Highest global sequence number committed to T-global",
            ["topic"],
            registry=r,
        )
        self.member_lag = Gauge(
            "kdsync_member_lag",
            "Log entries a member is behind (every member on the leader; own lag elsewhere)",
            ["member"],
            registry=r,
        )
        # Observed once per delivered event, so counted a batch at a time.
        self.latency = BulkHistogram(
            "kdsync_replication_latency_seconds",
            "Origin record timestamp to commit in this member's T-global",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "kdsync_transaction_commit_seconds",
            "Duration of one T-global transaction (records, ledger, offsets, commit)",
            buckets=_COMMIT_BUCKETS,
            registry=r,
        )
        # A member catching up is sent entries its leader reads back from Kafka: when
        # catch-up is slow, these say whether the read-backs are why.
        self.log_readback_seconds = Histogram(
            "kdsync_log_readback_seconds",
            "Duration of one read-back of ordering-log entries from Kafka",
            buckets=_COMMIT_BUCKETS,
            registry=r,
        )
        self.log_readback_entries = Counter(
            "kdsync_log_readback_entries",
            "Ordering-log entries read back from Kafka (for lagging peers or own applying)",
            registry=r,
        )
        self.transactions = Counter(
            "kdsync_transactions",
            "T-global transactions by outcome",
            ["outcome"],
            registry=r,
        )
        self.term = Gauge("kdsync_term", "Current ordering term", registry=r)
        self.is_leader = Gauge("kdsync_leader", "1 on the member that leads the group", registry=r)
        self.view_size = Gauge(
            "kdsync_view_members",
            "Members this one heard from within an election timeout",
            registry=r,
        )
        self.view_member = Gauge(
            "kdsync_view_member",
            "1 if the member is in this member's current view",
            ["member"],
            registry=r,
        )
        self.group_members = Gauge(
            "kdsync_group_members",
            "Voting members configured in the group",
            registry=r,
        )
        self.commit_index = Gauge("kdsync_commit_index", "Committed log index", registry=r)
        self.applied_index = Gauge(
            "kdsync_applied_index",
            "Log index durably written to T-global",
            registry=r,
        )
        self.log_memory = Gauge(
            "kdsync_log_memory_bytes",
            "Ordering log entries held in memory, read-backs included (ordering.maxLogBytes)",
            registry=r,
        )
        self.halted = Gauge(
            "kdsync_delivery_halted",
            "1 while delivery to T-global is halted (see the reason label and kdsync status)",
            ["reason"],
            registry=r,
        )
        self.ready = Gauge("kdsync_ready", "1 when /readyz would answer 200", registry=r)
        self.peer_connected = Gauge(
            "kdsync_peer_connected",
            "1 when the outbound link to the peer is up",
            ["peer"],
            registry=r,
        )
        self.peer_rdma = Gauge(
            "kdsync_peer_link_rdma",
            "1 when frames to (direction=out) or from (in) the peer travel over RDMA",
            ["peer", "direction"],
            registry=r,
        )
        self.transport_fallback = Gauge(
            "kdsync_transport_rdma_fallback",
            "1 when transport.type is rdma but no usable device was found, so every link "
            "runs on TCP (transport.rdma.fallbackToTcp; the reason is in kdsync status)",
            registry=r,
        )
        self.peer_rejected = Gauge(
            "kdsync_peer_connections_rejected",
            "Inbound peer connections refused since start: no or a malformed hello, not a "
            "member, a different group configuration, or a handshake that took too long",
            registry=r,
        )
        self.admin_refused = Counter(
            "kdsync_admin_connections_refused",
            "Admin listener connections closed in their TLS handshake, and membership "
            "changes refused to a client that is not the operator, by reason (see "
            "docs/sidecar.md, 'Admin listener')",
            ["reason"],
            registry=r,
        )
        for reason in AdminRefusal:
            self.admin_refused.labels(reason.value)
        self.elections = Counter(
            "kdsync_elections",
            "Election steps of this member: pre-vote (asked), campaign (pre-vote won), "
            "leader (won), step-down (left leadership)",
            ["step"],
            registry=r,
        )
        self.votes_refused = Counter(
            "kdsync_votes_refused",
            "(Pre-)votes this member refused because the candidate's log was behind ours "
            "or a live leader was known",
            registry=r,
        )
        self.loop_lag = Histogram(
            "kdsync_event_loop_lag_seconds",
            "How late the sidecar's event loop woke up (a long step on it delays heartbeats)",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self.source_errors = Gauge(
            "kdsync_source_read_errors",
            "Errors reading this member's source topics since start (see kdsync status)",
            registry=r,
        )
        self.decode_errors = Counter(
            "kdsync_peer_decode_errors",
            "Peer frames that could not be decoded",
            registry=r,
        )
        self.group_sync_written = Counter(
            "kdsync_group_offset_sync_offsets_written",
            "Consumer group offsets written into this member by group offset sync",
            ["group"],
            registry=r,
        )
        self.group_sync_delay = Histogram(
            "kdsync_group_offset_sync_delay_seconds",
            "Group offset sync: from the round that first saw a group's partition behind "
            "another member to the write of its offset here",
            buckets=(0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
            registry=r,
        )
        self.group_sync_errors = Counter(
            "kdsync_group_offset_sync_errors",
            "Group offset sync rounds with a failure, by kind (unavailable:<member>, "
            "topics, record-format, write-refused, unexpected, clients); see kdsync status",
            ["kind"],
            registry=r,
        )
        self.group_sync_groups = Gauge(
            "kdsync_group_offset_sync_groups",
            "Consumer groups selected for offset sync (found in another member)",
            registry=r,
        )
        self.group_sync_in_step = Gauge(
            "kdsync_group_offset_sync_groups_in_step",
            "Selected groups whose every partition here is at their furthest exact position",
            registry=r,
        )
        self.group_sync_round_seconds = Gauge(
            "kdsync_group_offset_sync_round_seconds",
            "Duration of the last group offset sync round",
            registry=r,
        )
        self.group_sync_round_age = Gauge(
            "kdsync_group_offset_sync_last_round_age_seconds",
            "Seconds since the last group offset sync round finished (-1: none yet)",
            registry=r,
        )
        self.topic_config_drift = Gauge(
            "kdsync_global_topic_config_drift",
            "1 while a T-global config (or its partition count: config=partitions) is off "
            "kdsync's rule and was not put back (see globalTopicConfig in kdsync status)",
            ["topic", "config"],
            registry=r,
        )
        self.topic_config_fixes = Counter(
            "kdsync_global_topic_config_fixes",
            "T-global configs set back to kdsync's rule",
            ["topic", "config"],
            registry=r,
        )
        self.topic_config_errors = Counter(
            "kdsync_global_topic_config_check_errors",
            "T-global config checks that failed (brokers unreachable, a request refused)",
            registry=r,
        )

    def count_admin_refusal(self, reason: AdminRefusal) -> None:
        self.admin_refused.labels(reason.value).inc()

    def forget_member(self, name: str) -> None:
        """Drop every series about member ``name``, whose removal committed: it is gone
        for good, and a series left at its last value (a peer link shown up, a lag) would
        say otherwise on dashboards and alerts."""
        for gauge in (self.view_member, self.member_lag, self.peer_connected):
            with contextlib.suppress(KeyError):
                gauge.remove(name)
        for direction in ("out", "in"):
            with contextlib.suppress(KeyError):
                self.peer_rdma.remove(name, direction)


class TopicConfigMetrics:
    """The T-global config check's observer: drift and fixes as metrics."""

    def __init__(self, metrics: SidecarMetrics) -> None:
        self._m = metrics

    def drift(self, topic: str, config: str, drifting: bool) -> None:
        self._m.topic_config_drift.labels(topic, config).set(1 if drifting else 0)

    def fixed(self, topic: str, config: str) -> None:
        self._m.topic_config_fixes.labels(topic, config).inc()

    def failed(self) -> None:
        self._m.topic_config_errors.inc()


class GroupSyncMetrics:
    """Group offset sync's observer: its rounds' outcomes as metrics."""

    def __init__(self, metrics: SidecarMetrics) -> None:
        self._m = metrics
        self._finished_at: float | None = None
        metrics.group_sync_round_age.set_function(self._age)

    def _age(self) -> float:
        return -1.0 if self._finished_at is None else time.monotonic() - self._finished_at

    def written(self, group: str, offsets: int, delays: list[float]) -> None:
        self._m.group_sync_written.labels(group).inc(offsets)
        for delay in delays:
            self._m.group_sync_delay.observe(delay)

    def failed(self, kind: str) -> None:
        self._m.group_sync_errors.labels(kind).inc()

    def round_done(self, seconds: float, groups: int, in_step: int) -> None:
        self._finished_at = time.monotonic()
        self._m.group_sync_round_seconds.set(seconds)
        self._m.group_sync_groups.set(groups)
        self._m.group_sync_in_step.set(in_step)
