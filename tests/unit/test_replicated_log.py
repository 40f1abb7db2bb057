"""ReplicatedLog: Raft's follower-side merge, compaction and term lookups."""

from __future__ import annotations

import pytest

from kdsync.ordering import Entry, OriginBatch, ReplicatedLog, SourceEvent


def entries(first: int, terms: list[int]) -> list[Entry]:
    """Consecutive entries from ``first``; each term in ``terms`` makes one entry."""
    return [Entry(first + i, term, None) for i, term in enumerate(terms)]


def log_with(terms: list[int]) -> ReplicatedLog:
    log = ReplicatedLog()
    for entry in entries(1, terms):
        log.append(entry)
    return log


def terms_of(log: ReplicatedLog) -> list[int | None]:
    """Terms of every position from the snapshot boundary to the end (None: compacted)."""
    return [log.term_at(i) for i in range(1, log.last_index + 1)]


# ---------------------------------------------------------------- empty log


def test_empty_log() -> None:
    log = ReplicatedLog()
    assert (log.last_index, log.last_term) == (0, 0)
    assert log.term_at(0) == 0, "index 0 is the common origin of every log"
    assert log.term_at(1) is None
    assert not log.has(0)
    assert not log.has(1)
    assert log.slice(1, 10) == []


def test_append_must_be_contiguous() -> None:
    log = log_with([1, 1])
    with pytest.raises(AssertionError):
        log.append(Entry(4, 1, None))
    with pytest.raises(AssertionError):
        log.append(Entry(2, 1, None))


# ---------------------------------------------------------------- merge


def test_merge_into_empty_log_appends_and_reports_the_first_index() -> None:
    log = ReplicatedLog()
    assert log.merge(entries(1, [1, 1, 2])) == 1
    assert terms_of(log) == [1, 1, 2]
    assert (log.last_index, log.last_term) == (3, 2)


def test_merge_of_nothing_changes_nothing() -> None:
    log = log_with([1, 2])
    assert log.merge([]) is None
    assert terms_of(log) == [1, 2]


def test_merge_skips_entries_present_with_the_same_term() -> None:
    log = log_with([1, 1, 2, 2])
    before = [log.entry(i) for i in range(1, 5)]
    assert log.merge(entries(1, [1, 1, 2, 2])) is None, "a resent Append changes nothing"
    assert log.merge(entries(2, [1, 2])) is None, "a resent middle part changes nothing"
    # Same (index, term) means same entry in Raft: the stored objects are kept.
    assert [log.entry(i) for i in range(1, 5)] == before
    assert all(log.entry(i) is before[i - 1] for i in range(1, 5))


def test_merge_of_a_stale_shorter_append_does_not_truncate() -> None:
    # A delayed Append that matches our prefix must not cut off entries that came after
    # it: they may already be acknowledged (and counted towards a commit).
    log = log_with([1, 1, 1, 1, 1])
    assert log.merge(entries(2, [1, 1])) is None
    assert log.last_index == 5


def test_merge_extends_after_the_matching_part_and_reports_where() -> None:
    log = log_with([1, 1, 2])
    changed = log.merge(entries(2, [1, 2, 2, 3]))
    assert changed == 4, "entries 2 and 3 were already there; 4 is the first new one"
    assert terms_of(log) == [1, 1, 2, 2, 3]
    # The caller persists from the reported index on.
    assert [e.index for e in log.slice(changed, log.last_index)] == [4, 5]


def test_merge_truncates_at_the_first_conflict() -> None:
    log = log_with([1, 1, 2, 2, 2])
    changed = log.merge(entries(3, [3]))
    assert changed == 3
    # Everything from the conflict on is replaced, even beyond the new entries' end.
    assert terms_of(log) == [1, 1, 3]
    assert (log.last_index, log.last_term) == (3, 3)


def test_merge_truncates_only_from_the_conflict_not_from_the_first_entry() -> None:
    log = log_with([1, 1, 2, 2, 2])
    changed = log.merge(entries(2, [1, 2, 4, 4]))
    assert changed == 4
    assert terms_of(log) == [1, 1, 2, 4, 4]


