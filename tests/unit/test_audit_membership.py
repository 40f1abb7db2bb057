"""Which members the audit checks after membership changes (``membership_in_force``),
and how its one-line summary names the members that left."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kdsync.audit.membership import AuditMembership, MembershipProblem, membership_in_force
from kdsync.audit.report import Checked, ReportMembership, build_report
from kdsync.ordering import Configuration, LedgerState

FILE = ("m1", "m2", "m3")


def ledger(applied: int, config: Configuration | None = None, *origins: str) -> LedgerState:
    return LedgerState(
        applied_index=applied,
        marks={(origin, "orders", 0): 5 for origin in origins},
        config=config,
        config_index=0 if config is None else applied - 1,
    )


def test_without_a_change_the_files_members_are_checked() -> None:
    found = membership_in_force(FILE, {"m1": ledger(40, None, *FILE), "m2": None})
    assert found == AuditMembership(checked=FILE)


def test_the_ledger_that_applied_most_names_the_members_in_force() -> None:
    removed = Configuration(voters=("m1", "m2", "w"), witnesses=frozenset({"w"}))
    found = membership_in_force(
        FILE,
        {
            # m3 stopped before it applied its own removal: its ledger is the seed's.
            "m3": ledger(30, None, *FILE),
            "m1": ledger(50, removed, *FILE),
            "m2": ledger(45, Configuration(voters=FILE), *FILE),
        },
    )
    assert found == AuditMembership(
        checked=("m1", "m2"), departed=("m3",), config_index=49, source="m1"
    )


def test_an_origin_the_file_no_longer_names_is_departed_not_foreign() -> None:
    found = membership_in_force(
        ("m1", "m2"), {"m1": ledger(50, Configuration(voters=("m1", "m2")), *FILE)}
    )
    assert found.checked == ("m1", "m2")
    assert found.departed == ("m3",)


def test_a_member_in_force_the_file_lacks_is_a_clear_error() -> None:
    grown = Configuration(voters=("m1", "m2", "m3", "m4"))
    with pytest.raises(MembershipProblem) as raised:
        membership_in_force(FILE, {"m1": ledger(60, grown, *FILE)})
    message = str(raised.value)
    assert "m4" in message and "log index 59" in message and "add each to members[]" in message
    assert "joined" not in message, "a member listed in no file may be an old one"


def _summary(membership: ReportMembership | None) -> str:
    moment = datetime(2026, 11, 27, tzinfo=UTC)
    return build_report(
        group="g",
        checked=Checked(from_seq=0, to_seq=9, events=10),
        counts={},
        lag={"m1": 0, "m2": 0},
        violations=[],
        members=2,
        started_at=moment,
        finished_at=moment,
        membership=membership,
    ).summary


def test_the_summary_names_members_that_left_and_those_not_read() -> None:
    assert "left the group" not in _summary(None)
    assert "left the group" not in _summary(ReportMembership(checked=["m1", "m2"]))
    text = _summary(ReportMembership(checked=["m1", "m2"], departed=["m3", "m4"], not_read=["m4"]))
    assert text.endswith("across 2 member(s); left the group: m3, m4 (not read)")


def test_a_learner_is_checked_once_its_backfill_wrote_its_ledger() -> None:
    grown = Configuration(voters=FILE, learners=("m4",))
    files = (*FILE, "m4")
    joining = membership_in_force(files, {"m1": ledger(60, grown, *FILE), "m4": None})
    assert joining.checked == FILE and joining.joining == ("m4",)
    assert joining.departed == (), "a member joining has not left"
    seeded = membership_in_force(files, {"m1": ledger(60, grown, *FILE), "m4": ledger(55)})
    assert seeded.checked == files and seeded.joining == ()
    # Joining, and not in the file yet: no error (nothing of it to read).
    assert membership_in_force(FILE, {"m1": ledger(60, grown, *FILE)}).joining == ("m4",)
    # In the file, its cluster silent: in force, so that the planning stops on it.
    silent = membership_in_force(files, {"m1": ledger(60, grown, *FILE)})
    assert silent.checked == files and silent.joining == ()
