"""A data member restarted after trimming its ordering log says where its log topic
starts: a restart forgets ``allDurable``, and its ``/status`` feeds the backfill point of
a new data member, which must not fall below what its log still holds (docs/ordering.md,
"Membership changes")."""

from __future__ import annotations

import uuid

import pytest

from kdsync.kafka.log_store import LogStore
from kdsync.kafka.topics import ClusterTopics
from kdsync.localkafka import LocalKafkaFleet
from kdsync.ordering import (
    Entry,
    GroupSpec,
    HardState,
    LedgerState,
    OrderingNode,
    RecoveredState,
    Timing,
)

pytestmark = pytest.mark.kafka


def _written_log(properties: dict[str, str], group: str, last: int) -> LogStore:
    ClusterTopics(properties, 30).ensure_internal(group)
    store = LogStore(properties, group, "m1")
    store.persist(HardState(term=2), [Entry(i, 2, None) for i in range(1, last + 1)])
    return store


def test_a_log_recovered_after_a_trim_says_where_it_was_trimmed(
    kafka_fleet: LocalKafkaFleet,
) -> None:
    properties = {"bootstrap.servers": kafka_fleet["kafka-1"].bootstrap_servers}
    group = f"trim-{uuid.uuid4().hex[:8]}"
    store = _written_log(properties, group, 20)
    store.trim(12)
    store.close()

    reopened = LogStore(properties, group, "m1")
    recovered = reopened.recover(after=15)
    reopened.close()
    assert recovered.trimmed_below == 12
    assert recovered.hard_state.term == 2, "the hard state survives the trim"
    assert [e.index for e in recovered.entries] == list(range(16, 21))

    ledger = LedgerState(applied_index=15, applied_term=2)
    node = OrderingNode(
        "m1",
        GroupSpec(("m1", "m2", "m3")),
        Timing(),
        1,
        RecoveredState(recovered.hard_state, ledger, recovered.entries, recovered.trimmed_below),
    )
    # Reported in /status as trimmedBelow: the backfill's floor (allDurable is 0 now).
    assert (node.trimmed_below, node.all_durable) == (12, 0)


def test_an_untrimmed_log_claims_nothing(kafka_fleet: LocalKafkaFleet) -> None:
    properties = {"bootstrap.servers": kafka_fleet["kafka-1"].bootstrap_servers}
    group = f"trim-{uuid.uuid4().hex[:8]}"
    _written_log(properties, group, 5).close()

    reopened = LogStore(properties, group, "m1")
    recovered = reopened.recover(after=3)
    reopened.close()
    assert recovered.trimmed_below == 0
    assert [e.index for e in recovered.entries] == [4, 5]
