"""Offset translation between members, on in-memory partitions shaped like T-global.

Each fake partition is built as Kafka lays one out: records in transactions, one marker
offset after each, some transactions aborted (their records take offsets but a
read_committed reader never sees them), and retention removing a prefix. Two members
hold the same records (the same ``kdsync.seq``s in the same order) in different layouts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from kdsync.failover.report import render_table, to_json
from kdsync.failover.translation import (
    GroupTranslation,
    Located,
    Outcome,
    SeqSearch,
    find_seq,
    source_position,
    translate_partition,
)


@dataclass
class FakePartition:
    """Committed records (offset, seq) of one partition; offsets in between are markers
    or aborted records. ``run`` is how many records one read returns (small, so the
    bisection really bisects)."""

    committed: list[Located]
    end: int
    start: int = 0
    run: int = 3
    reads: int = 0

    def bounds(self) -> tuple[int, int]:
        return self.start, self.end

    def _kept(self) -> list[Located]:
        return [r for r in self.committed if r.offset >= self.start]

    def read_from(self, offset: int) -> Sequence[Located]:
        self.reads += 1
        return [r for r in self._kept() if r.offset >= offset][: self.run]

    def last_before(self, offset: int) -> Located | None:
        before = [r for r in self._kept() if r.offset < offset]
        return before[-1] if before else None

    def seqs_from(self, offset: int) -> list[int]:
        return [r.seq for r in self._kept() if r.offset >= offset]

    def seqs_before(self, offset: int) -> list[int]:
        return [r.seq for r in self._kept() if r.offset < offset]

    def retain_from(self, offset: int) -> None:
        self.start = offset


def lay_out(seqs: Sequence[int], rng: random.Random, aborted_share: float = 0.2) -> FakePartition:
    """``seqs`` written in transactions of random size, each followed by a commit marker,
    with aborted transactions (records plus an abort marker) sprinkled in."""
    committed: list[Located] = []
    offset = 0
    index = 0
    while index < len(seqs):
        if rng.random() < aborted_share:
            offset += rng.randint(1, 4) + 1  # aborted records and their abort marker
            continue
        size = rng.randint(1, 6)
        for seq in seqs[index : index + size]:
            committed.append(Located(offset, seq))
            offset += 1
        index += size
        offset += 1  # commit marker
    return FakePartition(committed, offset)


def partition_seqs(total: int, partitions: int, which: int, rng: random.Random) -> list[int]:
    """The seqs that land in partition ``which`` when events of random origin partitions
    share one global sequence (what globalPartitions > 1 looks like)."""
    return [seq for seq in range(total) if rng.randrange(partitions) == which]


@pytest.mark.parametrize("partitions", [1, 3])
@pytest.mark.parametrize("seed", range(8))
def test_every_committed_offset_maps_to_the_same_position(partitions: int, seed: int) -> None:
    """For every offset a group can have committed in A, the position in B splits B's
    records exactly where A's are split: what was read before, what remains after."""
    rng = random.Random(seed)
    seqs = partition_seqs(200, partitions, rng.randrange(partitions), rng)
    source, target = lay_out(seqs, rng), lay_out(seqs, rng)
    assert [r.offset for r in source.committed] != [r.offset for r in target.committed]
    for committed in range(source.end + 1):
        position = source_position(source, committed)
        result = translate_partition("t-global", 0, position, target)
        assert result.outcome is Outcome.EXACT, (committed, result)
        assert result.target_offset is not None
        assert target.seqs_before(result.target_offset) == source.seqs_before(committed)
        assert target.seqs_from(result.target_offset) == source.seqs_from(committed)


def test_a_lookup_costs_a_logarithmic_number_of_reads() -> None:
    rng = random.Random(7)
    target = lay_out(list(range(20_000)), rng)
    target.run = 1
    target.reads = 0
    lookup = find_seq(target, 12_345)
    assert lookup.result is SeqSearch.FOUND
    assert lookup.record is not None and lookup.record.seq == 12_345
    assert target.reads <= 40, target.reads


def test_a_target_behind_the_group_is_reported_with_how_far() -> None:
    rng = random.Random(1)
    source = lay_out(list(range(100)), rng)
    target = lay_out(list(range(60)), rng)  # has delivered seq 0..59 so far
    committed = next(r.offset for r in source.committed if r.seq == 80)  # read 0..79
    result = translate_partition("t-global", 0, source_position(source, committed), target)
    assert result.outcome is Outcome.BEHIND
    assert result.last_read_seq == 79
    assert result.target_last_seq == 59
    assert result.seqs_behind == 20
    # Once the target has delivered seq 79 the position is exact, though 80 is not there.
    caught_up = lay_out(list(range(80)), rng)
    result = translate_partition("t-global", 0, source_position(source, committed), caught_up)
    assert result.outcome is Outcome.EXACT
    assert result.target_offset == caught_up.committed[-1].offset + 1


