"""Who is in a group at a point of its log: voters (data members and witnesses) and
non-voting learners, and the one-member-at-a-time rule for changing it.

A configuration travels as a log entry (``Entry.config``). Every member uses the latest
configuration in its log, committed or not, and the one before it again if that entry is
truncated (Ongaro's dissertation, section 4.1): a change takes effect where it is
appended, so two configurations never decide at once as long as each differs from the
one before by a single voter, and a leader proposes a change only once the previous one
committed (see docs/ordering.md, "Membership changes").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class ConfigurationError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Configuration:
    """``voters`` vote and count towards majorities; ``witnesses`` are the voters that own
    no Kafka cluster; ``learners`` are data members that store and apply every entry but
    neither vote nor count, until they are made voters (a new member catching up).

    ``addresses`` (member, ``host:port``) says where members added at runtime listen, as
    etcd's ConfChange context does: the entry carries it to every member, a restart
    finds it in the ledger, and the core never reads it (the shells dial it)."""

    voters: tuple[str, ...]
    witnesses: frozenset[str] = frozenset()
    learners: tuple[str, ...] = ()
    addresses: tuple[tuple[str, str], ...] = ()
    _data: tuple[str, ...] = field(default=(), init=False, compare=False, repr=False)
    _data_voters: tuple[str, ...] = field(default=(), init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        data_voters = tuple(m for m in self.voters if m not in self.witnesses)
        object.__setattr__(self, "_data_voters", data_voters)
        object.__setattr__(self, "_data", data_voters + self.learners)

    def problems(self) -> list[str]:
        """What makes this configuration unusable; empty when it is fine."""
        found: list[str] = []
        names = [*self.voters, *self.learners]
        if len(set(names)) != len(names):
            found.append(f"member names must be unique: {names}")
        if len(self.voters) < 2:
            found.append("a group needs at least 2 voting members")
        if self.witnesses - set(self.voters):
            found.append(f"witnesses {sorted(self.witnesses - set(self.voters))} are not voters")
        if len(self.witnesses) >= len(self._data_voters):
            # Committed entries must always reach a member that keeps them durably.
            found.append("a group needs more voting data members than witnesses")
        named = [m for m, _ in self.addresses]
        strangers = sorted(set(named) - set(names))
        if strangers:
            found.append(f"addresses given for {strangers}, who are not members")
        if len(set(named)) != len(named):
            found.append(f"one address per member: {sorted(named)}")
        return found

    @property
    def members(self) -> tuple[str, ...]:
        """Everyone a leader replicates to: voters, then learners."""
        return self.voters + self.learners

    @property
    def data_members(self) -> tuple[str, ...]:
        """Members that keep the log and apply it: data voters and learners."""
        return self._data

    @property
    def data_voters(self) -> tuple[str, ...]:
        return self._data_voters

    @property
    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def is_witness(self, member: str) -> bool:
        return member in self.witnesses

    def is_voter(self, member: str) -> bool:
        return member in self.voters

    def address_of(self, member: str) -> str | None:
        """Where ``member`` listens, if it was added at runtime with an address."""
        return dict(self.addresses).get(member)

    def _addresses_with(self, member: str, address: str | None) -> tuple[tuple[str, str], ...]:
        kept = tuple((m, a) for m, a in self.addresses if m != member)
        return (*kept, (member, address)) if address is not None else kept

    def with_learner(self, member: str, address: str | None = None) -> Configuration:
        """A new data member added, as a learner until it has caught up."""
        return Configuration(
            self.voters,
            self.witnesses,
            (*self.learners, member),
            self._addresses_with(member, address),
        )

    def with_witness(self, member: str, address: str | None = None) -> Configuration:
        """A new witness added: it votes from the start (it has nothing to catch up)."""
        return Configuration(
            (*self.voters, member),
            self.witnesses | {member},
            self.learners,
            self._addresses_with(member, address),
        )

    def promoted(self, learner: str) -> Configuration:
        """``learner`` made a voter."""
        return Configuration(
            (*self.voters, learner),
            self.witnesses,
            tuple(m for m in self.learners if m != learner),
            self.addresses,
        )

    def without(self, member: str) -> Configuration:
        """``member`` removed, whatever it was (its address too)."""
        return Configuration(
            tuple(m for m in self.voters if m != member),
            self.witnesses - {member},
            tuple(m for m in self.learners if m != member),
            self._addresses_with(member, None),
        )

    def as_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "voters": list(self.voters),
            "witnesses": sorted(self.witnesses),
            "learners": list(self.learners),
        }
        if self.addresses:
            found["addresses"] = dict(self.addresses)
        return found

    def describe(self) -> str:
        parts = [f"{m} (witness)" if m in self.witnesses else m for m in self.voters] + [
            f"{m} (learner)" for m in self.learners
        ]
        return ", ".join(parts)


def change_problem(current: Configuration, proposed: Configuration) -> str | None:
    """Why ``proposed`` may not follow ``current`` in one step; None when it may.

    One step changes one member: add a learner (only while no other is joining) or a
    witness, make a learner a voter, or remove one member. Any two majorities of
    configurations one voter apart overlap, which is what makes a change safe without a
    joint configuration."""
    problems = proposed.problems()
    if problems:
        return "; ".join(problems)
    if proposed == current:
        return "it is the configuration in force already"
    before, after = set(current.members), set(proposed.members)
    changed = (before ^ after) | {
        m
        for m in before & after
        if current.is_voter(m) != proposed.is_voter(m)
        or current.is_witness(m) != proposed.is_witness(m)
    }
    if len(changed) != 1:
        return f"it changes {len(changed)} members ({sorted(changed)}); change one at a time"
    (member,) = changed
    if member in after - before:
        if proposed.is_voter(member) and not proposed.is_witness(member):
            return f"a new data member ({member}) joins as a learner first"
        if current.learners and not proposed.is_voter(member):
            # Each backfill needs every data member of the configuration to answer, and a
            # learner waiting for its own backfill cannot: two would wait for each other.
            joining = ", ".join(current.learners)
            return (
                f"{joining} is still joining as a learner: add {member} once it votes, or "
                "remove it first (one data member joins at a time)"
            )
        return None
    if member in before & after:
        if current.is_witness(member) != proposed.is_witness(member):
            return f"{member} cannot change between witness and data member; remove it first"
        if current.is_voter(member) and not proposed.is_voter(member):
            return f"a voter ({member}) is removed, not made a learner again"
    return None
