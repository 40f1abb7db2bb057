"""``kdsync members add NAME --member-config``: the command's steps for a data member
(learner, backfill, start, voter) against a scripted group, and the pure choices of the
backfill point (``kdsync.backfill_point``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from kdsync.backfill.seeding import seed_ledger
from kdsync.backfill_point import (
    DonorChoice,
    PointNotReady,
    applied_everywhere,
    below_floor,
    choose_donor,
    members_to_ask,
)
from kdsync.ordering import Configuration, LedgerState
from kdsync.runtime import members_command
from kdsync.runtime.members_command import MembersCommandError, Statuses
from tests.unit.test_members_command import ScriptedGroup, _status

M4_URL = "u4"
M4_PEER = "m4.example:7400"


def _group(**extra: Any) -> ScriptedGroup:
    return ScriptedGroup(
        {
            "u1": _status("m1", "leader", allDurable=40, appliedIndex=50, **extra),
            "u2": _status("m2", "follower", allDurable=38, appliedIndex=47, **extra),
            "u3": _status("m3", "follower", allDurable=40, appliedIndex=49, **extra),
        }
    )


def _config(index: int, voters: list[str], learners: list[str]) -> dict[str, Any]:
    return {
        "voters": voters,
        "witnesses": [],
        "learners": learners,
        "index": index,
        "committed": True,
        "addresses": {"m4": M4_PEER},
    }


LEARNER = _config(60, ["m1", "m2", "m3"], ["m4"])
VOTER = _config(70, ["m1", "m2", "m3", "m4"], [])


class Seeds:
    """The backfill port: records each call, then the scripted m4 sidecar starts."""

    def __init__(self, group: ScriptedGroup, seeds: bool = True) -> None:
        self.group = group
        self.seeds = seeds  # what the backfill finds: not seeded yet (True), or seeded
        self.calls: list[tuple[list[str], float]] = []

    def __call__(self, statuses: Statuses, deadline: float) -> bool:
        self.calls.append((sorted(statuses()), deadline))
        return self.seeds


def _add(
    group: ScriptedGroup, monkeypatch: pytest.MonkeyPatch, seed: Seeds, timeout: float = 60.0
) -> str:
    monkeypatch.setattr(members_command, "fetch_status", group.fetch_status)
    monkeypatch.setattr(members_command, "post_membership", group.post)
    lines: list[str] = []
    members_command.add_data_member(
        [u for u in group.statuses if u != M4_URL],
        "m4",
        peer=M4_PEER,
        member_url=M4_URL,
        seed=seed,
        timeout=timeout,
        out=lines.append,
        clock=group.clock,
        sleep=group.sleep,
    )
    return "\n".join(lines)


def _set_config(group: ScriptedGroup, config: Mapping[str, Any]) -> None:
    for url in ("u1", "u2", "u3"):
        group.statuses[url]["configuration"] = dict(config)


def test_a_data_member_is_added_as_a_learner_seeded_then_waited_for_until_it_votes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = _group()
    group.answers["u1"] = iter([(200, {"outcome": "appended", "index": 60})])
    seed = Seeds(group)

    def group_moves(g: ScriptedGroup) -> None:
        if g.asked and not seed.calls:
            _set_config(g, LEARNER)  # the learner's addition committed
        if seed.calls and M4_URL not in g.statuses:
            # The user starts m4's sidecar; it catches up and the leader promotes it.
            g.statuses[M4_URL] = _status("m4", "follower", allDurable=60, appliedIndex=60)
            _set_config(g, VOTER)

    group.on_sleep.append(group_moves)
    output = _add(group, monkeypatch, seed)

    assert group.bodies == [{"add": "m4", "witness": False, "peer": M4_PEER}]
    assert len(seed.calls) == 1, "seeded once, after the learner committed"
    assert seed.calls[0] == (["m1", "m2", "m3"], 60.0)
    assert "m4 is in the group as a learner: m1, m2, m3" in output
    assert "Start m4's sidecar now" in output
    assert "m4 votes now: m1, m2, m3, m4 (index 70, committed)" in output


@pytest.mark.parametrize("seeded_before", [True, False])
def test_a_run_after_the_sidecar_was_started_asks_the_backfill_all_the_same(
    monkeypatch: pytest.MonkeyPatch, seeded_before: bool
) -> None:
    """Whether m4 answers says nothing about its cluster: the backfill decides from there
    (seeded already, or seeds it now, fencing the sidecar that ran too early)."""
    group = _group()
    _set_config(group, LEARNER)
    group.statuses[M4_URL] = _status("m4", "follower", allDurable=60, appliedIndex=55)
    group.answers["u1"] = iter([(200, {"outcome": "already-a-member", "index": 60})])
    group.on_sleep.append(lambda g: _set_config(g, VOTER))
    seed = Seeds(group, seeds=not seeded_before)
    output = _add(group, monkeypatch, seed)
    assert len(seed.calls) == 1
    assert "m4 is in the newest configuration already; resuming" in output
    assert ("Restart m4's sidecar now" in output) is not seeded_before
    assert "Start m4's sidecar now" not in output
    assert "m4 votes now" in output


def test_a_new_member_whose_sidecar_runs_too_early_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = _group()
    group.statuses[M4_URL] = _status("m4", "follower", allDurable=0, appliedIndex=0)
    seed = Seeds(group)
    with pytest.raises(MembersCommandError, match=r"m4's sidecar runs already: stop it"):
        _add(group, monkeypatch, seed)
    assert group.asked == [] and seed.calls == []


def test_a_group_with_an_older_release_is_not_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    group = _group()
    del group.statuses["u2"]["allDurable"]
    with pytest.raises(MembersCommandError, match=r"m2 run\(s\) an older release"):
        _add(group, monkeypatch, Seeds(group))
    assert group.asked == []


def test_a_member_never_started_ends_at_the_deadline_with_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = _group()
    group.answers["u1"] = iter([(200, {"outcome": "appended", "index": 60})])
    group.on_sleep.append(lambda g: _set_config(g, LEARNER))
    seed = Seeds(group)
    with pytest.raises(
        MembersCommandError, match=r"m4 is not a voter yet: its sidecar does not"
    ) as e:
        _add(group, monkeypatch, seed, timeout=10.0)
    assert "no member trims its ordering log" in str(e.value) and "members remove m4" in str(
        e.value
    )
    assert len(seed.calls) == 1


# ---------------------------------------------------------------- the backfill point


def _statuses(**applied_durable: tuple[int, int]) -> dict[str, dict[str, int]]:
    return {m: {"appliedIndex": a, "allDurable": d} for m, (a, d) in applied_durable.items()}


def test_the_donor_is_the_member_that_applied_least_and_the_floor_the_largest_durable() -> None:
    seen = _statuses(m1=(50, 40), m2=(47, 38), m3=(49, 41))
    choice = choose_donor(seen, ["m1", "m2", "m3"], [])
    assert choice == DonorChoice("m2", 41)
    # m2's latest ledger is K: not below the floor, nor above what anyone applied.
    assert "m2 has not applied index 41" in (below_floor(choice, 40) or "")
    assert below_floor(choice, 41) is None
    assert applied_everywhere(seen, ["m1", "m2", "m3"], 48) == ["m2"]
    assert applied_everywhere(seen, ["m1", "m2", "m3"], 47) == []


def test_a_witness_that_remembers_more_than_the_restarted_data_members_raises_the_floor() -> None:
    # Simulator seed 2017394: the data members restarted (a restart forgets allDurable),
    # the witness kept 41 and, once it led, passed it on: the data members trimmed their
    # logs up to it. A point below 41 would leave the new member waiting for entries no
    # log holds any more.
    seen = _statuses(m0=(52, 0), m1=(50, 0), m2=(51, 0), w3=(52, 0), w4=(52, 41))
    choice = choose_donor(seen, ["m0", "m1", "m2"], ["w3", "w4"])
    assert choice == DonorChoice("m1", 41)


def test_a_restarted_data_member_whose_log_was_trimmed_raises_the_floor() -> None:
    # It reports allDurable 0 after a restart, but its log topic holds nothing below 30:
    # a point below that would need entries (or the term of entry K) it no longer has.
    seen = _statuses(m1=(50, 0), m2=(47, 0), m3=(49, 0))
    seen["m3"]["trimmedBelow"] = 30
    assert choose_donor(seen, ["m1", "m2", "m3"], []) == DonorChoice("m2", 30)
    seen["m1"]["allDurable"] = 41
    assert choose_donor(seen, ["m1", "m2", "m3"], []).floor == 41


def test_every_data_member_must_answer_for_a_backfill_point() -> None:
    with pytest.raises(PointNotReady, match=r"m3 did not answer"):
        choose_donor(_statuses(m1=(50, 40), m2=(47, 38)), ["m1", "m2", "m3"], [])


def test_the_backfill_asks_every_data_member_and_witness_but_the_new_one() -> None:
    config = {
        "voters": ["m1", "m2", "w3"],
        "witnesses": ["w3"],
        "learners": ["m4"],
        "index": 60,
        "committed": True,
    }
    older = {**config, "voters": ["m1", "m2"], "witnesses": [], "learners": [], "index": 10}
    seen = {
        "m1": {"configuration": config},
        "m2": {"configuration": older},  # the newest configuration any member reports counts
    }
    assert members_to_ask(seen, "m4") == (["m1", "m2"], ["w3"])


def test_every_witness_must_answer_for_a_backfill_point() -> None:
    seen = _statuses(m1=(50, 40), m2=(47, 38))
    with pytest.raises(PointNotReady, match=r"w3 did not answer: .*\(witnesses too\)"):
        choose_donor(seen, ["m1", "m2"], ["w3"])


def test_a_ledger_without_a_change_starts_the_new_member_on_the_groups_seed() -> None:
    seed = Configuration(voters=("m1", "m2", "m3"))
    ledger = LedgerState(applied_index=47, applied_term=3, next_seq={"orders": 900})
    seeded = seed_ledger(ledger, seed)
    assert seeded.config == seed and seeded.config_index == 0
    assert (seeded.applied_index, seeded.applied_term, seeded.next_seq) == (47, 3, {"orders": 900})
    changed = LedgerState(
        applied_index=47, config=Configuration(voters=("m1", "m2")), config_index=9
    )
    assert seed_ledger(changed, seed) is changed, "a change applied by then is in force"
