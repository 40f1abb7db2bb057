"""Copy a donor member's ``T-global`` topics into a new member's cluster, below ``next_seq``.

The driver plans with plain confluent-kafka: each topic's partitions, their committed
offset ranges, the seq it is copied from, and the refusals (a donor behind ``next_seq``).
A donor whose ``T-global`` lost its beginning to retention is copied from the lowest seq
``F`` from which it holds every seq below ``next_seq``: each seq lives in one partition and
seqs increase with offsets, so ``F`` is the highest first seq of the trimmed partitions
(``next_seq`` when one of them holds nothing any more: its lost seqs are unknown).

The target's topics are surveyed before anything is written. The new member's ``T-global``
is claimed complete from ``S`` (:attr:`CopyResult.first_seq`): ``F``, or when an earlier run
left records in the target, the higher of ``F`` and the lowest first seq of the target's
partitions that hold any. Each partition an earlier run wrote to holds its seqs from that
run's start (at most that lowest first seq) up to its last one, and the donor holds every
seq from ``F`` on: so the target can be completed from ``S`` without a hole. After a resume
``S`` can be later than the first record an earlier run copied (the target's records below
``S`` are left alone and not counted): a conservative start, never one with a hole.

Then the driver creates the missing target topics with the donor's partition count, and
finds in each donor partition the first offset whose seq is at least ``S``: reading starts
there, not at the log start, so retention deleting the donor's oldest records during a long
copy does not break the read. Spark's Kafka source (:func:`kdsync.audit.reader.read_range`,
one Spark partition per Kafka partition, so offset order is kept) feeds one Python task per
partition, which writes the records into the same partition of the target with a
transactional producer whose id names that partition.

A task calls ``init_transactions`` first: that fences any earlier attempt at the same
partition (a crashed run, a retried or speculative Spark task) and aborts what it left
open. Only then does it read the target partition's committed records (how many from ``S``
on, and the highest ``kdsync.seq``), so nothing of an earlier attempt can commit after that
read, and skip the donor's records below ``S`` and up to that highest one. Transactions
commit every ``COMMIT_RECORDS`` records or ``COMMIT_BYTES``: a run killed at any moment
leaves a committed prefix, and the next run continues after it. Afterwards each target topic
must hold as many records as there are seqs from ``S`` to ``next_seq``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdsync.audit.kafka_options import java_kafka_options
from kdsync.audit.positions import TopicRange
from kdsync.audit.reader import read_range
from kdsync.failover.kafka_io import KafkaPartitionLog, seq_of
from kdsync.failover.translation import PartitionLog
from kdsync.kafka.client_config import admin_config, client_config
from kdsync.kafka.errors import KafkaUnavailable
from kdsync.kafka.global_topic_rule import RETENTION_MS
from kdsync.kafka.partition_reader import read_to_end, reading_consumer
from kdsync.kafka.produce_pacing import PACED_PRODUCER, must_flush
from kdsync.kafka.topics import GLOBAL_TOPIC_CONFIG, ClusterTopics
from kdsync.ordering.events import Header, header_bytes
from kdsync.record_format import RecordFormatError, from_global_record

log = logging.getLogger("kdsync.backfill")

COMMIT_RECORDS = 5_000
COMMIT_BYTES = 8 * 1024 * 1024
# What confluent-kafka's produce() takes as headers.
_Headers = list[tuple[str, str | bytes | None]]
# One task's outcome: (topic, partition, present, copied, error or None).
_Outcome = tuple[str, int, int, int, str | None]


class BackfillError(RuntimeError):
    """The copy cannot be made (or was stopped); the message names member, topic and why."""


@dataclass(frozen=True)
class KafkaEndpoint:
    member: str  # member name, for messages
    properties: Mapping[str, str]  # librdkafka properties, "bootstrap.servers" included


@dataclass(frozen=True)
class CopyResult:
    copied: dict[str, int]  # global topic -> records written by this run
    present: dict[str, int]  # global topic -> records already there before this run
    # Global topic -> the seq from which the target's topic holds every seq below next_seq
    # (records below it, left by an earlier run, are not counted in present).
    first_seq: dict[str, int]


@dataclass(frozen=True)
class _TopicPlan:
    topic: str
    next_seq: int
    partitions: int
    # Donor offsets to read, [start, end) read_committed: start is the log start when
    # planned, then the first offset whose seq is at least the target's first seq.
    start: dict[int, int]
    end: dict[int, int]
    config: dict[str, str]  # for the target topic, if it has to be created
    first: int  # F: the donor holds every seq in [first, next_seq)


@dataclass(frozen=True)
class _Held:
    """The committed records of one target partition: how many from its topic's first seq
    on, and the highest seq."""

    count: int
    last: int


@dataclass(frozen=True)
class _TaskSettings:
    """What every Spark task gets (pickled): plain values only."""

    donor: str
    target: str
    properties: dict[str, str]  # the target's
    upto: dict[str, int]
    first: dict[str, int]  # topic -> its first seq in the target: lower records are skipped
    transactional_prefix: str
    timeout: float
    commit_records: int
    commit_bytes: int


def copy_global_topics(
    spark: SparkSession,
    donor: KafkaEndpoint,
    target: KafkaEndpoint,
    upto: Mapping[str, int],
    transactional_prefix: str,
    *,
    timeout: float = 30.0,
) -> CopyResult:
    """Make ``target``'s topics hold exactly ``donor``'s records with ``kdsync.seq`` from
    their first seq (see :class:`CopyResult`) below ``upto[topic]``: copies what is missing
    after the target's committed prefix."""
    # Every topic is planned (and may be refused) before anything is created or written.
    plans = _plan(donor, upto, timeout)
    first = _survey_target(target, plans, timeout)
    _create_target(target, plans, timeout)
    plans = _read_from_first_seq(donor, plans, first, timeout)
    settings = _TaskSettings(
        donor=donor.member,
        target=target.member,
        properties=dict(target.properties),
        upto={plan.topic: plan.next_seq for plan in plans},
        first=first,
        transactional_prefix=transactional_prefix,
        timeout=timeout,
        commit_records=COMMIT_RECORDS,
        commit_bytes=COMMIT_BYTES,
    )
    frames = [
        frame
        for plan in plans
        if (frame := _donor_frame(spark, donor, plan, first[plan.topic])) is not None
    ]
    outcomes: list[_Outcome] = []
    if frames:
        union = functools.reduce(DataFrame.unionByName, frames)
        spark.sparkContext.setJobDescription(f"kdsync backfill {donor.member} -> {target.member}")
        copy = functools.partial(_copy_partition, settings)
        outcomes = list(union.rdd.mapPartitions(copy).collect())
    # Partitions no task saw (the donor has no record to copy there): the driver fences
    # earlier attempts at them, and counts and checks what the target holds, as a task does.
    tasked = {(topic, partition) for topic, partition, *_ in outcomes}
    outcomes.extend(
        _copy(settings, plan.topic, p, iter(()))
        for plan in plans
        for p in range(plan.partitions)
        if (plan.topic, p) not in tasked
    )
    errors = sorted(error for *_, error in outcomes if error is not None)
    if errors:
        raise BackfillError(
            f"the copy into {target.member} stopped in {len(errors)} partition(s): "
            + "; ".join(errors)
        )
    copied: dict[str, int] = {plan.topic: 0 for plan in plans}
    present: dict[str, int] = {plan.topic: 0 for plan in plans}
    for topic, _, had, wrote, _ in outcomes:
        present[topic] += had
        copied[topic] += wrote
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
    return CopyResult(copied=copied, present=present, first_seq=first)


