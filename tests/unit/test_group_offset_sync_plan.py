"""Continuous group offset sync: which groups are selected, and what a round writes.

The plan is pure (translations and B's committed offsets in, writes out); the
translations here come from the real translation code over in-memory partitions laid
out as Kafka lays out T-global (tests/unit/test_failover_translation.py's fakes), and
from hand-made outcomes for the cases a layout cannot easily produce.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdsync.config import ConfigError, GroupOffsetSyncConfig, parse_config
from kdsync.failover.sync_plan import GroupPlan, Skip, plan_group
from kdsync.failover.translation import (
    GroupTranslation,
    Outcome,
    PartitionTranslation,
    source_position,
    translate_partition,
)
from kdsync.runtime.status_report import render
from tests.unit.test_failover_translation import FakePartition, lay_out

TOPIC = "orders-global"


def _translation(source: str, *partitions: PartitionTranslation) -> GroupTranslation:
    return GroupTranslation("g", source, "b", tuple(partitions))


def _exact(offset: int, partition: int = 0) -> PartitionTranslation:
    return PartitionTranslation(TOPIC, partition, Outcome.EXACT, target_offset=offset)


def _outcome(outcome: Outcome, partition: int = 0) -> PartitionTranslation:
    return PartitionTranslation(TOPIC, partition, outcome, last_read_seq=9, detail="why")


# -- selection ---------------------------------------------------------------------------


def test_groups_are_selected_by_name_and_whole_name_patterns() -> None:
    sync = GroupOffsetSyncConfig(
        groups=("billing", "kdsync-orders"), include=(r"app\..*",), exclude=(r".*\.test",)
    )
    assert sync.enabled
    assert sync.selects("billing")
    assert sync.selects("app.eu")
    assert not sync.selects("app.eu.test")  # excluded
    assert not sync.selects("myapp.eu")  # patterns match whole ids
    assert not sync.selects("other")
    assert sync.selects("kdsync-orders")  # kdsync's own groups only when named


def test_patterns_never_select_kdsync_groups() -> None:
    sync = GroupOffsetSyncConfig(include=(".*",))
    assert sync.selects("anything")
    for name in ("kdsync-orders", "kdsync-failover-reader", "kdsync-x.sync"):
        assert not sync.selects(name), name


def test_sync_is_off_unless_a_group_is_selected() -> None:
    assert not GroupOffsetSyncConfig().enabled
    assert not GroupOffsetSyncConfig(exclude=(".*",)).enabled
    assert GroupOffsetSyncConfig().interval_seconds == 5.0


def _config(sync: object) -> dict[str, object]:
    return {
        "group": "orders",
        "member": "a",
        "members": [
            {"name": "a", "peer": "127.0.0.1:7400", "kafka": {"bootstrapServers": "a:1"}},
            {"name": "b", "peer": "127.0.0.1:7401", "kafka": {"bootstrapServers": "b:1"}},
        ],
        "topics": {"names": ["orders"]},
        "insecure": True,
        "groupOffsetSync": sync,
    }


def test_config_section_loads_in_camel_case() -> None:
    config = parse_config(_config({"groups": ["billing"], "intervalSeconds": 0.5}))
    assert config.group_offset_sync.groups == ("billing",)
    assert config.group_offset_sync.interval_seconds == 0.5
    assert not parse_config(_config({})).group_offset_sync.enabled


@pytest.mark.parametrize(
    ("sync", "path", "phrase"),
    [
        ({"include": ["a[b"]}, "groupOffsetSync.include[0]", "not a valid regular expression"),
        ({"groups": ["x", "x"]}, "groupOffsetSync.groups[1]", "listed twice"),
        ({"groups": [""]}, "groupOffsetSync.groups[0]", "empty"),
        ({"intervalSeconds": 0}, "groupOffsetSync.intervalSeconds", ">= 0.1"),
        ({"group": ["x"]}, "groupOffsetSync.group", "did you mean `groups`?"),
    ],
)
def test_config_mistakes_name_the_field(sync: object, path: str, phrase: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_config(sync))
    text = str(info.value)
    assert path in [p.path for p in info.value.problems], text
    assert phrase in text, text


# -- planning ----------------------------------------------------------------------------


def test_writes_only_forward() -> None:
    a = _translation("a", _exact(40, 0), _exact(10, 1), _exact(7, 2))
    plan = plan_group("g", [a], {(TOPIC, 0): 30, (TOPIC, 1): 10, (TOPIC, 2): 9}, False)
    # 0 moves forward; 1 is already there; 2 would move backwards and is left alone.
    assert plan.writes == {(TOPIC, 0): 40}
    assert plan.in_step


def test_a_partition_without_an_offset_in_b_is_written() -> None:
    plan = plan_group("g", [_translation("a", _exact(0))], {}, False)
    assert plan.writes == {(TOPIC, 0): 0}


def test_active_group_in_b_is_never_written() -> None:
    a = _translation("a", _exact(40, 0), _exact(12, 1))
    plan = plan_group("g", [a], {(TOPIC, 0): 30, (TOPIC, 1): 12}, True)
    assert plan.writes == {}
    assert plan.skipped == {(TOPIC, 0): Skip.ACTIVE}  # 1 is in step anyway
    assert not plan.in_step


def test_not_yet_delivered_waits_and_nothing_is_guessed() -> None:
    a = _translation(
        "a",
        _outcome(Outcome.BEHIND, 0),
        _outcome(Outcome.DELETED_IN_TARGET, 1),
        _outcome(Outcome.MISMATCH, 2),
        PartitionTranslation(TOPIC, 3, Outcome.NO_OFFSET),
    )
    plan = plan_group("g", [a], {}, False)
    assert plan.writes == {}
    assert plan.skipped == {
        (TOPIC, 0): Skip.WAITING,
        (TOPIC, 1): Skip.NOT_EXACT,
        (TOPIC, 2): Skip.NOT_EXACT,
    }
    assert "behind" in plan.details[(TOPIC, 0)]


def test_furthest_exact_position_of_several_members_wins() -> None:
    a = _translation("a", _exact(25, 0), _exact(5, 1))
    c = _translation("c", _exact(31, 0), _outcome(Outcome.BEHIND, 1))
    plan = plan_group("g", [a, c], {(TOPIC, 0): 20}, False)
    # Partition 1: a's exact position is written, and c's group, further than B has
    # delivered, keeps the partition waiting for a later round.
    assert plan.writes == {(TOPIC, 0): 31, (TOPIC, 1): 5}
    assert plan.skipped == {(TOPIC, 1): Skip.WAITING}


_OUTCOMES = st.sampled_from(list(Outcome))


@st.composite
def _rounds(
    draw: st.DrawFn,
) -> tuple[list[GroupTranslation], dict[tuple[str, int], int], bool]:
    translations = []
    for source in draw(st.lists(st.sampled_from("acde"), min_size=0, max_size=3, unique=True)):
        parts = []
        for partition in range(draw(st.integers(0, 3))):
            outcome = draw(_OUTCOMES)
            offset = draw(st.integers(0, 50)) if outcome is not Outcome.NO_OFFSET else None
            parts.append(PartitionTranslation(TOPIC, partition, outcome, target_offset=offset))
        translations.append(_translation(source, *parts))
    committed = draw(
        st.dictionaries(st.tuples(st.just(TOPIC), st.integers(0, 3)), st.integers(0, 50))
    )
    return translations, committed, draw(st.booleans())


@settings(max_examples=300, deadline=None)
@given(_rounds())
def test_plan_properties(
    case: tuple[list[GroupTranslation], dict[tuple[str, int], int], bool],
) -> None:
    translations, committed, active = case
    plan = plan_group("g", translations, committed, active)
    if active:
        assert plan.writes == {}
    for where, offset in plan.writes.items():
        exact = [
            p.target_offset
            for t in translations
            for p in t.partitions
            if (p.topic, p.partition) == where and p.outcome is Outcome.EXACT
        ]
        assert offset == max(o for o in exact if o is not None)  # an exact position only
        assert where not in committed or offset > committed[where]  # never backwards


def test_round_over_real_layouts_follows_what_b_has_delivered() -> None:
    """A group in A translated onto B, which has delivered only part of the log: the
    plan writes once B holds what the group has read, and never more than B holds."""
    rng = random.Random(7)
    seqs = list(range(200))
    in_a = lay_out(seqs, rng)
    full_b = lay_out(seqs, rng)
    committed_a = in_a.committed[120].offset  # the group read seqs 0..119

    def round_with(b: FakePartition, current: dict[tuple[str, int], int]) -> GroupPlan:
        position = source_position(in_a, committed_a)
        translation = _translation("a", translate_partition(TOPIC, 0, position, b))
        return plan_group("g", [translation], current, False)

    cut = full_b.committed[100].offset  # B has delivered seqs 0..99 only
    partial_b = FakePartition([r for r in full_b.committed if r.offset < cut], end=cut)
    waiting = round_with(partial_b, {})
    assert waiting.writes == {} and waiting.skipped == {(TOPIC, 0): Skip.WAITING}

    done = round_with(full_b, {})
    expected = full_b.committed[119].offset + 1  # just after seq 119 in B
    assert done.writes == {(TOPIC, 0): expected}
    assert full_b.seqs_from(expected)[0] == 120  # the next record read in B is seq 120
    assert round_with(full_b, {(TOPIC, 0): expected}).writes == {}


def test_status_table_notes_the_group_sync() -> None:
    status = {
        "group": "orders",
        "member": "b",
        "ready": True,
        "groupOffsetSync": {"groups": 3, "inStep": 2, "waiting": {"app-eu": ["t[0]: x"]}},
    }
    assert "group sync: 2/3 in step, waiting: app-eu" in render([status])
