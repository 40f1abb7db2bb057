"""One audit run: plan the ranges, read them with Spark, check, and decide the next state."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdsync.audit.checks import all_violations
from kdsync.audit.checks.by_seq import collect_seq_counts
from kdsync.audit.checks.model import Bounds, Facts, bounds_frame, in_range
from kdsync.audit.positions import AuditPlan, TopicPlan
from kdsync.audit.reader import global_events, origin_events
from kdsync.audit.report import (
    DEFAULT_VIOLATION_CAP,
    UNVERIFIED,
    Checked,
    Report,
    ReportMembership,
    Violation,
    build_report,
)
from kdsync.audit.state import AuditState, TopicState

LOG = logging.getLogger("kdsync.audit")


@contextmanager
def _phase(name: str) -> Iterator[None]:
    """Logs how long one Spark phase took (``kdsync audit -v`` shows them)."""
    started = time.monotonic()
    yield
    LOG.info("%s: %.1fs", name, time.monotonic() - started)


@dataclass(frozen=True)
class AuditOptions:
    from_seq: int | None = None
    to_seq: int | None = None
    violation_cap: int = DEFAULT_VIOLATION_CAP
    # Split each Kafka partition's range into more Spark tasks (None: one task each).
    min_partitions: int | None = None


@dataclass(frozen=True)
class AuditOutcome:
    report: Report
    # Where a later run continues: set only when the run passed.
    next_state: AuditState | None


@dataclass(frozen=True)
class _Stats:
    low: int
    high: int


def _bounds(
    plan: TopicPlan, stats: dict[str, _Stats], state: AuditState | None, options: AuditOptions
) -> Bounds:
    previous = state.topics.get(plan.topic) if state is not None else None
    if options.from_seq is not None:
        first = options.from_seq
    elif previous is not None:
        first = previous.next_seq
    else:
        # History removed by retention: start where every trimmed member still has events.
        trimmed = [stats[r.member].low for r in plan.globals if r.trimmed and r.member in stats]
        first = max(trimmed, default=0)
    highest = max((s.high for s in stats.values()), default=first - 1)
    last = highest if options.to_seq is None else options.to_seq
    return Bounds(plan.topic, first, max(last, first - 1))


def _audited_ends(plan: AuditPlan, state: AuditState | None) -> dict[tuple[str, str, int], int]:
    """Per origin partition, the first origin offset the last clean run had not yet seen
    replicated below where this run starts (the state's origin offsets)."""
    if state is None:
        return {}
    ends: dict[tuple[str, str, int], int] = {}
    for topic_plan in plan.topics:
        previous = state.topics.get(topic_plan.topic)
        if previous is None:
            continue
        for rng in topic_plan.origins:
            for part in rng.end:
                offset = previous.origin_offset(rng.member, part)
                if offset is not None:
                    ends[(rng.member, topic_plan.topic, part)] = offset
    return ends


def _next_state(
    events: DataFrame, plan: AuditPlan, facts: Facts, state: AuditState | None
) -> AuditState:
    cuts = {
        b.topic: min((facts.highs[(b.topic, m)] for m in facts.members), default=b.from_seq - 1)
        for b in facts.bounds
    }
    if not cuts:
        return AuditState(group=plan.group, topics=dict(state.topics) if state else {})
    cut_map = F.create_map(*[x for t, c in cuts.items() for x in (F.lit(t), F.lit(c))])
    settled = events.where(
        F.col("well_formed") & (F.col("seq") <= F.try_element_at(cut_map, F.col("topic")))
    )
    global_ends = {
        (r["member"], r["topic"], r["gpartition"]): r["last"]
        for r in settled.groupBy("member", "topic", "gpartition")
        .agg(F.max("goffset").alias("last"))
        .collect()
    }
    origin_ends = {
        (r["origin"], r["otopic"], r["opartition"]): r["last"]
        for r in settled.groupBy("origin", "otopic", "opartition")
        .agg(F.max("ooffset").alias("last"))
        .collect()
    }
    topics = dict(state.topics) if state is not None else {}
    bounds = {b.topic: b for b in facts.bounds}
    for topic_plan in plan.topics:
        topic = topic_plan.topic
        global_offsets = {
            rng.member: {
                str(p): max(rng.start[p], global_ends.get((rng.member, topic, p), -1) + 1)
                for p in rng.end
            }
            for rng in topic_plan.globals
        }
        origin_offsets = {
            rng.member: {
                str(p): max(rng.start[p], origin_ends.get((rng.member, topic, p), -1) + 1)
                for p in rng.end
            }
            for rng in topic_plan.origins
        }
        topics[topic] = TopicState.model_validate(
            {
                "nextSeq": max(bounds[topic].from_seq, cuts[topic] + 1),
                "global": global_offsets,
                "origin": origin_offsets,
            }
        )
    return AuditState(group=plan.group, topics=topics)


def _membership(plan: AuditPlan) -> ReportMembership:
    membership = plan.membership
    return ReportMembership(
        checked=list(plan.data_members),
        departed=list(plan.departed),
        not_read=list(plan.unread),
        config_index=0 if membership is None else membership.config_index,
        source=None if membership is None else membership.source,
        seeded={m: dict(h) for m, h in plan.handovers.items()},
        joining=[] if membership is None else list(membership.joining),
    )


def run_audit(
    spark: SparkSession,
    plan: AuditPlan,
    state: AuditState | None,
    options: AuditOptions,
    *,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> AuditOutcome:
    """Read what ``plan`` names, check it, and build the report (and the next state)."""
    started = clock()
    events = global_events(spark, plan.topics, options.min_partitions).persist()
    try:
        origins = origin_events(spark, plan.topics, options.min_partitions)
        with _phase("read every T-global and seq statistics"):
            stats_rows = (
                events.where(F.col("well_formed"))
                .groupBy("topic", "member")
                .agg(F.min("seq").alias("low"), F.max("seq").alias("high"))
                .collect()
            )
        stats: dict[str, dict[str, _Stats]] = {}
        for row in stats_rows:
            stats.setdefault(row["topic"], {})[row["member"]] = _Stats(row["low"], row["high"])
        bounds = tuple(_bounds(p, stats.get(p.topic, {}), state, options) for p in plan.topics)
        highs: dict[tuple[str, str], int] = {}
        lag: dict[str, int] = dict.fromkeys(plan.data_members, 0)
        for b in bounds:
            topic_stats = stats.get(b.topic, {})
            group_high = max((s.high for s in topic_stats.values()), default=b.from_seq - 1)
            for member in plan.data_members:
                own = topic_stats.get(member)
                own_high = b.from_seq - 1 if own is None else max(own.high, b.from_seq - 1)
                highs[(b.topic, member)] = min(own_high, b.to_seq)
                lag[member] = max(lag[member], group_high - own_high)
        facts = Facts(
            members=plan.data_members,
            bounds=bounds,
            highs=highs,
            origin_starts={
                (rng.member, p.topic, part): rng.start[part]
                for p in plan.topics
                for rng in p.origins
                for part in rng.start
            },
            committed_ends={
                (rng.member, p.topic, part): rng.expected[part]
                for p in plan.topics
                for rng in p.origins
                for part in rng.expected
            },
            audited_ends=_audited_ends(plan, state) if options.from_seq is None else {},
            departed=plan.departed,
            unread=plan.unread,
            first_seqs={
                (p.topic, rng.member): rng.first_seq
                for p in plan.topics
                for rng in p.globals
                if rng.first_seq > 0
            },
        )
        with _phase("seq counts per member"):
            counts = collect_seq_counts(in_range(events, bounds_frame(spark, bounds)), facts)
        found = all_violations(spark, events, origins, facts, counts).persist()
        try:
            with _phase("read origins and check every event"):
                kinds = {r["kind"]: r["count"] for r in found.groupBy("kind").count().collect()}
            sample = (
                found.where(F.col("kind") != UNVERIFIED)
                .orderBy(F.col("seq").asc_nulls_last(), "kind", "member", "detail")
                .limit(options.violation_cap)
                .collect()
            )
        finally:
            found.unpersist()
        checked_events = sum(c.seqs for c in counts.values())
        checked = Checked(
            from_seq=min((b.from_seq for b in bounds), default=0),
            to_seq=max((b.to_seq for b in bounds), default=-1),
            events=checked_events,
        )
        violations = [
            Violation(kind=r["kind"], seq=r["seq"], member=r["member"], detail=r["detail"])
            for r in sample
        ]
        report = build_report(
            group=plan.group,
            checked=checked,
            counts=kinds,
            lag=lag,
            violations=violations,
            members=len(plan.data_members),
            membership=_membership(plan),
            started_at=started,
            finished_at=clock(),
        )
        next_state = None
        if report.passed:
            with _phase("next incremental state"):
                next_state = _next_state(events, plan, facts, state)
        return AuditOutcome(report=report, next_state=next_state)
    finally:
        events.unpersist()