def _plan(donor: KafkaEndpoint, upto: Mapping[str, int], timeout: float) -> list[_TopicPlan]:
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
                _TopicPlan(
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


def _survey_target(
    target: KafkaEndpoint, plans: list[_TopicPlan], timeout: float
) -> dict[str, int]:
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


def _create_target(target: KafkaEndpoint, plans: list[_TopicPlan], timeout: float) -> None:
    topics = ClusterTopics(target.properties, timeout)
    existing = topics.partitions()
    for plan in plans:
        if plan.topic not in existing:
            topics.ensure(plan.topic, plan.partitions, plan.config)


def _read_from_first_seq(
    donor: KafkaEndpoint, plans: list[_TopicPlan], first: Mapping[str, int], timeout: float
) -> list[_TopicPlan]:
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


def _donor_frame(
    spark: SparkSession, donor: KafkaEndpoint, plan: _TopicPlan, first: int
) -> DataFrame | None:
    """The donor's planned records of one topic, or None when there is nothing to read."""
    wanted = [p for p in range(plan.partitions) if plan.end[p] > plan.start[p]]
    if first >= plan.next_seq or not wanted:
        return None
    properties = {k: v for k, v in donor.properties.items() if k != "bootstrap.servers"}
    _, unsupported = java_kafka_options(properties)
    if unsupported:
        log.warning("Spark's Kafka client ignores %s of %s", ", ".join(unsupported), donor.member)
    rng = TopicRange(
        donor.member, plan.topic, donor.properties["bootstrap.servers"], properties,
        start={p: plan.start[p] for p in wanted}, end={p: plan.end[p] for p in wanted},
    )  # fmt: skip
    log.info(
        "%s: copying seqs %d to %d from %s (%d partition(s), %d offset(s) to read)",
        plan.topic, first, plan.next_seq - 1, donor.member, plan.partitions, rng.records,
    )  # fmt: skip
    # Milliseconds as a number: a Spark timestamp reaches Python as a local-time datetime.
    return read_range(spark, rng).select(
        "topic", "partition", "offset", "key", "value", "headers",
        F.unix_millis("timestamp").alias("timestamp_ms"),
    )  # fmt: skip


def _bytes(raw: bytes | bytearray | None) -> bytes | None:
    """Spark hands binary columns to Python as bytearray; confluent-kafka wants bytes."""
    return None if raw is None else bytes(raw)


def _copy_partition(settings: _TaskSettings, rows: Iterator[Any]) -> Iterator[_Outcome]:
    """One Spark task: the rows of one donor partition, in offset order."""
    first = next(rows, None)
    if first is None:
        return
    yield _copy(settings, str(first.topic), int(first.partition), itertools.chain([first], rows))


def _copy(settings: _TaskSettings, topic: str, partition: int, rows: Iterator[Any]) -> _Outcome:
    """Copy these rows of one donor partition (with none: fence, count and check what the
    target partition holds)."""
    copier = _PartitionCopier(settings, topic, partition)
    error: str | None = None
    try:
        copier.run(rows)
    except (BackfillError, KafkaException, KafkaUnavailable) as exc:
        copier.abort()
        error = str(exc) if isinstance(exc, BackfillError) else f"{copier.where}: {exc}"
    finally:
        copier.close()
    return (copier.topic, copier.partition, copier.present, copier.copied, error)


class _PartitionCopier:
    def __init__(self, settings: _TaskSettings, topic: str, partition: int) -> None:
        self.settings = settings
        self.topic = topic
        self.partition = partition
        self.where = f"{settings.target}'s {topic}[{partition}]"
        self.next_seq = settings.upto[topic]
        self.first_seq = settings.first[topic]
        self.present = self.copied = 0
        self._pending = self._pending_bytes = self._queued = 0
        self._open = False
        self._errors: list[KafkaError] = []
        transactional_id = f"{settings.transactional_prefix}.{topic}.{partition}"
        self._producer = Producer(
            client_config(
                settings.properties, **PACED_PRODUCER, **{"transactional.id": transactional_id},
                **{"enable.idempotence": True, "acks": "all", "message.max.bytes": 64 << 20},
            )
        )  # fmt: skip

    def run(self, rows: Iterator[Any]) -> None:
        timeout = self.settings.timeout
        self._producer.init_transactions(timeout)  # fences earlier attempts: before the read
        held = self._target_held()
        last = None if held is None else held.last
        if held is not None:
            if held.last >= self.next_seq:
                raise BackfillError(
                    f"{self.where} already holds seq {held.last}, at or above next_seq "
                    f"{self.next_seq}: it was written by something other than this backfill"
                )
            self.present = held.count
        # The target's last record, when it is at or above first_seq, must be found among
        # the donor's (which hold every seq from there on); records below first_seq are
        # outside the range copied, whatever they are.
        matched = last is None or last < self.first_seq
        previous: int | None = None
        for row in rows:
            headers: list[Header] = [(h.key, _bytes(h.value)) for h in row.headers or ()]
            try:
                seq = from_global_record(None, None, headers, 0).seq
            except RecordFormatError as exc:
                raise BackfillError(
                    f"donor {self.settings.donor}'s {self.topic}[{self.partition}] offset "
                    f"{row.offset} is not a kdsync T-global record ({exc})"
                ) from None
            if previous is not None and seq <= previous:
                raise BackfillError(
                    f"donor {self.settings.donor}'s {self.topic}[{self.partition}] offset "
                    f"{row.offset} has seq {seq}, not above the previous record's {previous}: "
                    "its T-global is out of order; run the audit on it"
                )
            previous = seq
            if seq >= self.next_seq:
                break
            if seq < self.first_seq:
                continue
            if last is not None and seq <= last:
                matched = matched or seq == last
                continue
            if not matched:
                break
            self._produce(_bytes(row.key), _bytes(row.value), headers, int(row.timestamp_ms))
        for _ in rows:  # read the partition to its end, as Spark's feeder expects
            pass
        if not matched:
            raise BackfillError(
                f"{self.where} ends at seq {last}, which donor {self.settings.donor}'s "
                "partition does not hold below next_seq: the target holds another history"
            )
        self._commit()

    def _target_held(self) -> _Held | None:
        """The target partition's committed records, read to its end (None: it holds none);
        their seqs must increase. Those below first_seq are not counted."""
        consumer = reading_consumer(
            self.settings.properties, f"{self.settings.transactional_prefix}.reader",
            committed_only=True, fetch_wait_ms=50,
        )  # fmt: skip
        count, last = 0, None
        try:
            for message in read_to_end(
                consumer, self.topic, self.partition, timeout=self.settings.timeout
            ):
                seq = seq_of(message)
                if last is not None and seq <= last:
                    raise BackfillError(
                        f"{self.where} offset {message.offset()} has seq {seq}, not above the "
                        f"previous record's {last}: it was written by something other than "
                        "this backfill"
                    )
                count += seq >= self.first_seq
                last = seq
        except RecordFormatError as exc:
            raise BackfillError(
                f"{self.where} holds a record that is not a kdsync T-global record "
                f"({exc.__cause__ or exc})"
            ) from None
        finally:
            consumer.close()
        return None if last is None else _Held(count, last)

    def _on_delivery(self, error: KafkaError | None, _: Message) -> None:
        if error is not None:
            self._errors.append(error)

    def _produce(
        self, key: bytes | None, value: bytes | None, headers: list[Header], ts: int
    ) -> None:
        if not self._open:
            self._producer.begin_transaction()
            self._open = True
        size = len(key or b"") + len(value or b"") + header_bytes(headers)
        # At most about one batch queued at a time (see kdsync.kafka.produce_pacing).
        if must_flush(self._queued, size):
            self._producer.flush(self.settings.timeout)
            self._queued = 0
        while True:
            try:
                self._producer.produce(
                    self.topic, value=value, key=key, partition=self.partition,
                    on_delivery=self._on_delivery, timestamp=ts,
                    headers=cast(_Headers, headers),
                )  # fmt: skip
                break
            except BufferError:
                self._producer.flush(0.05)
        self._queued += size
        self._pending += 1
        self._pending_bytes += size
        limits = self.settings
        if self._pending >= limits.commit_records or self._pending_bytes >= limits.commit_bytes:
            self._commit()

    def _commit(self) -> None:
        if not self._open:
            return
        remaining = self._producer.flush(self.settings.timeout)
        if self._errors or remaining:
            cause = self._errors[0] if self._errors else f"{remaining} record(s) unacknowledged"
            raise BackfillError(f"writing to {self.where} failed: {cause}")
        self._producer.commit_transaction(self.settings.timeout)
        self._open = False
        self.copied += self._pending
        self._pending = self._pending_bytes = self._queued = 0

    def abort(self) -> None:
        """Abort the open transaction now, so the target's readers are not held up until
        the next run fences it (a fenced or broken producer just stays silent)."""
        if self._open:
            with contextlib.suppress(KafkaException):
                self._producer.abort_transaction(self.settings.timeout)
            self._open = False

    def close(self) -> None:
        self._producer.flush(0)
