"""What one round of continuous group offset sync writes into this member (pure).

The sidecar of member B keeps selected consumer groups of ``T-global`` in step with the
other data members: for each group, it translates the group's committed offsets in every
other member A onto B (``kdsync.failover.translation``, exact by ``kdsync.seq``) and
plans the writes here. A partition's offset is written only when

- the group has no active member in B: a consumer there owns its own position (and
  Kafka refuses the write anyway);
- some member's translation is ``EXACT``: an offset B has not delivered yet (``BEHIND``)
  waits for a later round, and deleted or disagreeing records are never guessed at;
- the best exact offset is strictly greater than the group's committed offset in B: a
  group never moves backwards. Exact translations of positions in several members are
  all true positions in B, so the greatest is the furthest the group has read anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from kdsync.failover.translation import GroupTranslation, Outcome

Partition = tuple[str, int]


class Skip(Enum):
    """Why a partition the group has read elsewhere is not written in B this round."""

    ACTIVE = "active in this member"  # the group has members here: its position is theirs
    WAITING = "not delivered here yet"  # B lacks the records the group has read: later
    NOT_EXACT = "no exact position"  # deleted by retention, or the members disagree


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """One group's writes into B, and the partitions B cannot follow yet, with why.

    A partition can be in both: one member's exact position is written while another
    member's group has read further than B has delivered (``WAITING``).
    """

    group: str
    writes: Mapping[Partition, int] = field(default_factory=dict)
    skipped: Mapping[Partition, Skip] = field(default_factory=dict)
    details: Mapping[Partition, str] = field(default_factory=dict)  # the last non-exact

    @property
    def in_step(self) -> bool:
        """B holds the furthest position of every partition (after ``writes``)."""
        return not self.skipped


def plan_group(
    group: str,
    translations: Sequence[GroupTranslation],
    target_committed: Mapping[Partition, int],
    target_active: bool,
) -> GroupPlan:
    """The writes for ``group`` in B, from its translations out of the other members.

    ``target_committed`` is the group's committed offsets in B (partitions without one
    left out); ``target_active`` whether the group has members in B right now.
    """
    best: dict[Partition, int] = {}
    skipped: dict[Partition, Skip] = {}
    details: dict[Partition, str] = {}
    for translation in translations:
        for p in translation.partitions:
            where = (p.topic, p.partition)
            if p.outcome is Outcome.NO_OFFSET:
                continue
            if p.outcome is Outcome.EXACT and p.target_offset is not None:
                best[where] = max(best.get(where, p.target_offset), p.target_offset)
                continue
            # A BEHIND position is past everything B holds, so no exact one covers it.
            reason = Skip.WAITING if p.outcome is Outcome.BEHIND else Skip.NOT_EXACT
            if skipped.get(where) is not Skip.WAITING:  # WAITING resolves by itself
                skipped[where] = reason
            details[where] = f"from {translation.source}: {p.outcome.value} {p.detail}".strip()
    writes: dict[Partition, int] = {}
    for where, offset in best.items():
        current = target_committed.get(where)
        if current is not None and offset <= current:
            continue  # never backwards; equal is already in step
        writes[where] = offset
    if target_active:
        # A consumer here owns the group's position: nothing is written, not even later
        # partitions (the group's offsets move together or not at all).
        for where in writes:
            skipped[where] = Skip.ACTIVE
        writes = {}
    return GroupPlan(group, writes, skipped, details)
