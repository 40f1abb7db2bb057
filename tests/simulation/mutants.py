"""Deliberately broken variants of the ordering protocol, to prove the simulator has teeth.

Each one removes one safeguard the protocol depends on; the simulator must catch each.
They exist only here, in the tests: the product never imports them.
"""

from __future__ import annotations

from kdsync.ordering import (
    GroupSpec,
    LedgerState,
    OrderingNode,
    RecoveredState,
    Role,
    Timing,
)
from kdsync.ordering.messages import Append


class DeliverBeforeCommit(OrderingNode):
    """Followers deliver what they have appended, before a majority has stored it."""

    def _on_append(self, leader: str, append: Append) -> None:
        super()._on_append(leader, append)
        if self.role == Role.FOLLOWER and self.log.term_at(self.log.last_index) == append.term:
            self._advance_commit(self.log.last_index)


class VoteWithoutLogCheck(OrderingNode):
    """Votes for any candidate, even one missing committed entries (skips the view-change
    agreement on what the new leader must hold)."""

    def _log_is_current(self, last_index: int, last_term: int) -> bool:
        return True


class ForgetMarksOnRestart(OrderingNode):
    """Restarts without the dedup marks that were persisted with the global topics."""

    def __init__(
        self,
        member: str,
        group: GroupSpec,
        timing: Timing,
        incarnation: int,
        recovered: RecoveredState | None = None,
    ) -> None:
        if recovered is not None:
            ledger = recovered.ledger
            amnesic = LedgerState(ledger.applied_index, ledger.applied_term, {}, ledger.next_seq)
            recovered = RecoveredState(recovered.hard_state, amnesic, recovered.entries)
        super().__init__(member, group, timing, incarnation, recovered)


class WitnessWithoutRecovery(OrderingNode):
    """A restarted witness votes and acknowledges at once, with an empty memory."""

    def __init__(
        self,
        member: str,
        group: GroupSpec,
        timing: Timing,
        incarnation: int,
        recovered: RecoveredState | None = None,
    ) -> None:
        super().__init__(member, group, timing, incarnation, recovered)
        if self.is_witness:
            self.role = Role.FOLLOWER
            self._ready.messages.clear()


MUTANTS: dict[str, type[OrderingNode]] = {
    "deliver-before-commit": DeliverBeforeCommit,
    "vote-without-log-check": VoteWithoutLogCheck,
    "forget-marks-on-restart": ForgetMarksOnRestart,
    "witness-without-recovery": WitnessWithoutRecovery,
}
