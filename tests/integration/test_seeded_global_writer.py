"""A member seeded by a backfill, as its T-global writer sees it on real Kafka: it starts
from the ledger the backfill wrote, checks its T-global against the hand-over's firstSeq
(a donor trimmed by retention gave it seqs from there on only), and refuses to start while
a backfill's marker has no ledger after it (the copy is half done)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest

from kdsync import naming
from kdsync.kafka.errors import BackfillPending, GlobalTopicLost
from kdsync.kafka.global_writer import GlobalWriter
from kdsync.kafka.ledger_reader import BACKFILL_KEY, HANDOVER_KEY, LEDGER_KEY
from kdsync.localkafka import LocalKafkaFleet
from kdsync.ordering import LedgerState
from kdsync.ordering.events import DeliveredEvent, SourceEvent
from kdsync.record_format import to_global_record
from kdsync.wire_format.records import encode_ledger_state
from tests.support.plain_kafka import Record, create_topic, produce_transactionally

pytestmark = pytest.mark.kafka
FIRST, NEXT = 40, 50  # the T-global holds seqs 40..49, as copied from a trimmed donor


def _seed(servers: str, source: str, *, handover: bool, ledger: bool) -> str:
    """A fresh group whose member m4 holds what a backfill from a trimmed donor leaves."""
    group = f"g{uuid.uuid4().hex[:8]}"
    global_topic = f"{source}-global"
    create_topic(servers, global_topic)
    records = []
    for seq in range(FIRST, NEXT):
        event = SourceEvent(seq, b"k", f"v{seq}".encode(), (), 1_700_000_000_000 + seq)
        record = to_global_record(DeliveredEvent(seq, "m1", source, 0, event), global_topic, 1)
        records.append(
            Record(record.key, record.value, tuple(record.headers), record.timestamp_ms, 0)
        )
    produce_transactionally(servers, global_topic, records)
    seeded = [Record(BACKFILL_KEY, b"{}", partition=0)]
    if handover:
        text = json.dumps({"firstSeq": {source: FIRST}, "nextSeq": {source: NEXT}})
        seeded.append(Record(HANDOVER_KEY, text.encode(), partition=0))
    if ledger:
        state = LedgerState(applied_index=10, applied_term=2, next_seq={source: NEXT})
        seeded.append(Record(LEDGER_KEY, encode_ledger_state(state), partition=0))
    create_topic(servers, naming.ledger_topic(group))
    produce_transactionally(servers, naming.ledger_topic(group), seeded)
    return group


def _writer(servers: str, group: str) -> GlobalWriter:
    return GlobalWriter(
        {"bootstrap.servers": servers}, group, "m4", lambda t: f"{t}-global", lambda t: 1, 10.0
    )


@pytest.fixture
def servers(kafka_fleet: LocalKafkaFleet) -> str:
    return next(iter(kafka_fleet.bootstrap_servers().values()))


def test_a_seeded_member_checks_its_t_global_from_the_handovers_first_seq(
    servers: str, fresh_topic: Callable[[str], str]
) -> None:
    source = fresh_topic("seeded")
    group = _seed(servers, source, handover=True, ledger=True)
    writer = _writer(servers, group)
    ledger = writer.start()
    assert (ledger.applied_index, ledger.next_seq) == (10, {source: NEXT})
    # Ten records for fifty seqs: right for a T-global that starts at seq 40.
    writer.write([], LedgerState(applied_index=11, applied_term=2, next_seq={source: NEXT}))


def test_without_the_handover_the_same_t_global_is_a_lost_one(
    servers: str, fresh_topic: Callable[[str], str]
) -> None:
    source = fresh_topic("unseeded")
    group = _seed(servers, source, handover=False, ledger=True)
    writer = _writer(servers, group)
    writer.start()
    with pytest.raises(GlobalTopicLost, match="committed 50 events"):
        writer.write([], LedgerState(applied_index=11, applied_term=2, next_seq={source: NEXT}))


def test_a_member_half_seeded_refuses_to_start(
    servers: str, fresh_topic: Callable[[str], str]
) -> None:
    group = _seed(servers, fresh_topic("half"), handover=False, ledger=False)
    with pytest.raises(BackfillPending, match="being seeded by a backfill"):
        _writer(servers, group).start()
