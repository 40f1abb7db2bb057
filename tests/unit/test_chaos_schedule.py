"""The fault campaign's schedule: a pure function of its seed that covers what it promises."""

from __future__ import annotations

import pytest

from kdsync.chaos.schedule import (
    ALL_KINDS,
    LEADER,
    FaultKind,
    ScheduleSettings,
    generate_schedule,
    parse_kinds,
)

MEMBERS = ("m1", "m2", "m3")


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    settings = ScheduleSettings(members=MEMBERS, faults=40)
    first = generate_schedule(1234, settings)
    assert first == generate_schedule(1234, settings)
    assert first != generate_schedule(1235, settings)


def test_a_schedule_as_long_as_the_kinds_covers_every_kind_once() -> None:
    for seed in range(20):
        schedule = generate_schedule(seed, ScheduleSettings(members=MEMBERS, faults=len(ALL_KINDS)))
        assert sorted(f.kind.value for f in schedule) == sorted(k.value for k in ALL_KINDS)


@pytest.mark.parametrize("seed", range(30))
def test_every_fault_is_well_formed(seed: int) -> None:
    settings = ScheduleSettings(members=MEMBERS, faults=30, min_hold_s=2.0, max_hold_s=5.0)
    for index, fault in enumerate(generate_schedule(seed, settings)):
        assert fault.index == index
        assert 2.0 <= fault.hold_s <= 5.0
        if fault.kind is FaultKind.ISOLATE_LEADER:
            assert fault.targets == (LEADER,)
        elif fault.kind in (FaultKind.SPLIT_ALL, FaultKind.PEER_LATENCY):
            assert fault.targets == MEMBERS
        elif fault.kind is FaultKind.ONE_WAY:
            sender, receiver = fault.targets
            assert sender != receiver and {sender, receiver} <= set(MEMBERS)
        else:
            assert len(fault.targets) == 1 and fault.targets[0] in MEMBERS
        if fault.kind is FaultKind.PEER_LATENCY:
            assert fault.param("latency_ms") > 0 and fault.param("jitter_ms") >= 0
        if fault.kind in (FaultKind.PEER_BANDWIDTH, FaultKind.SLOW_BROKER):
            assert fault.param("rate_kbps") > 0


def test_only_the_chosen_kinds_appear() -> None:
    kinds = parse_kinds("kill-sidecar,one-way")
    schedule = generate_schedule(5, ScheduleSettings(members=MEMBERS, faults=25, kinds=kinds))
    assert {f.kind for f in schedule} == {FaultKind.KILL_SIDECAR, FaultKind.ONE_WAY}


def test_bad_settings_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="unknown fault kind 'nap'; choose from: all, "):
        parse_kinds("kill-sidecar,nap")
    with pytest.raises(ValueError, match="at least three data members"):
        ScheduleSettings(members=("m1", "m2"), faults=3)
    with pytest.raises(ValueError, match="min_hold_s <= max_hold_s"):
        ScheduleSettings(members=MEMBERS, faults=3, min_hold_s=5, max_hold_s=1)
    assert parse_kinds("all") == ALL_KINDS
