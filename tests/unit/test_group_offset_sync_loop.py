"""The group offset sync loop over fake clusters: what a round writes, what it caches, and
that no failure escapes a round (each kind is logged once, counted, and retried)."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Mapping

import pytest

from kdsync.config import SidecarConfig, parse_config
from kdsync.failover import group_sync
from kdsync.failover.group_sync import GroupOffsetSync
from kdsync.kafka.errors import KafkaUnavailable
from tests.unit.test_failover_translation import FakePartition, lay_out

TOPIC = "orders-global"
TP = (TOPIC, 0)


class FakeCluster:
    """The part of ``ClusterClients`` the sync uses, over in-memory partitions."""

    def __init__(self, name: str, log: FakePartition) -> None:
        self.name = name
        self.log = log
        self.committed: dict[str, dict[tuple[str, int], int]] = {}
        self.active: dict[str, list[str]] = {}
        self.writes: list[tuple[str, dict[tuple[str, int], int]]] = []
        self.fail: Exception | None = None
        self.closed = False
        self.translations = 0

    def group_ids(self) -> list[str]:
        if self.fail is not None:
            raise self.fail
        return sorted(self.committed)

    def committed_offsets(self, group: str) -> dict[tuple[str, int], int]:
        if self.fail is not None:
            raise self.fail
        return dict(self.committed.get(group, {}))

    def active_members(self, group: str) -> list[str]:
        return list(self.active.get(group, []))

    def partition_count(self, topic: str) -> int | None:
        return 1 if topic == TOPIC else None

    def partition_log(self, topic: str, partition: int) -> FakePartition:
        self.translations += 1
        return self.log

    def write_offsets(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        self.writes.append((group, dict(offsets)))
        self.committed.setdefault(group, {}).update(offsets)

    def close(self) -> None:
        self.closed = True


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.failures: list[str] = []
        self.rounds = 0

    def written(self, group: str, offsets: int, delays: list[float]) -> None:
        assert all(d >= 0 for d in delays)
        self.seen.append((group, offsets))

    def failed(self, kind: str) -> None:
        self.failures.append(kind)

    def round_done(self, seconds: float, groups: int, in_step: int) -> None:
        self.rounds += 1


def _config(**sync: object) -> SidecarConfig:
    return parse_config(
        {
            "group": "orders",
            "member": "b",
            "members": [
                {"name": "a", "peer": "127.0.0.1:7400", "kafka": {"bootstrapServers": "a:1"}},
                {"name": "b", "peer": "127.0.0.1:7401", "kafka": {"bootstrapServers": "b:1"}},
                {"name": "w", "peer": "127.0.0.1:7402", "witness": True},
            ],
            "topics": {"names": ["orders"]},
            "insecure": True,
            "groupOffsetSync": {"include": ["app-.*"], **sync},
        }
    )


@pytest.fixture
def clusters(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, FakeCluster]]:
    rng = random.Random(3)
    seqs = list(range(100))
    made = {"a": FakeCluster("a", lay_out(seqs, rng)), "b": FakeCluster("b", lay_out(seqs, rng))}
    monkeypatch.setattr(
        group_sync, "ClusterClients", lambda name, _properties, _timeout: made[name]
    )
    yield made


def test_a_round_writes_the_exact_position_once(clusters: dict[str, FakeCluster]) -> None:
    a, b = clusters["a"], clusters["b"]
    a.committed["app-1"] = {TP: a.log.committed[40].offset}  # read seqs 0..39
    a.committed["other"] = {TP: a.log.committed[10].offset}  # not selected
    recorder = Recorder()
    sync = GroupOffsetSync(_config(), recorder)
    sync.run_round()
    expected = b.log.committed[39].offset + 1
    assert b.writes == [("app-1", {TP: expected})]
    assert recorder.seen == [("app-1", 1)]
    assert sync.status()["inStep"] == 1 and sync.status()["groups"] == 1

    translated = a.translations + b.translations
    sync.run_round()  # nothing changed: no translation, no write
    assert a.translations + b.translations == translated
    assert len(b.writes) == 1

    b.committed["app-1"] = {TP: expected + 5}  # the group read further in B itself
    a.committed["app-1"] = {TP: a.log.committed[42].offset}
    sync.run_round()
    assert len(b.writes) == 1  # never backwards
    sync.close()
    assert a.closed and b.closed


def test_a_group_active_here_is_left_alone(clusters: dict[str, FakeCluster]) -> None:
    a, b = clusters["a"], clusters["b"]
    a.committed["app-1"] = {TP: a.log.committed[40].offset}
    b.active["app-1"] = ["consumer@host"]
    sync = GroupOffsetSync(_config(), Recorder())
    sync.run_round()
    assert b.writes == []
    assert sync.status()["inStep"] == 0
    translated = b.translations
    sync.run_round()  # the same position in A: translated once, not every round
    assert b.translations == translated and b.writes == []
    b.active.clear()  # the consumer left: the next round writes
    sync.run_round()
    assert b.writes == [("app-1", {TP: b.log.committed[39].offset + 1})]


def test_failures_never_escape_and_are_logged_once_per_kind(
    clusters: dict[str, FakeCluster], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = clusters["a"], clusters["b"]
    a.committed["app-1"] = {TP: a.log.committed[40].offset}
    recorder = Recorder()
    sync = GroupOffsetSync(_config(), recorder)
    a.fail = KafkaUnavailable("a is away")
    with caplog.at_level(logging.INFO, logger=group_sync.__name__):
        sync.run_round()
        sync.run_round()
        a.fail = None
        sync.run_round()
    assert recorder.failures == ["unavailable:a", "unavailable:a"]
    assert sync.status()["errors"] == {"unavailable:a": 2}
    messages = [r.getMessage() for r in caplog.records]
    assert sum("a is away" in m for m in messages) == 1, messages
    assert any("unavailable:a recovered" in m for m in messages), messages
    assert b.writes  # the round after the failure caught up
    assert recorder.rounds == 3


def test_an_unexpected_error_is_counted_not_raised(
    clusters: dict[str, FakeCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    a = clusters["a"]
    a.committed["app-1"] = {TP: a.log.committed[40].offset}
    sync = GroupOffsetSync(_config(), Recorder())

    def broken(group: str) -> list[str]:
        raise RuntimeError("surprise")

    monkeypatch.setattr(clusters["b"], "active_members", broken)
    sync.run_round()
    assert sync.status()["errors"] == {"unexpected": 1}
    assert "surprise" in str(sync.status()["lastError"])


def test_offsets_gone_in_b_are_translated_afresh(clusters: dict[str, FakeCluster]) -> None:
    """Kafka drops the offsets of a deleted topic: a T-global made again in B has a new
    log, where the cached positions mean nothing."""
    a, b = clusters["a"], clusters["b"]
    a.committed["app-1"] = {TP: a.log.committed[40].offset}
    sync = GroupOffsetSync(_config(), Recorder())
    sync.run_round()
    b.log = lay_out(list(range(30, 100)), random.Random(9))  # made again, from seq 30 on
    b.committed.clear()
    translated = b.translations
    sync.run_round()
    assert b.translations > translated
    assert b.writes[-1] == ("app-1", {TP: b.log.committed[9].offset + 1})  # after seq 39
