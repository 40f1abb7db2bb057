"""The Kafka side of failover: reading ``T-global`` positions and consumer group offsets.

A read_committed consumer (assign only: it joins no group and commits nothing) reads
``kdsync.seq`` headers; an admin client reads and writes the group's committed offsets and
tells whether the group has members. Everything blocks, with timeouts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from kdsync.failover.translation import Located
from kdsync.kafka.client_config import admin_config
from kdsync.kafka.errors import KafkaUnavailable
from kdsync.kafka.partition_reader import (
    read_available,
    read_to_end,
    reading_consumer,
    watermarks,
)
from kdsync.record_format import RecordFormatError, from_global_record

# Records per probe: one fetch's worth, so a bisection step costs one round trip.
_RUN = 500
_FIRST_WINDOW = 64


def seq_of(message: Message) -> int:
    _, timestamp = message.timestamp()
    raw = message.headers() or []
    # Consumed records carry a list of (name, value) pairs; the type also allows a dict.
    headers = list(raw.items()) if isinstance(raw, dict) else raw
    try:
        return from_global_record(message.key(), message.value(), headers, max(timestamp, 0)).seq
    except RecordFormatError as exc:
        raise RecordFormatError(
            f"{message.topic()}[{message.partition()}] offset {message.offset()} is not a "
            f"kdsync T-global record ({exc}); failover translates T-global topics only"
        ) from exc


class KafkaPartitionLog:
    """One ``T-global`` partition of one cluster, read committed (a ``PartitionLog``)."""

    def __init__(
        self, consumer: Consumer, topic: str, partition: int, timeout: float = 30.0
    ) -> None:
        self._consumer = consumer
        self.topic = topic
        self.partition = partition
        self._timeout = timeout

    def bounds(self) -> tuple[int, int]:
        return watermarks(self._consumer, self.topic, self.partition, self._timeout)

    def read_from(self, offset: int) -> Sequence[Located]:
        consumer = self._consumer
        # An offset below the log start is out of range: auto.offset.reset=earliest then
        # starts at the first retained record, which is what "at or after" means here.
        consumer.assign([TopicPartition(self.topic, self.partition, offset)])
        deadline = time.monotonic() + self._timeout
        try:
            while True:
                found: list[Located] = []
                at_end = False
                batch = read_available(consumer, wait_seconds=1.0, max_records=_RUN + 1)
                for message in batch:
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            at_end = True
                            continue
                        raise KafkaUnavailable(
                            f"reading {self.topic}[{self.partition}] failed: {error}"
                        )
                    where = message.offset()
                    if where is None or where < offset:
                        continue
                    found.append(Located(where, seq_of(message)))
                if found:
                    return found
                if at_end:
                    return ()
                if time.monotonic() > deadline:
                    raise KafkaUnavailable(
                        f"reading {self.topic}[{self.partition}] from offset {offset} stalled "
                        f"for {self._timeout:.0f}s"
                    )
        finally:
            consumer.unassign()

    def last_before(self, offset: int) -> Located | None:
        low, _ = self.bounds()
        window = _FIRST_WINDOW
        while True:
            start = max(low, offset - window)
            last: Located | None = None
            for message in read_to_end(
                self._consumer, self.topic, self.partition, start, offset, self._timeout
            ):
                where = message.offset()
                if where is not None and where < offset:
                    last = Located(where, seq_of(message))
            if last is not None or start <= low:
                return last
            window *= 8


class ClusterClients:
    """An admin client and a reading consumer for one member's cluster."""

    def __init__(self, name: str, properties: Mapping[str, str], timeout: float = 30.0) -> None:
        self.name = name
        self._timeout = timeout
        self._servers = properties.get("bootstrap.servers", "?")
        self.admin = AdminClient(admin_config(properties))
        # Translation probes often read at a log's end (a group that has read everything):
        # the broker then answers after fetch.wait.max.ms, so keep that short.
        self.consumer = reading_consumer(
            properties, "kdsync-failover-reader", committed_only=True, fetch_wait_ms=50
        )

    def close(self) -> None:
        self.consumer.close()

    def partition_log(self, topic: str, partition: int) -> KafkaPartitionLog:
        return KafkaPartitionLog(self.consumer, topic, partition, self._timeout)

    def _unavailable(self, what: str, exc: Exception) -> KafkaUnavailable:
        return KafkaUnavailable(
            f"{what} in {self.name} ({self._servers}) failed: {exc}. Fix: check that the "
            "cluster is reachable with the member's kafka settings in the config"
        )

    def group_ids(self) -> list[str]:
        """Every consumer group the cluster knows (with members or only offsets)."""
        try:
            result = self.admin.list_consumer_groups(request_timeout=self._timeout).result(
                timeout=self._timeout
            )
        except KafkaException as exc:
            raise self._unavailable("listing consumer groups", exc) from exc
        return sorted(listing.group_id for listing in result.valid or [])

    def committed_offsets(self, group: str) -> dict[tuple[str, int], int]:
        """The group's committed offsets (partitions without one are left out)."""
        request = [ConsumerGroupTopicPartitions(group)]
        try:
            futures = self.admin.list_consumer_group_offsets(request, request_timeout=self._timeout)
            result = futures[group].result(timeout=self._timeout)
        except KafkaException as exc:
            raise self._unavailable(f"reading the offsets of consumer group {group}", exc) from exc
        offsets: dict[tuple[str, int], int] = {}
        for tp in result.topic_partitions or []:
            if tp.error is None and tp.offset >= 0:
                offsets[(tp.topic, tp.partition)] = tp.offset
        return offsets

    def active_members(self, group: str) -> list[str]:
        """The group's members (client id @ host), empty when nobody consumes with it."""
        try:
            futures = self.admin.describe_consumer_groups([group], request_timeout=self._timeout)
            description = futures[group].result(timeout=self._timeout)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError.GROUP_ID_NOT_FOUND:
                return []
            raise self._unavailable(f"describing consumer group {group}", exc) from exc
        return [f"{m.client_id}@{m.host}" for m in description.members or []]

    def partition_count(self, topic: str) -> int | None:
        try:
            metadata = self.admin.list_topics(topic=topic, timeout=self._timeout)
        except KafkaException as exc:
            raise self._unavailable(f"looking up topic {topic}", exc) from exc
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            return None
        return len(found.partitions)

    def write_offsets(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        request = [
            ConsumerGroupTopicPartitions(
                group, [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())]
            )
        ]
        try:
            futures = self.admin.alter_consumer_group_offsets(
                request, request_timeout=self._timeout
            )
            result = futures[group].result(timeout=self._timeout)
        except KafkaException as exc:
            raise self._unavailable(f"writing the offsets of consumer group {group}", exc) from exc
        failed = [tp for tp in result.topic_partitions or [] if tp.error is not None]
        if failed:
            raise KafkaUnavailable(
                f"{self.name} refused offsets of consumer group {group}: "
                + ", ".join(f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in failed)
            )
