"""The backfill's records in a new member's ledger topic (the marker, then the seed ledger
and the hand-over) are readable by a ``read_committed`` reader the moment each write
returns. The next step reads the marker back at once, and the member's sidecar, started as
soon as the command says so, reads the seed. A producer's commit returns before its
transaction's markers reach the partition: a reader started in between ended before the
records (here on a quiet machine, after about 5 in 100 commits), so the command took the
missing marker for a sidecar that had run too early, and the sidecar, seeing the marker
without the seed, refused to start as if still being seeded."""

from __future__ import annotations

import contextlib
import uuid

import pytest

from kdsync import naming
from kdsync.backfill import seeding
from kdsync.config.sections import KafkaConfig, MemberConfig
from kdsync.kafka.partition_reader import reading_consumer, watermarks
from kdsync.localkafka import LocalKafkaFleet
from kdsync.ordering import LedgerState

pytestmark = pytest.mark.kafka

ROUNDS = 10  # the window is short: each round (3 s) gives it two chances to show


def test_each_seeding_write_is_readable_committed_when_it_returns(
    kafka_fleet: LocalKafkaFleet,
) -> None:
    servers = kafka_fleet["kafka-2"].bootstrap_servers
    member = MemberConfig(
        name="m4", peer="127.0.0.1:1", kafka=KafkaConfig(bootstrap_servers=servers)
    )
    properties = {"bootstrap.servers": servers}
    # Made before the writes, so that each check follows its write within milliseconds.
    everything = reading_consumer(properties, "seed-test", committed_only=False)
    committed = reading_consumer(properties, "seed-test", committed_only=True)
    with contextlib.closing(everything), contextlib.closing(committed):

        def unreadable(group: str) -> int:
            """How many records of the group's ledger topic a committed reader misses now."""
            topic = naming.ledger_topic(group)
            return watermarks(everything, topic, 0, 10)[1] - watermarks(committed, topic, 0, 10)[1]

        for round_ in range(ROUNDS):
            group = f"seed-{uuid.uuid4().hex[:8]}"
            seeding.write_marker(member, group)
            assert unreadable(group) == 0, f"round {round_}: the marker is not readable yet"
            marked = seeding.read_state(member, group, timeout=30)
            assert marked.seeding_started and marked.ledger is None, (round_, marked)

            ledger = LedgerState(applied_index=40 + round_, applied_term=2, next_seq={"t": 7})
            seeding.write_seed(member, group, ledger, {"donor": "m1", "point": 40 + round_})
            assert unreadable(group) == 0, f"round {round_}: the seed is not readable yet"
            seeded = seeding.read_state(member, group, timeout=30)
            assert seeded.ledger is not None, round_
            assert (seeded.ledger.applied_index, seeded.ledger.next_seq) == (40 + round_, {"t": 7})
