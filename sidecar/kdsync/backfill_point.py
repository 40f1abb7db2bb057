"""Where a new data member starts: the backfill point, from the members' ``/status``.
Pure, so that the backfill (``kdsync.backfill``) and the simulator's operator
(``kdsync.simulation.membership``) choose it with the same code.

A new member starts like a restarted one at an applied index *K* (docs/ordering.md,
"Membership changes"): with a donor's ledger at *K* and the donor's ``T-global`` up to that
ledger's sequence numbers. *K* must be

- at or past every member's ``allDurable`` once the new learner's addition has committed
  (no ordering log is trimmed past that while the learner has stored nothing, so entry
  *K* and those after it can still be sent to it), and at or past every data member's
  ``trimmedBelow`` (where its log topic started when it did: a restart forgets
  ``allDurable``, not the trims made before). Witnesses count too: a witness that heard a
  higher ``allDurable`` before data members restarted passes it on once it leads, and the
  data members then trim up to it; and
- at or below every data member's applied index, so that nobody ever needs entries up to
  *K* from the new member should it lead.

The donor is the data member that applied least, and *K* is its latest ledger: the others
have applied at least as much, or soon will (``applied_everywhere``). No ledger history is
needed: the latest ledger of the slowest member is the point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kdsync.group_configuration import newest_configuration


class PointNotReady(Exception):
    """No backfill point can be chosen yet (the message says what is awaited); ask again."""


@dataclass(frozen=True)
class DonorChoice:
    donor: str  # the data member that applied least: its latest ledger is K
    floor: int  # K must not be below this (the largest allDurable or trimmedBelow)


def members_to_ask(
    statuses: Mapping[str, Mapping[str, Any]], new_member: str
) -> tuple[list[str], list[str]]:
    """The newest configuration's data members other than ``new_member``, and its
    witnesses: the members ``choose_donor`` needs answers from."""
    config = newest_configuration(statuses.values()) or {}
    witnesses = list(config.get("witnesses", []))
    members = [*config.get("voters", []), *config.get("learners", [])]
    data = [m for m in members if m not in witnesses and m != new_member]
    return data, [m for m in witnesses if m != new_member]


def choose_donor(
    statuses: Mapping[str, Mapping[str, Any]],
    data_members: Sequence[str],
    witnesses: Sequence[str],
) -> DonorChoice:
    """From the ``/status`` of every data member and witness (each must answer; else
    PointNotReady)."""
    silent = [m for m in (*data_members, *witnesses) if m not in statuses]
    if silent:
        raise PointNotReady(
            f"{', '.join(silent)} did not answer: a backfill point must be below what every "
            "data member applied, and at or past what any member knows every log stored, so "
            "every member (witnesses too) must answer; give its address"
        )
    if not data_members:
        raise PointNotReady("the group has no data member to copy from")
    applied = {m: int(statuses[m].get("appliedIndex", 0)) for m in data_members}
    known = [int(statuses[m].get("allDurable", 0)) for m in (*data_members, *witnesses)]
    starts = [int(statuses[m].get("trimmedBelow", 0)) for m in data_members]
    floor = max(known + starts)
    donor = min(data_members, key=lambda m: (applied[m], m))
    return DonorChoice(donor, floor)


def below_floor(choice: DonorChoice, point: int) -> str | None:
    """Why the donor's latest ledger at ``point`` cannot be K yet, or None."""
    if point >= choice.floor:
        return None
    return (
        f"{choice.donor} has not applied index {choice.floor} (what the group's logs may "
        "trim) yet: it is behind or halted, and holds the new member back"
    )


def applied_everywhere(
    statuses: Mapping[str, Mapping[str, Any]], data_members: Sequence[str], index: int
) -> list[str]:
    """The data members that have not applied ``index`` yet (empty: all have)."""
    return [m for m in data_members if int(statuses.get(m, {}).get("appliedIndex", 0)) < index]
