"""The topics a member's cluster needs: internal topics, ``T-global`` and the sources.

Topics are created when missing and never deleted: the data outlives the group. Configs
of topics that already exist are left alone here, so an operator's tuning is respected;
only ``T-global``'s are held to a rule afterwards (``global_topic_check``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

# Where the class is defined: confluent_kafka.admin re-exports it without __all__.
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.cimpl import NewTopic

from kdsync import naming
from kdsync.kafka import global_topic_rule
from kdsync.kafka.client_config import admin_config
from kdsync.kafka.errors import KafkaUnavailable

log = logging.getLogger(__name__)

# The internal log holds whole batches (up to maxBatchBytes plus one event), so its
# records may be larger than user records. It is trimmed by kdsync, not by time.
LOG_TOPIC_CONFIG = {
    "cleanup.policy": "delete",
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "max.message.bytes": str(64 * 1024 * 1024),
}
# The ledger is one small record per transaction; compaction keeps the latest.
LEDGER_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "retention.ms": "-1",
    "segment.bytes": str(16 * 1024 * 1024),
    "segment.ms": "3600000",
    "min.cleanable.dirty.ratio": "0.1",
    "max.message.bytes": str(16 * 1024 * 1024),
}
# T-global keeps every event (no compaction: the audit checks that each one is there);
# its configs follow one rule in every member, checked while the sidecar runs.
GLOBAL_TOPIC_CONFIG = dict(global_topic_rule.CREATE_CONFIG)

SelectsTopic = Callable[[str], bool]


class ClusterTopics:
    """Admin operations on one member's cluster."""

    def __init__(self, properties: Mapping[str, str], timeout: float = 30.0) -> None:
        self._admin = AdminClient(admin_config(properties))
        self._timeout = timeout
        self._servers = properties.get("bootstrap.servers", "?")
        self._known: set[str] = set()

    def partitions(self) -> dict[str, int]:
        """Every topic in the cluster with its partition count."""
        try:
            metadata = self._admin.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            raise KafkaUnavailable(
                f"cannot reach Kafka at {self._servers} within {self._timeout:.0f}s ({exc}). "
                "Fix: check kafka.bootstrapServers and that the brokers are up and "
                "reachable from here, and the security properties (SSL/SASL)"
            ) from exc
        return {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None
        }

    def source_partitions(self, selects: SelectsTopic) -> dict[str, int]:
        """Selected source topics (never internal or global ones) and their partitions."""
        return {
            name: count
            for name, count in self.partitions().items()
            if selects(name) and not naming.is_internal_topic(name) and not name.startswith("__")
        }

    def committed_ends(
        self, partitions: list[tuple[str, int]], timeout: float = 5.0
    ) -> dict[tuple[str, int], int]:
        """The last stable offset of each partition: where a read_committed reader can
        read to now. Asked through the admin client, independently of any consumer.
        Raises KafkaException when the brokers do not answer within ``timeout``."""
        return self._list_offsets(partitions, OffsetSpec.latest(), timeout)  # type: ignore[no-untyped-call]

    def earliest_offsets(
        self, partitions: list[tuple[str, int]], timeout: float = 5.0
    ) -> dict[tuple[str, int], int]:
        """The first offset each partition still holds (retention deletes below it)."""
        return self._list_offsets(partitions, OffsetSpec.earliest(), timeout)  # type: ignore[no-untyped-call]

    def _list_offsets(
        self, partitions: list[tuple[str, int]], spec: OffsetSpec, timeout: float
    ) -> dict[tuple[str, int], int]:
        futures = self._admin.list_offsets(
            {TopicPartition(t, p): spec for t, p in partitions},
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=timeout,
        )
        return {
            (tp.topic, tp.partition): int(future.result(timeout=timeout).offset)
            for tp, future in futures.items()
        }

    def ensure(self, name: str, partitions: int, config: Mapping[str, str]) -> None:
        """Create ``name`` unless it exists (created concurrently elsewhere is fine)."""
        if name in self._known:
            return
        if name in self.partitions():
            self._known.add(name)
            return
        topic = NewTopic(
            name, num_partitions=partitions, replication_factor=-1, config=dict(config)
        )
        futures = self._admin.create_topics([topic], operation_timeout=self._timeout)
        try:
            futures[name].result(timeout=self._timeout)
            log.info("created topic %s (%d partition(s))", name, partitions)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not (
                isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS
            ):
                raise KafkaUnavailable(
                    f"cannot create topic {name} at {self._servers}: {exc}"
                ) from exc
        self._wait_visible(name)
        self._known.add(name)

    def _wait_visible(self, name: str) -> None:
        # A new topic reaches the metadata of every broker a moment after creation;
        # clients that look it up before then see "unknown partition".
        deadline = time.monotonic() + self._timeout
        while name not in self.partitions():
            if time.monotonic() > deadline:
                raise KafkaUnavailable(f"topic {name} was created but never became visible")
            time.sleep(0.1)

    def ensure_internal(self, group: str) -> None:
        self.ensure(naming.log_topic(group), 1, LOG_TOPIC_CONFIG)
        self.ensure(naming.ledger_topic(group), 1, LEDGER_TOPIC_CONFIG)

    def ensure_global(self, name: str, partitions: int) -> None:
        self.ensure(name, partitions, GLOBAL_TOPIC_CONFIG)

    def global_partition_count(self, name: str) -> int | None:
        return self.partitions().get(name)
