"""Plan the copy of a donor's ``T-global`` topics, and refuse it, before Spark runs.

A donor whose ``T-global`` lost its beginning to retention is copied from the lowest seq
``F`` from which it holds every seq below ``next_seq``: each seq lives in one partition and
seqs increase with offsets, so ``F`` is the highest first seq of the trimmed partitions
(``next_seq`` when one of them holds nothing any more: its lost seqs are unknown).

The new member's ``T-global`` is claimed complete from ``S`` (``CopyResult.first_seq``):
``F``, or when an earlier run left records in the target, the higher of ``F`` and the lowest
first seq of the target's partitions that hold any. Each partition an earlier run wrote to
holds its seqs from that run's start (at most that lowest first seq) up to its last one, and
the donor holds every seq from ``F`` on: so the target can be completed from ``S`` without a
hole. After a resume ``S`` can be later than the first record an earlier run copied (the
target's records below ``S`` are left alone and not counted): a conservative start, never
one with a hole.

Each donor partition is read from its first offset whose seq is at least ``S``, not from
its log start, so retention deleting the donor's oldest records during a long copy does not
break the read.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType

from kdsync.failover.kafka_io import KafkaPartitionLog
from kdsync.failover.translation import PartitionLog
from kdsync.kafka.client_config import admin_config
from kdsync.kafka.errors import KafkaUnavailable
from kdsync.kafka.global_topic_rule import RETENTION_MS
from kdsync.kafka.partition_reader import reading_consumer
from kdsync.kafka.topics import GLOBAL_TOPIC_CONFIG, ClusterTopics
from kdsync.record_format import RecordFormatError

log = logging.getLogger("kdsync.backfill")


class BackfillError(RuntimeError):
    """The copy cannot be made (or was stopped); the message names member, topic and why."""


@dataclass(frozen=True)
class KafkaEndpoint:
    member: str  # member name, for messages
    properties: Mapping[str, str]  # librdkafka properties, "bootstrap.servers" included


@dataclass(frozen=True)
class TopicPlan:
    topic: str
    next_seq: int
    partitions: int
    # Donor offsets to read, [start, end) read_committed: start is the log start when
    # planned, then the first offset whose seq is at least the target's first seq.
    start: dict[int, int]
    end: dict[int, int]
    config: dict[str, str]  # for the target topic, if it has to be created
    first: int  # F: the donor holds every seq in [first, next_seq)


def plan_copy(
    donor: KafkaEndpoint, target: KafkaEndpoint, upto: Mapping[str, int], timeout: float
) -> tuple[list[TopicPlan], dict[str, int]]:
    """Each topic's plan, and its first seq ``S`` in the target; creates the target's missing
    topics. Every topic is planned (and may be refused) before anything is created or
    written."""
    plans = _plan_topics(donor, upto, timeout)
    first = _survey_target(target, plans, timeout)
    _create_target(target, plans, timeout)
    return _read_from_first_seq(donor, plans, first, timeout), first


def check_complete(
    donor: KafkaEndpoint,
    target: KafkaEndpoint,
    plans: list[TopicPlan],
    first: Mapping[str, int],
    present: Mapping[str, int],
    copied: Mapping[str, int],
) -> None:
    """Log what the copy did, and refuse a target topic that does not now hold one record
    per seq from its first seq to next_seq."""
    for plan in plans:
        topic, start = plan.topic, first[plan.topic]
        log.info(
            "%s: copied %d record(s) from %s to %s, %d were there already (seqs %d to %d)",
            topic, copied[topic], donor.member, target.member, present[topic], start,
            plan.next_seq - 1,
        )  # fmt: skip
        # Seqs are gapless and each lives in one partition; every record counted is in
        # [start, next_seq), in increasing order within its partition: a count that differs
        # is a hole (or a repeat), in the donor or left by retention racing the copy.
        if present[topic] + copied[topic] != plan.next_seq - start:
            raise BackfillError(
                f"{target.member}'s {topic} holds {present[topic] + copied[topic]} record(s) "
                f"with seqs {start} to {plan.next_seq - 1} ({present[topic]} there before, "
                f"{copied[topic]} copied), not {plan.next_seq - start}: donor "
                f"{donor.member}'s seqs have holes or repeats, or it lost to retention seqs "
                "not copied yet; run the audit on it, delete "
                f"{target.member}'s {topic} and backfill again (from another member if need be)"
            )


def _plan_topics(donor: KafkaEndpoint, upto: Mapping[str, int], timeout: float) -> list[TopicPlan]:
    topics = ClusterTopics(donor.properties, timeout)
    counts = topics.partitions()
    admin = AdminClient(admin_config(donor.properties))
    consumer = reading_consumer(
        donor.properties, f"kdsync-backfill-plan-{uuid.uuid4().hex[:8]}",
        committed_only=True, fetch_wait_ms=50,
    )  # fmt: skip
    try:
        plans = []
        for topic, next_seq in sorted(upto.items()):
            count = counts.get(topic)
            if count is None:
                raise BackfillError(f"donor {donor.member} has no topic {topic}")
            parts = [(topic, p) for p in range(count)]
            logs = [KafkaPartitionLog(consumer, topic, p, timeout) for p in range(count)]
            try:
                lows = topics.earliest_offsets(parts, timeout)
                first = _first_complete(logs, lows, next_seq)
                last = max((_last_seq(entry) for entry in logs), default=-1)
                if last < next_seq - 1:
                    raise BackfillError(
                        f"donor {donor.member}'s {topic} holds seqs up to {last} only, not up "
                        f"to {next_seq - 1}: it is behind; wait for it or pick another donor"
                    )
                # Taken after the check, so these ends cover every seq below next_seq.
                ends = topics.committed_ends(parts, timeout)
                config = _target_config(admin, topic, timeout)
            except (KafkaException, KafkaUnavailable, RecordFormatError) as exc:
                raise BackfillError(
                    f"cannot plan the copy of donor {donor.member}'s {topic}: {exc}"
                ) from exc
            if first > 0:
                log.info(
                    "%s: retention trimmed donor %s's: it holds every seq from %d only",
                    topic, donor.member, first,
                )  # fmt: skip
            plans.append(
                TopicPlan(
                    topic, next_seq, count,
                    start={p: lows[(topic, p)] for p in range(count)},
                    end={p: ends[(topic, p)] for p in range(count)},
                    config=config, first=first,
                )
            )  # fmt: skip
        return plans
    finally:
        consumer.close()


def _first_complete(
    logs: list[KafkaPartitionLog], lows: Mapping[tuple[str, int], int], next_seq: int
) -> int:
    """F: the lowest seq from which the partitions hold every seq below ``next_seq``.

    A partition retention never trimmed holds all its seqs. A trimmed one holds all of its
    seqs from its first committed record on, and lost lower ones nobody knows: each seq
    lives in one partition, so below the highest such first seq some may be missing. A
    trimmed partition that holds no committed record may have lost any seq: F = next_seq.
    """
    first = 0
    for partition_log in logs:
        low = lows[(partition_log.topic, partition_log.partition)]
        if low == 0:
            continue
        held = partition_log.read_from(low)
        first = max(first, held[0].seq if held else next_seq)
    return min(first, next_seq)


def _last_seq(partition_log: KafkaPartitionLog) -> int:
    _, end = partition_log.bounds()
    last = partition_log.last_before(end)
    return -1 if last is None else last.seq


def _target_config(admin: AdminClient, topic: str, timeout: float) -> dict[str, str]:
    """T-global's configs, with the donor's retention where it is longer: copied records
    keep their timestamps, and a shorter retention would delete history the donor keeps."""
    config = dict(GLOBAL_TOPIC_CONFIG)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    found = admin.describe_configs([resource], request_timeout=timeout)[resource]
    entry = found.result(timeout=timeout).get(RETENTION_MS)
    donor = str(getattr(entry, "value", ""))
    if donor.lstrip("-").isdigit() and (donor == "-1" or int(donor) > int(config[RETENTION_MS])):
        config[RETENTION_MS] = donor
    return config


def _survey_target(target: KafkaEndpoint, plans: list[TopicPlan], timeout: float) -> dict[str, int]:
    """Each topic's first seq S in the target: the donor's F, or the higher of F and the
    lowest first seq of the target's partitions that hold records (an earlier run's). Every
    seq from S on is then in the target or in the donor (see the module's docstring).
    Refuses a target topic with another partition count."""
    existing = ClusterTopics(target.properties, timeout).partitions()
    consumer = reading_consumer(
        target.properties, f"kdsync-backfill-plan-{uuid.uuid4().hex[:8]}",
        committed_only=True, fetch_wait_ms=50,
    )  # fmt: skip
    first: dict[str, int] = {}
    try:
        for plan in plans:
            have = existing.get(plan.topic)
            if have is not None and have != plan.partitions:
                raise BackfillError(
                    f"{target.member}'s {plan.topic} has {have} partition(s), the donor's "
                    f"{plan.partitions}: records must keep their partition; delete it or fix it"
                )
            starts: list[int] = []  # the first seq of each partition holding records
            for p in range(have or 0):
                partition_log = KafkaPartitionLog(consumer, plan.topic, p, timeout)
                low, _ = partition_log.bounds()
                held = partition_log.read_from(low)
                if held:
                    starts.append(held[0].seq)
            first[plan.topic] = max(plan.first, min(starts)) if starts else plan.first
            if first[plan.topic] > plan.first:
                log.info(
                    "%s: %s holds records from an earlier run: it is completed from seq %d on",
                    plan.topic, target.member, first[plan.topic],
                )  # fmt: skip
    except (KafkaException, KafkaUnavailable, RecordFormatError) as exc:
        raise BackfillError(f"cannot read what {target.member} holds already: {exc}") from exc
    finally:
        consumer.close()
    return first


def _create_target(target: KafkaEndpoint, plans: list[TopicPlan], timeout: float) -> None:
    topics = ClusterTopics(target.properties, timeout)
    existing = topics.partitions()
    for plan in plans:
        if plan.topic not in existing:
            topics.ensure(plan.topic, plan.partitions, plan.config)


def _read_from_first_seq(
    donor: KafkaEndpoint, plans: list[TopicPlan], first: Mapping[str, int], timeout: float
) -> list[TopicPlan]:
    """The plans, each donor partition read from its first record with a seq of at least the
    topic's first seq (its end when it has none): records below it are not needed, and
    retention may delete them while the copy runs (the read would then fail)."""
    consumer = reading_consumer(
        donor.properties, f"kdsync-backfill-plan-{uuid.uuid4().hex[:8]}",
        committed_only=True, fetch_wait_ms=50,
    )  # fmt: skip
    try:
        found = []
        for plan in plans:
            seq = first[plan.topic]
            if seq <= 0:
                found.append(plan)
                continue
            start = {
                p: plan.end[p]
                if seq >= plan.next_seq
                else _first_offset_from(
                    KafkaPartitionLog(consumer, plan.topic, p, timeout), seq, plan.end[p]
                )
                for p in range(plan.partitions)
            }
            found.append(dataclasses.replace(plan, start=start))
        return found
    except (KafkaException, KafkaUnavailable, RecordFormatError) as exc:
        raise BackfillError(f"cannot read donor {donor.member}'s T-global: {exc}") from exc
    finally:
        consumer.close()


def _first_offset_from(partition_log: PartitionLog, seq: int, end: int) -> int:
    """The offset of the partition's first committed record below ``end`` with a seq of at
    least ``seq`` (``end`` when there is none): a bisection over offsets, each probe reading
    one run of consecutive committed records."""
    low, _ = partition_log.bounds()
    # Every committed record below low has a smaller seq; found: the answer when no record
    # in [low, high) qualifies. The log's start is probed first: the answer when the first
    # record's seq is at least seq already (as in the partition that sets F).
    high = found = end
    probe = low
    while low < high:
        run = [r for r in partition_log.read_from(probe) if r.offset < high]
        if run and run[0].seq < seq:
            later = next((r for r in run if r.seq >= seq), None)
            if later is not None:
                return later.offset
            low = run[-1].offset + 1
        else:
            if run:
                found = run[0].offset
            high = probe
        probe = (low + high) // 2
    return found
