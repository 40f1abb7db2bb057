"""A data member's own Kafka cluster, opened for a sidecar: topics, fencing, recovery.

Opening is the start-up sequence of docs/ordering.md: create the internal topics, fence
any older instance of this member (``initTransactions``), read the ledger (exactly what
``T-global`` holds), read the durable log back after the applied index, and open the
source reader at the ledger's marks. All blocking; the runtime calls it in a thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kdsync.kafka.client_config import check_client_properties
from kdsync.kafka.connection_check import check_connection
from kdsync.kafka.errors import KafkaUnavailable
from kdsync.kafka.global_writer import GlobalWriter
from kdsync.kafka.log_store import LogStore
from kdsync.kafka.source_reader import SourceReader
from kdsync.kafka.topics import ClusterTopics
from kdsync.ordering import RecoveredState

log = logging.getLogger(__name__)


class GlobalPartitions:
    """Partition counts of the ``T-global`` topics, created on first use and cached.

    Partitioning must be identical in every member's cluster (records of a seq go to the
    same partition everywhere), so an existing topic with another count stops delivery.
    """

    def __init__(
        self, topics: ClusterTopics, global_topic: Callable[[str], str], wanted: int
    ) -> None:
        self._topics = topics
        self._global_topic = global_topic
        self._wanted = wanted
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, source_topic: str) -> int:
        count = self._counts.get(source_topic)
        if count is not None:
            return count
        with self._lock:
            name = self._global_topic(source_topic)
            wanted = self._wanted
            self._topics.ensure_global(name, wanted)
            existing = self._topics.global_partition_count(name) or wanted
            if existing != wanted:
                raise KafkaUnavailable(
                    f"{name} has {existing} partition(s) but topics.globalPartitions is "
                    f"{wanted}. Fix: make them equal in every member cluster"
                )
            self._counts[source_topic] = existing
            return existing


@dataclass
class MemberCluster:
    topics: ClusterTopics
    writer: GlobalWriter
    reader: SourceReader
    log_store: LogStore
    recovered: RecoveredState

    def close(self) -> None:
        self.reader.stop()
        self.writer.close()
        self.log_store.close()


@dataclass(frozen=True)
class MemberClusterSettings:
    """What opening a member's cluster needs from its configuration."""

    properties: Mapping[str, str]  # librdkafka client properties
    group: str
    member: str
    global_topic: Callable[[str], str]  # T -> T-global
    global_partitions: int
    selects: Callable[[str], bool]  # which topics are sources
    max_batch_events: int
    max_batch_bytes: int
    source_linger_ms: int


def open_member_cluster(
    settings: MemberClusterSettings, on_batches: Callable[[], None]
) -> MemberCluster:
    """Create topics, fence older instances, read ledger and log back (blocking)."""
    properties = settings.properties
    check_client_properties(properties)
    # Fails early, with the fix, if the cluster is unreachable or refuses the login/TLS.
    check_connection(properties)
    topics = ClusterTopics(properties)
    topics.ensure_internal(settings.group)
    partitions = GlobalPartitions(topics, settings.global_topic, settings.global_partitions)
    writer = GlobalWriter(
        properties, settings.group, settings.member, settings.global_topic, partitions.count
    )
    ledger = writer.start()
    reader = SourceReader(
        properties,
        settings.group,
        settings.member,
        topics,
        settings.selects,
        ledger.positions_of(settings.member),
        settings.max_batch_events,
        settings.max_batch_bytes,
        on_batches,
        linger_ms=settings.source_linger_ms,
    )
    log_store = LogStore(properties, settings.group, settings.member)
    recovered_log = log_store.recover(ledger.applied_index)
    log.info(
        "recovered: term %d, applied index %d, %d unapplied log entries, %d origin partitions",
        recovered_log.hard_state.term,
        ledger.applied_index,
        len(recovered_log.entries),
        len(ledger.marks),
    )
    recovered = RecoveredState(
        recovered_log.hard_state, ledger, recovered_log.entries, recovered_log.trimmed_below
    )
    return MemberCluster(topics, writer, reader, log_store, recovered)
