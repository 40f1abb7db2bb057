"""The driver and read-backs: a member whose log is past ``max_log_bytes`` applies only
through them, so a failed one is retried after a pause (not at once, against a failing
broker, and not never)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kdsync.driver import DriverLimits, DriverPorts, MemberDriver
from kdsync.ordering import (
    Configuration,
    Delivery,
    Entry,
    GroupSpec,
    HardState,
    LedgerState,
    OrderingNode,
    Timing,
)

RETRY_TICKS = 5


@dataclass
class _Log:
    """A log port that records read-back requests and completes nothing by itself."""

    asked: list[list[tuple[int, int]]] = field(default_factory=list)

    def persist(
        self, hard_state: HardState | None, entries: list[Entry], truncate_from: int | None
    ) -> None:
        pass

    def load(self, spans: list[tuple[int, int]], max_bytes: int) -> None:
        self.asked.append(list(spans))

    def trim(self, below_index: int) -> None:
        pass


class _Nowhere:
    def send(self, peer: str, frame: bytes) -> bool:
        return True

    def follow_configuration(self, config: Configuration, index: int) -> None:
        pass

    def reach_members(self, config: Configuration) -> None:
        pass

    def write(self, deliveries: Sequence[Delivery], ledger: LedgerState) -> None:
        pass

    def commit(self, positions: Mapping[tuple[str, int], int]) -> None:
        pass


def _driver(log: _Log) -> tuple[MemberDriver, OrderingNode]:
    node = OrderingNode("a", GroupSpec(("a", "b", "c")), Timing(), incarnation=1)
    ports = DriverPorts(log=log, delivery=_Nowhere(), source=None, frames=_Nowhere())
    limits = DriverLimits(retry_ticks=(RETRY_TICKS, 100))
    return MemberDriver(node, ports, limits), node


def _needing_a_read_back(log: _Log) -> tuple[MemberDriver, OrderingNode]:
    """A member whose committed entries 1..10 left memory (past max_log_bytes) before it
    applied them: it can apply only what it reads back from its ordering log."""
    driver, node = _driver(log)
    node.log.reset(10, 1, [])
    node.commit_index = 10
    driver.tick()
    assert log.asked == [[(1, 10)]]
    return driver, node


def test_a_failed_read_back_is_asked_again_after_a_pause() -> None:
    log = _Log()
    driver, _ = _needing_a_read_back(log)
    driver.load_failed("broker away")
    for _ in range(RETRY_TICKS - 1):
        driver.tick()
    assert len(log.asked) == 1, "retried at once, against a failing broker"
    driver.tick()
    assert log.asked == [[(1, 10)], [(1, 10)]], "never retried: applying would stop for good"


def test_a_read_back_in_flight_is_not_asked_twice_and_what_it_brings_is_applied() -> None:
    log = _Log()
    driver, node = _needing_a_read_back(log)
    for _ in range(3):
        driver.tick()
    assert len(log.asked) == 1
    driver.entries_loaded([Entry(i, 1, None) for i in range(1, 11)])
    assert node.ledger is not None and node.ledger.applied_index == 10


def test_a_read_back_that_stops_short_is_followed_by_one_for_the_rest() -> None:
    """The shell stops at ``max_load_bytes``: the core asks for what is left once the
    answer is in, and meanwhile keeps the one read-back out (it owns that, not the
    driver: spans asked while one runs wait and go next, never dropped)."""
    log = _Log()
    driver, node = _needing_a_read_back(log)
    driver.entries_loaded([Entry(i, 1, None) for i in range(1, 5)])
    assert node.ledger is not None and node.ledger.applied_index == 4
    assert log.asked == [[(1, 10)], [(5, 10)]]
    for _ in range(3):
        driver.tick()
    assert len(log.asked) == 2, "asked again while a read-back was still out"
