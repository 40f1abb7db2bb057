"""Writes deliveries to ``T-global`` in Kafka transactions, with the ledger and offsets.

One transaction carries, for a run of applied log entries: every delivered event as a
``T-global`` record and the delivery ledger after them (``kdsync-<group>.ledger.internal``),
whose marks include this member's own source positions. They become visible together or
not at all, which is what makes a restart exactly-once: the ledger read back after a
crash describes exactly what ``T-global`` holds, and says where to resume reading.

The consumer group ``kdsync-<group>`` gets the same positions committed *after* the
transaction, for lag monitoring and the audit; a crash between the two only leaves
the group's offsets behind, never ahead of what ``T-global`` holds. (Sending them inside
the transaction cost seconds per commit against Kafka 4.3 here, see docs/operations.md.)

The transactional id is ``kdsync-<group>.<member>``: a second instance of the same member
fences the first (Kafka aborts the zombie's open transaction and refuses its writes).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from kdsync import naming
from kdsync.kafka.client_config import client_config
from kdsync.kafka.errors import (
    BackfillPending,
    CommitOutcomeUnknown,
    GlobalTopicLost,
    KafkaUnavailable,
    ProducerFenced,
    RecordTooLarge,
)
from kdsync.kafka.ledger_reader import (
    LEDGER_KEY,
    first_seqs,
    read_latest_ledger,
    read_seeding,
)
from kdsync.kafka.partition_reader import reading_consumer, watermarks
from kdsync.kafka.produce_pacing import PACED_PRODUCER, fixed_record_bytes, must_flush
from kdsync.ordering import Delivery, LedgerState
from kdsync.ordering.events import Header, header_bytes
from kdsync.record_format import global_headers, global_partition, origin_headers
from kdsync.wire_format.records import encode_ledger_state

log = logging.getLogger(__name__)

# How often a T-global's end offsets are compared with the ledger (see _check_history).
_HISTORY_CHECK_SECONDS = 5.0
# How long a commit under way is waited on (a broker restart takes seconds to tens of
# seconds); as long as an ordering-log write may stay unacknowledged before the member
# stops anyway.
COMMIT_RETRY_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class CommitResult:
    events: int
    seconds: float
    # (origin timestamp ms, commit wall time ms) are derived by the caller from deliveries.


GlobalTopicFor = Callable[[str], str]
# What confluent-kafka's produce() is typed to take (our headers' values are all bytes).
ProducedHeaders = list[tuple[str, str | bytes | None]]


class GlobalWriter:
    def __init__(
        self,
        properties: Mapping[str, str],
        group: str,
        member: str,
        global_topic: GlobalTopicFor,
        global_partitions: Callable[[str], int],
        timeout: float = 60.0,
    ) -> None:
        self._properties = dict(properties)
        self._group = group
        self._member = member
        self._global_topic = global_topic
        self._global_partitions = global_partitions
        self._timeout = timeout
        self._ledger_topic = naming.ledger_topic(group)
        self._producer = Producer(
            client_config(
                self._properties,
                **{
                    "transactional.id": naming.transactional_id(group, member),
                    "enable.idempotence": True,
                    "acks": "all",
                    **PACED_PRODUCER,
                    "message.max.bytes": 64 * 1024 * 1024,
                    "transaction.timeout.ms": 120_000,
                    "client.id": f"kdsync-{group}-{member}-global",
                },
            )
        )
        self._errors: list[tuple[KafkaError, str, int]] = []  # (error, topic, record size)
        # When each T-global's end offsets were last checked against the ledger.
        self._history_checked: dict[str, float] = {}
        self._offsets_reader: Consumer | None = None
        # Source topic -> first seq of this member's T-global (kafka.ledger_reader).
        self._first_seq: dict[str, int] = {}

    def start(self) -> LedgerState:
        """Fence older instances, then read the ledger they left (blocking). A member whose
        backfill has not finished is refused before it fences anything: fencing would
        abort the backfill's own last write (kafka.errors.BackfillPending)."""
        self._read_ledger()
        try:
            self._producer.init_transactions(self._timeout)
        except KafkaException as exc:
            txn_id = naming.transactional_id(self._group, self._member)
            raise KafkaUnavailable(
                f"cannot start a Kafka transaction as {txn_id}: "
                f"{exc.args[0] if exc.args else exc}. Fix: check that the brokers are reachable, "
                "that transactions are allowed (transaction.state.log.* settings) and that the "
                "principal may use this transactional id"
            ) from exc
        return self._read_ledger()

    def _read_ledger(self) -> LedgerState:
        consumer = reading_consumer(
            self._properties,
            f"{naming.consumer_group(self._group)}.{self._member}.ledger-reader",
            committed_only=True,
        )
        try:
            ledger = read_latest_ledger(consumer, self._ledger_topic, self._timeout)
            seeding = read_seeding(consumer, self._ledger_topic, self._timeout)
            if ledger is None and seeding.started:
                raise BackfillPending(self._member)
            self._first_seq = first_seqs(seeding.handover)
            return ledger or LedgerState()
        finally:
            consumer.close()

    def write(self, deliveries: Sequence[Delivery], ledger: LedgerState) -> CommitResult:
        """Commit ``deliveries`` and ``ledger`` in one transaction (blocking).

        Raises RecordTooLarge (halt until the topic accepts it), ProducerFenced (stop) or
        KafkaUnavailable (retry later). On any error the transaction is aborted: nothing
        of it becomes visible.
        """
        started = time.monotonic()
        producer = self._producer
        self._errors = []
        events = 0
        # Topic names and partition counts are resolved before the transaction begins
        # (creating a T-global on first use is an admin round trip), once per topic.
        targets: dict[str, tuple[str, int]] = {}
        for delivery in deliveries:
            where = delivery.origin_partition
            if delivery.events and where is not None and where[1] not in targets:
                targets[where[1]] = (
                    self._global_topic(where[1]),
                    self._global_partitions(where[1]),
                )
        self._check_history(deliveries, ledger)
        try:
            producer.begin_transaction()
            # The hot loop: per event only the headers list and librdkafka's produce().
            # Everything shared by a delivery (one origin partition) is made once.
            produce = producer.produce
            on_delivery = self._on_delivery
            # (T-global, partition) -> bytes produced to it since the last flush, about
            queued: dict[tuple[str, int], int] = {}
            for delivery in deliveries:
                where = delivery.origin_partition
                if not delivery.events or where is None:
                    continue
                origin, source_topic, source_partition = where
                topic, partitions = targets[source_topic]
                partition = global_partition(source_partition, partitions)
                shared = origin_headers(origin, source_topic, source_partition)
                fixed = fixed_record_bytes(shared)
                held = queued.get((topic, partition), 0)
                for delivered in delivery.events:
                    event = delivered.event
                    # One batch per partition at a time (kdsync.kafka.produce_pacing).
                    size = fixed + len(event.value or b"") + len(event.key or b"")
                    if event.headers:
                        size += header_bytes(event.headers)
                    if must_flush(held, size):
                        self._wait_for_batches()
                        queued.clear()
                        held = 0
                    held += size
                    headers = global_headers(event, delivered.seq, shared)
                    try:
                        # Timestamp 0 means "now" to the client; the record format says so.
                        produce(
                            topic,
                            event.value,
                            event.key,
                            partition,
                            on_delivery=on_delivery,
                            timestamp=event.timestamp_ms,
                            headers=cast(ProducedHeaders, headers),
                        )
                    except (BufferError, KafkaException):
                        self._produce(
                            topic, partition, event.key, event.value, headers, event.timestamp_ms
                        )
                queued[(topic, partition)] = held
                events += len(delivery.events)
            self._produce(self._ledger_topic, 0, LEDGER_KEY, encode_ledger_state(ledger), None, 0)
            self._commit()
        except RecordTooLarge:
            self._abort()
            raise
        except KafkaException as exc:
            self._fail(exc)
        return CommitResult(events, time.monotonic() - started)

    def _check_history(self, deliveries: Sequence[Delivery], ledger: LedgerState) -> None:
        """Raise GlobalTopicLost when a ``T-global`` ends below what was committed to it.

        Every event of the global stream takes one offset in each member's ``T-global``,
        and a log's end offset never goes down (retention moves its start), so an intact
        topic ends at or past the ledger's sequence count. Every ``T-global`` the ledger
        knows is checked on first use and then every ``_HISTORY_CHECK_SECONDS`` (one
        offsets request per partition), whatever this transaction writes to: heartbeats
        keep transactions coming when a topic has no traffic."""
        now = time.monotonic()
        writing: dict[str, int] = {}
        for delivery in deliveries:
            if delivery.origin_partition is not None:
                source_topic = delivery.origin_partition[1]
                writing[source_topic] = writing.get(source_topic, 0) + len(delivery.events)
        for source_topic, next_seq in ledger.next_seq.items():
            # A member seeded by a backfill holds its T-global from its hand-over's first
            # seq on (a donor trimmed by retention; heartbeats are not copied).
            first = self._first_seq.get(source_topic, 0)
            committed = next_seq - writing.get(source_topic, 0) - first
            topic = self._global_topic(source_topic)
            if (
                committed <= 0
                or now < self._history_checked.get(topic, 0.0) + _HISTORY_CHECK_SECONDS
            ):
                continue
            partitions = self._global_partitions(source_topic)
            if self._offsets_reader is None:
                # The log end, not the last stable offset: commit_transaction returns once
                # the coordinator has decided, and the markers reach the partitions after
                # that, so a read_committed end can still stand before the transaction just
                # committed and look like a lost topic. The records themselves were
                # acknowledged (acks=all) before the commit, so the log end counts them.
                self._offsets_reader = reading_consumer(
                    self._properties,
                    f"{naming.consumer_group(self._group)}.{self._member}.history-check",
                    committed_only=False,
                )
            ends = 0
            for partition in range(partitions):
                try:
                    _, high = watermarks(self._offsets_reader, topic, partition, self._timeout)
                except KafkaUnavailable as exc:
                    if _is_unknown_topic(exc.__cause__):
                        raise GlobalTopicLost(
                            topic,
                            f"does not exist any more, but this member has committed "
                            f"{committed} events to it: it was deleted, or "
                            "topics.globalSuffix was changed (a T-global is not renamed "
                            "on a running group: docs/sidecar.md, source topics)",
                        ) from exc
                    raise
                ends += high
            if ends < committed:
                raise GlobalTopicLost(
                    topic,
                    f"ends at offset {ends} (summed over its {partitions} partition(s)), but "
                    f"this member has committed {committed} events to it: the topic was "
                    "deleted and recreated (or deleted while this member was down, and "
                    "created again empty), or topics.globalSuffix was changed (a T-global "
                    "is not renamed on a running group: docs/sidecar.md, source topics)",
                )
            self._history_checked[topic] = now

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self._errors.append((error, message.topic() or "?", _record_size(message)))

    def _produce(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[Header] | None,
        timestamp_ms: int,
    ) -> None:
        """Produce one record, waiting while the client's queue is full (the slow path)."""
        while True:
            try:
                self._producer.produce(
                    topic,
                    value=value,
                    key=key,
                    partition=partition,
                    on_delivery=self._on_delivery,
                    timestamp=timestamp_ms,
                    headers=cast(ProducedHeaders | None, headers),
                )
                return
            except BufferError:
                # flush, not poll: with the long linger a half-full batch would wait.
                self._producer.flush(0.05)
            except KafkaException as exc:
                error = _kafka_error(exc)
                if error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    size = len(key or b"") + len(value or b"")
                    size += header_bytes(headers or ())
                    raise RecordTooLarge(topic, size, "over the producer's limit") from exc
                raise

    def _wait_for_batches(self) -> None:
        """Wait until every record produced so far is acknowledged (within a transaction).
        Records still unacknowledged fail the transaction like a failed commit (``_fail``:
        aborted, with the records' own errors if they had any)."""
        remaining = self._producer.flush(self._timeout)
        if remaining:
            raise KafkaException(
                KafkaError(
                    KafkaError._TIMED_OUT,
                    f"{remaining} record(s) still unacknowledged after {self._timeout:.0f}s",
                )
            )

    def _commit(self) -> None:
        """``commit_transaction``, called again while librdkafka says the same call may be
        retried (its coordinator away past the timeout, e.g. a broker restarting). The
        commit is then still under way: aborting would be refused (``_CONFLICT``) and
        leave the producer wedged, and the commit may already have happened. Still
        unsettled ``COMMIT_RETRY_SECONDS`` after the first timeout, the outcome is unknown
        and the member stops (see ``CommitOutcomeUnknown``)."""
        deadline: float | None = None  # from the first timeout on
        while True:
            try:
                self._producer.commit_transaction(self._timeout)
                return
            except KafkaException as exc:
                error = _kafka_error(exc)
                if error is None or not error.retriable() or error.txn_requires_abort():
                    raise
                now = time.monotonic()
                deadline = deadline or now + COMMIT_RETRY_SECONDS
                if now >= deadline:
                    raise CommitOutcomeUnknown(
                        "committing a transaction to T-global was still unsettled "
                        f"{COMMIT_RETRY_SECONDS:.0f}s after it timed out ({error}); its "
                        "records may or may not be there, so this member stops rather than "
                        "write them again. A restart settles the transaction and reads the "
                        "ledger back"
                    ) from exc
                log.warning("committing a transaction is taking long (%s); waiting on it", error)

    def _fail(self, exc: KafkaException) -> None:
        error = _kafka_error(exc)
        too_large = [e for e in self._errors if e[0].code() == KafkaError.MSG_SIZE_TOO_LARGE]
        if error is not None and error.fatal():
            raise ProducerFenced(
                f"this member's transactional producer was fenced or failed fatally ({error}); "
                "another instance of this member is probably running. This one stops"
            ) from exc
        self._abort()
        if too_large:
            first, topic, size = max(too_large, key=lambda e: e[2])
            raise RecordTooLarge(topic, size, first.str()) from exc
        cause = self._errors[0][0] if self._errors else error or exc
        raise KafkaUnavailable(
            f"a transaction to T-global failed and was aborted: {cause}"
        ) from exc

    def _abort(self) -> None:
        try:
            self._producer.abort_transaction(self._timeout)
        except KafkaException as exc:
            error = _kafka_error(exc)
            if error is not None and error.fatal():
                raise ProducerFenced(f"aborting failed fatally: {error}") from exc
            log.warning("aborting a transaction failed: %s", exc)

    def close(self) -> None:
        """Abort an open transaction (if any) so nothing half-written lingers."""
        with contextlib.suppress(KafkaException):
            self._producer.abort_transaction(5.0)
        self._producer.flush(5.0)
        if self._offsets_reader is not None:
            self._offsets_reader.close()


def _record_size(message: Message) -> int:
    """Key, value and header bytes of a record, as the size limits count them."""
    size = len(message.key() or b"") + len(message.value() or b"")
    headers = message.headers() or []
    for name, value in headers.items() if isinstance(headers, dict) else headers:
        size += len(name) + len(value or b"")
    return size


def _kafka_error(exc: BaseException | None) -> KafkaError | None:
    """The KafkaError a KafkaException carries, if any."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def _is_unknown_topic(cause: BaseException | None) -> bool:
    error = _kafka_error(cause)
    return error is not None and error.code() in (
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
    )
