"""The state a new data member starts from: the donor's ledger at the backfill point
(``kdsync.backfill_point`` says which point, and why), written to the new member's cluster
after its ``T-global`` was copied up to it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from confluent_kafka import KafkaException, Producer

from kdsync import naming
from kdsync.config import MemberConfig
from kdsync.kafka.client_config import client_config
from kdsync.kafka.errors import KafkaUnavailable
from kdsync.kafka.ledger_reader import (
    BACKFILL_KEY,
    HANDOVER_KEY,
    LEDGER_KEY,
    read_latest_ledger,
    read_seeding,
)
from kdsync.kafka.partition_reader import reading_consumer, wait_until_committed_readable
from kdsync.kafka.topics import ClusterTopics
from kdsync.ordering import Configuration, LedgerState
from kdsync.wire_format.records import encode_ledger_state


class SeedingError(RuntimeError):
    """The backfill cannot go on (the message names the member and the fix)."""


def seed_ledger(ledger: LedgerState, startup: Configuration) -> LedgerState:
    """The ledger the new member starts from: the donor's, which says the configuration in
    force at K (``startup``, the group's seed, when no change was applied by then). The new
    member must not take its own file, which names it, for the group it joins."""
    if ledger.config is not None:
        return ledger
    return replace(ledger, config=startup, config_index=0)


@dataclass(frozen=True)
class MemberState:
    ledger: LedgerState | None  # its latest ledger (None: none yet)
    seeding_started: bool  # a backfill's marker is there


def read_state(member: MemberConfig, group: str, timeout: float) -> MemberState:
    """``member``'s latest delivery ledger, and whether a backfill began seeding it."""
    assert member.kafka is not None
    properties = member.kafka.client_properties()
    topic = naming.ledger_topic(group)
    try:
        if topic not in ClusterTopics(properties, timeout).partitions():
            return MemberState(None, False)
        consumer = reading_consumer(
            properties, f"{naming.consumer_group(group)}.backfill-reader", committed_only=True
        )
        try:
            ledger = read_latest_ledger(consumer, topic, timeout)
            return MemberState(ledger, read_seeding(consumer, topic, timeout).started)
        finally:
            consumer.close()
    except KafkaUnavailable as error:
        raise SeedingError(
            f"member {member.name}: cannot read its ledger {topic}: {error}; check that its "
            "Kafka cluster is up and members[].kafka in the new member's config"
        ) from None


def write_marker(target: MemberConfig, group: str, timeout: float = 30.0) -> None:
    """Mark ``target``'s cluster as being seeded, before anything is copied: its sidecar
    refuses to start until the ledger follows (``kafka.errors.BackfillPending``). Written
    with the member's own transactional id, which fences a sidecar started too early."""
    _write(target, group, [(BACKFILL_KEY, b"{}")], timeout)


def write_seed(
    target: MemberConfig,
    group: str,
    ledger: LedgerState,
    handover: Mapping[str, Any],
    timeout: float = 30.0,
) -> None:
    """Write the new member's first ledger and the hand-over record, in one transaction,
    after its ``T-global`` holds everything below the ledger's sequence numbers."""
    record = json.dumps(dict(handover), sort_keys=True).encode()
    _write(
        target, group, [(HANDOVER_KEY, record), (LEDGER_KEY, encode_ledger_state(ledger))], timeout
    )


def _write(
    target: MemberConfig, group: str, records: Sequence[tuple[bytes, bytes]], timeout: float
) -> None:
    assert target.kafka is not None
    properties = target.kafka.client_properties()
    topic = naming.ledger_topic(group)
    ClusterTopics(properties, timeout).ensure_internal(group)
    producer = Producer(
        client_config(
            properties,
            **{
                "transactional.id": naming.transactional_id(group, target.name),
                "enable.idempotence": True,
                "acks": "all",
            },
        )
    )
    try:
        producer.init_transactions(timeout)
        producer.begin_transaction()
        for key, value in records:
            producer.produce(topic, value, key, partition=0)
        producer.commit_transaction(timeout)
        # Readable before we go on: the next step (or the member's sidecar, started as
        # soon as we say so) reads these records back, and would miss them meanwhile.
        wait_until_committed_readable(
            properties, f"{naming.consumer_group(group)}.backfill-reader", topic, 0, timeout
        )
    except (KafkaException, KafkaUnavailable) as error:
        raise SeedingError(
            f"member {target.name}: cannot write to its ledger topic {topic}: {error}; "
            "run the command again (the copy resumes)"
        ) from None
