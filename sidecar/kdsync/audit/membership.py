"""Which data members the audit checks: the group's members in force, from the ledgers.

The config file only seeds a group's membership: ``kdsync members add|remove`` changes it
at runtime, and every data member's ledger records the latest configuration it applied.
The ledger that applied the most log entries names the members in force; their
``T-global`` is checked. A member that left stays an origin: its events are in everyone's
``T-global`` and are checked against its own topic while its cluster can still be read,
but its ``T-global`` stopped following the group and is not a replica any more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kdsync.ordering import LedgerState


class MembershipProblem(ValueError):
    """The ledgers name a member the config file cannot reach (the message says the fix)."""


@dataclass(frozen=True)
class AuditMembership:
    """``checked``: the data members in force, in the config file's order; ``departed``:
    data members that left the group (in the file, or origins the ledger still marks);
    ``config_index``: the log index of the configuration in force (0: the file's seed);
    ``source``: the member whose ledger said so (None: no ledger records a change)."""

    checked: tuple[str, ...]
    departed: tuple[str, ...] = ()
    config_index: int = 0
    source: str | None = None
    # Learners not seeded yet (no ledger: their backfill runs): not read at all.
    joining: tuple[str, ...] = ()


def membership_in_force(
    file_members: Sequence[str], ledgers: Mapping[str, LedgerState | None]
) -> AuditMembership:
    """The membership the audit checks, from the file's data members and the ledgers read
    (member -> its latest ledger, None when it has none yet)."""
    newest: tuple[int, int, str] | None = None
    for name, ledger in ledgers.items():
        if ledger is not None and ledger.config is not None:
            candidate = (ledger.applied_index, ledger.config_index, name)
            if newest is None or candidate[:2] > newest[:2]:
                newest = candidate
    if newest is None:
        return AuditMembership(checked=tuple(file_members))
    source = newest[2]
    ledger = ledgers[source]
    assert ledger is not None and ledger.config is not None
    config = ledger.config
    # A learner is checked once a backfill seeded it (it has a ledger); before, its
    # T-global is a copy under way, partition by partition.
    # Joining: its cluster answered without a ledger, or the file does not list it (the
    # audit's file may predate it). One whose cluster did not answer stays in force: the
    # planning then stops on it, rather than skip a member that may be seeded.
    joining = tuple(
        m for m in config.learners if m not in file_members or (m in ledgers and ledgers[m] is None)
    )
    in_force = [m for m in config.data_members if m not in joining]
    unknown = [m for m in in_force if m not in file_members]
    if unknown:
        raise MembershipProblem(
            f"member {source}'s ledger names data member(s) {', '.join(unknown)} in the "
            f"group's configuration (log index {ledger.config_index}), but the config file "
            "does not list them: add each to members[] with its kafka section"
        )
    marked = {origin for origin, _, _ in ledger.marks}
    departed = sorted((set(file_members) | marked) - set(in_force) - set(joining))
    return AuditMembership(
        checked=tuple(m for m in file_members if m in in_force),
        departed=tuple(departed),
        config_index=ledger.config_index,
        source=source,
        joining=joining,
    )
