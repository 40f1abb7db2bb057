"""``kdsync failover`` when the target member has not yet delivered what the group read in
the source (issue #15: "a group ahead of what B has delivered yet: wait up to a bound, or
report how far behind B is"). The Kafka side is replaced by scripted translations; the
waiting, the refusal and its message are the library's own."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import pytest

from kdsync.failover import service
from kdsync.failover.service import Failover, FailoverRefused
from kdsync.failover.translation import GroupTranslation, Outcome, PartitionTranslation

TOPIC = "orders-global"


def _translation(outcome: Outcome, target_last_seq: int) -> GroupTranslation:
    exact = outcome is Outcome.EXACT
    return GroupTranslation(
        "billing",
        "a",
        "b",
        (
            PartitionTranslation(
                TOPIC,
                0,
                outcome,
                source_offset=120,
                last_read_seq=99,
                target_offset=130 if exact else None,
                target_last_seq=target_last_seq,
            ),
        ),
    )


class _Target:
    def __init__(self) -> None:
        self.written: list[dict[tuple[str, int], int]] = []

    def active_members(self, group: str) -> list[str]:
        return []

    def write_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        self.written.append(offsets)


class _ScriptedFailover(Failover):
    """A Failover whose translations follow a script (one per look at the clusters)."""

    def __init__(self, script: Iterable[GroupTranslation]) -> None:  # no clients opened
        self._script: Iterator[GroupTranslation] = iter(script)
        self.looks = 0
        self.source_name, self.target_name = "a", "b"
        self.target = _Target()  # type: ignore[assignment]

    def translate_once(self, group: str) -> GroupTranslation:
        self.looks += 1
        return next(self._script)


@pytest.fixture(autouse=True)
def _no_pause_between_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "_WAIT_INTERVAL", 0.0)


def test_apply_waits_while_the_target_catches_up_then_writes_the_exact_position() -> None:
    catching_up = [_translation(Outcome.BEHIND, seq) for seq in (40, 80)]
    failover = _ScriptedFailover([*catching_up, _translation(Outcome.EXACT, 150)])
    seen: list[int | None] = []

    applied = failover.apply(
        "billing", wait=60.0, on_wait=lambda t: seen.append(t.behind()[0].seqs_behind)
    )

    assert failover.looks == 3
    assert seen == [59, 19]  # how far behind, each time it looked again
    assert failover.target.written == [{(TOPIC, 0): 130}]  # type: ignore[attr-defined]
    assert applied.written == {(TOPIC, 0): 130}


def test_without_wait_a_target_behind_is_refused_with_how_far_and_nothing_written() -> None:
    failover = _ScriptedFailover([_translation(Outcome.BEHIND, 40)])

    with pytest.raises(FailoverRefused) as refused:
        failover.apply("billing")

    message = str(refused.value)
    assert "nothing was written" in message
    assert "b is behind a by up to 59 seq(s)" in message and "--wait" in message
    assert failover.looks == 1
    assert failover.target.written == []  # type: ignore[attr-defined]


def test_the_wait_is_bounded_when_the_target_never_catches_up() -> None:
    failover = _ScriptedFailover(itertools.repeat(_translation(Outcome.BEHIND, 40)))

    translation = failover.translate("billing", wait=0.05)  # returns: the bound holds

    assert translation.behind() and translation.behind()[0].seqs_behind == 59
    assert failover.looks >= 2  # it did look again before giving up