def test_merge_replaces_the_conflicting_entries_contents() -> None:
    old_batch = OriginBatch("a", "t", 0, 0, 1, True, (SourceEvent(0, None, b"old", (), 0),))
    new_batch = OriginBatch("b", "t", 0, 0, 1, True, (SourceEvent(0, None, b"new", (), 0),))
    log = ReplicatedLog()
    log.append(Entry(1, 1, None))
    log.append(Entry(2, 1, old_batch))
    assert log.merge([Entry(2, 2, new_batch)]) == 2
    assert log.entry(2) == Entry(2, 2, new_batch)


def test_merge_skips_entries_inside_the_compacted_prefix() -> None:
    log = log_with([1, 1, 2, 2])
    log.compact(3)
    # The leader resends from before our snapshot; the compacted part is committed and
    # therefore matches, whatever the message says.
    assert log.merge(entries(2, [1, 2, 2])) is None
    assert log.merge(entries(2, [1, 2, 2, 3])) == 5
    assert (log.snapshot_index, log.last_index, log.last_term) == (3, 5, 3)
    assert log.term_at(4) == 2


def test_merge_entirely_below_the_snapshot_changes_nothing() -> None:
    log = log_with([1, 1, 1])
    log.compact(3)
    assert log.merge(entries(1, [1, 1, 1])) is None
    assert (log.snapshot_index, log.last_index) == (3, 3)


# ---------------------------------------------------------------- compact


def test_compact_forgets_the_prefix_but_keeps_its_last_index_and_term() -> None:
    log = log_with([1, 1, 2, 2, 3])
    log.compact(3)
    assert (log.snapshot_index, log.snapshot_term) == (3, 2)
    assert (log.last_index, log.last_term) == (5, 3), "the end of the log does not move"
    assert [log.has(i) for i in range(0, 7)] == [False, False, False, False, True, True, False]
    assert [e.index for e in log.slice(4, 5)] == [4, 5]
    assert log.entry(4) == Entry(4, 2, None)


def test_compact_below_the_snapshot_is_a_no_op() -> None:
    log = log_with([1, 2, 3, 4])
    log.compact(2)
    log.compact(1)
    log.compact(2)
    assert (log.snapshot_index, log.snapshot_term, log.last_index) == (2, 2, 4)


def test_compact_beyond_the_end_stops_at_the_end() -> None:
    log = log_with([1, 2, 2])
    log.compact(10)
    assert (log.snapshot_index, log.snapshot_term) == (3, 2)
    assert (log.last_index, log.last_term) == (3, 2), "an empty suffix: last is the snapshot"
    assert log.slice(4, 4) == []


def test_append_after_full_compaction_continues_the_numbering() -> None:
    log = log_with([1, 1])
    log.compact(2)
    log.append(Entry(3, 2, None))
    assert (log.snapshot_index, log.last_index, log.last_term) == (2, 3, 2)
    assert log.term_at(3) == 2


# ---------------------------------------------------------------- term_at


def test_term_at_the_snapshot_boundary_and_around_it() -> None:
    log = log_with([1, 1, 2, 3, 3])
    log.compact(3)
    assert log.term_at(3) == 2, "the boundary itself is known: Raft's check needs it"
    assert log.term_at(2) is None, "compacted away"
    assert log.term_at(0) is None, "index 0 is compacted too once there is a snapshot"
    assert log.term_at(4) == 3
    assert log.term_at(5) == 3
    assert log.term_at(6) is None, "beyond the end"
    assert log.term_at(100) is None


def test_term_at_beyond_the_end_of_an_uncompacted_log() -> None:
    log = log_with([1, 2])
    assert [log.term_at(i) for i in range(0, 5)] == [0, 1, 2, None, None]


# ---------------------------------------------------------------- reset


def test_reset_replaces_everything() -> None:
    log = log_with([1, 1, 1])
    given = entries(11, [4, 5])
    log.reset(10, 4, given)
    assert (log.snapshot_index, log.snapshot_term, log.last_index, log.last_term) == (10, 4, 12, 5)
    assert log.term_at(10) == 4
    assert log.term_at(3) is None
    given.append(Entry(13, 5, None))
    assert log.last_index == 12, "reset copies the list it is given"
