"""Copy a donor member's ``T-global`` topics into a new member's cluster, below ``next_seq``.

The driver plans the copy and each topic's first seq ``S`` (:mod:`kdsync.backfill.copy_plan`).
Spark's Kafka source (:func:`kdsync.audit.reader.read_range`, one Spark partition per Kafka
partition, so offset order is kept) then feeds one Python task per partition, which writes
the records into the same partition of the target with a transactional producer whose id
names that partition.

A task calls ``init_transactions`` first: that fences any earlier attempt at the same
partition (a crashed run, a retried or speculative Spark task) and aborts what it left
open. Only then does it read the target partition's committed records (how many from ``S``
on, and the highest ``kdsync.seq``), so nothing of an earlier attempt can commit after that
read, and skip the donor's records below ``S`` and up to that highest one. Transactions
commit every ``COMMIT_RECORDS`` records or ``COMMIT_BYTES``: a run killed at any moment
leaves a committed prefix, and the next run continues after it. Afterwards each target topic
must hold as many records as there are seqs from ``S`` to ``next_seq``, all of them readable
by ``read_committed`` readers when the copy returns.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdsync.audit.kafka_options import java_kafka_options
from kdsync.audit.positions import TopicRange
from kdsync.audit.reader import read_range
from kdsync.backfill.copy_plan import (
    BackfillError,
    KafkaEndpoint,
    TopicPlan,
    check_complete,
    plan_copy,
)
from kdsync.failover.kafka_io import seq_of
from kdsync.kafka.client_config import client_config
from kdsync.kafka.errors import KafkaUnavailable
from kdsync.kafka.partition_reader import (
    read_to_end,
    reading_consumer,
    wait_until_committed_readable,
)
from kdsync.kafka.produce_pacing import PACED_PRODUCER, must_flush
from kdsync.ordering.events import Header, header_bytes
from kdsync.record_format import RecordFormatError, from_global_record

__all__ = [
    "COMMIT_BYTES",
    "COMMIT_RECORDS",
    "BackfillError",
    "CopyResult",
    "KafkaEndpoint",
    "copy_global_topics",
]

log = logging.getLogger("kdsync.backfill")

COMMIT_RECORDS = 5_000
COMMIT_BYTES = 8 * 1024 * 1024
# What confluent-kafka's produce() takes as headers.
_Headers = list[tuple[str, str | bytes | None]]
# One task's outcome: (topic, partition, present, copied, error or None).
_Outcome = tuple[str, int, int, int, str | None]


@dataclass(frozen=True)
class CopyResult:
    copied: dict[str, int]  # global topic -> records written by this run
    present: dict[str, int]  # global topic -> records already there before this run
    # Global topic -> the seq from which the target's topic holds every seq below next_seq
    # (records below it, left by an earlier run, are not counted in present).
    first_seq: dict[str, int]


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
    plans, first = plan_copy(donor, target, upto, timeout)
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
    check_complete(donor, target, plans, first, present, copied)
    return CopyResult(copied=copied, present=present, first_seq=first)


def _donor_frame(
    spark: SparkSession, donor: KafkaEndpoint, plan: TopicPlan, first: int
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
        # The commit returns before its markers reach the partition; until they do, a
        # read_committed reader (the new member's sidecar, the audit) ends before the last
        # transaction's records. The copy is done when they are readable (also when this
        # run copied nothing: an earlier one may have stopped in this wait).
        wait_until_committed_readable(
            self.settings.properties, f"{self.settings.transactional_prefix}.reader",
            self.topic, self.partition, self.settings.timeout,
        )  # fmt: skip

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