def test_a_group_at_the_very_end_maps_to_just_after_the_last_record() -> None:
    rng = random.Random(2)
    source, target = lay_out(list(range(50)), rng), lay_out(list(range(50)), rng)
    result = translate_partition("t-global", 0, source_position(source, source.end), target)
    assert result.outcome is Outcome.EXACT
    assert result.last_read_seq == 49
    assert result.target_offset == target.committed[-1].offset + 1
    assert target.seqs_from(result.target_offset) == []


def test_target_retention_of_only_read_records_still_translates_exactly() -> None:
    rng = random.Random(3)
    source, target = lay_out(list(range(100)), rng), lay_out(list(range(100)), rng)
    committed = next(r.offset for r in source.committed if r.seq == 40)  # read 0..39
    # B deleted up to and including seq 39, everything the group read, but kept seq 40.
    target.retain_from(next(r.offset for r in target.committed if r.seq == 40))
    result = translate_partition("t-global", 0, source_position(source, committed), target)
    assert result.outcome is Outcome.EXACT
    assert target.seqs_from(result.target_offset or 0)[0] == 40


def test_target_retention_of_unread_records_offers_the_earliest() -> None:
    rng = random.Random(4)
    source, target = lay_out(list(range(100)), rng), lay_out(list(range(100)), rng)
    committed = next(r.offset for r in source.committed if r.seq == 40)
    earliest = next(r for r in target.committed if r.seq == 55)
    target.retain_from(earliest.offset)
    result = translate_partition("t-global", 0, source_position(source, committed), target)
    assert result.outcome is Outcome.DELETED_IN_TARGET
    assert result.target_offset == earliest.offset
    assert "seq 55" in result.detail
    group = GroupTranslation("g", "a", "b", (result,))
    assert group.blocking(accept_earliest=False) == (result,)
    assert group.blocking(accept_earliest=True) == ()
    assert group.offsets(accept_earliest=True) == {("t-global", 0): earliest.offset}
    assert group.offsets(accept_earliest=False) == {}


def test_nothing_read_maps_to_the_beginning_unless_retention_took_it() -> None:
    rng = random.Random(5)
    source, target = lay_out(list(range(30)), rng), lay_out(list(range(30)), rng)
    result = translate_partition("t-global", 0, source_position(source, 0), target)
    assert (result.outcome, result.target_offset) == (Outcome.EXACT, 0)
    target.retain_from(target.committed[5].offset)
    result = translate_partition("t-global", 0, source_position(source, 0), target)
    assert result.outcome is Outcome.DELETED_IN_TARGET
    assert result.target_offset == target.committed[5].offset


def test_source_retention_of_unread_records_is_reported() -> None:
    rng = random.Random(6)
    source, target = lay_out(list(range(60)), rng), lay_out(list(range(60)), rng)
    committed = source.committed[10].offset
    source.retain_from(source.committed[20].offset)  # the group never read 10..19
    result = translate_partition("t-global", 0, source_position(source, committed), target)
    assert result.outcome is Outcome.DELETED_IN_SOURCE


def test_source_retention_of_read_records_uses_the_first_unread_one() -> None:
    rng = random.Random(8)
    source, target = lay_out(list(range(60)), rng), lay_out(list(range(60)), rng)
    first_unread = source.committed[20]
    source.retain_from(first_unread.offset)  # everything the group read is gone from A
    result = translate_partition(
        "t-global", 0, source_position(source, first_unread.offset), target
    )
    assert result.outcome is Outcome.EXACT
    assert target.seqs_from(result.target_offset or 0)[0] == first_unread.seq


def test_members_that_disagree_are_never_translated() -> None:
    rng = random.Random(9)
    source = lay_out(list(range(40)), rng)
    target = lay_out([s for s in range(40) if s != 17], rng)  # B lost seq 17
    committed = next(r.offset for r in source.committed if r.seq == 18)  # last read: 17
    result = translate_partition("t-global", 0, source_position(source, committed), target)
    assert result.outcome is Outcome.MISMATCH
    assert result.target_offset is None
    assert "kdsync audit" in result.detail


def test_a_partition_without_a_committed_offset_is_left_alone() -> None:
    target = lay_out(list(range(5)), random.Random(0))
    result = translate_partition("t-global", 2, None, target)
    group = GroupTranslation("g", "a", "b", (result,))
    assert result.outcome is Outcome.NO_OFFSET
    assert group.blocking(accept_earliest=False) == ()
    assert group.offsets(accept_earliest=False) == {}


def test_the_table_and_json_name_every_partition_and_its_status() -> None:
    rng = random.Random(10)
    source, target = lay_out(list(range(20)), rng), lay_out(list(range(10)), rng)
    exact = translate_partition("orders-global", 0, source_position(source, 0), target)
    behind = translate_partition("orders-global", 1, source_position(source, source.end), target)
    group = GroupTranslation("billing", "us-east", "eu-west", (exact, behind), ("plain",))
    table = render_table(group)
    assert "consumer group billing: us-east -> eu-west" in table
    assert "offset in us-east" in table and "offset in eu-west" in table
    assert "exact" in table and "behind by 10 seq(s)" in table
    assert "skipped plain" in table
    data = to_json(group)
    assert [p["outcome"] for p in data["partitions"]] == ["exact", "behind"]
    assert data["partitions"][1]["seqsBehind"] == 10
