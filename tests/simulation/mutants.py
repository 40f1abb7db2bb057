"""Deliberately broken variants of the ordering protocol, to prove the simulator has teeth.

Each one removes one safeguard the protocol depends on; the simulator must catch each.
They exist only here, in the tests: the product never imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from kdsync.driver import DriverLimits, DriverPorts, MemberDriver
from kdsync.ordering import (
    GroupSpec,
    LedgerState,
    OrderingNode,
    RecoveredState,
    Role,
    Timing,
)
from kdsync.ordering.events import OriginBatch
from kdsync.ordering.ledger import BatchVerdict
from kdsync.ordering.messages import Append, RecoverReply, RecoverRequest
from kdsync.ordering.outbox import Outbox
from kdsync.ordering.witness import RecoveredWitness, WitnessRecovery


class DeliverBeforeCommit(OrderingNode):
    """Followers deliver what they have appended, before a majority has stored it."""

    def _on_append(self, leader: str, append: Append) -> None:
        super()._on_append(leader, append)
        if self.role == Role.FOLLOWER and self.log.term_at(self.log.last_index) == append.term:
            self._advance_commit(self.log.last_index)


class CompactsUncommittedEntries(OrderingNode):
    """A follower over its memory bound drops from memory every entry it has stored,
    committed or not (it forgets the commit bound), and so takes them for committed."""

    def _compact(self) -> None:
        over = self.log.bytes > self.timing.max_log_bytes
        if self.ledger is not None and self.role == Role.FOLLOWER and over:
            upto = self._durable_end()
            if upto > self.log.snapshot_index:
                self.log.compact(upto)
                self.commit_index = max(self.commit_index, upto)
        super()._compact()


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


class _OutboxBlindToCommits(Outbox):
    def committed(self, batch: OriginBatch) -> bool:
        return True


class LearnsOwnBatchesOnlyWhenApplied(OrderingNode):
    """An origin settles its outbox, and hears of a gap among its own batches, only when
    it applies them (the core before the simulator halted members): while its T-global
    refuses writes it applies nothing, so a batch the leader skipped is never offered
    again and its window fills with batches the leader already holds; the others stop
    receiving its events."""

    def __init__(
        self,
        member: str,
        group: GroupSpec,
        timing: Timing,
        incarnation: int,
        recovered: RecoveredState | None = None,
    ) -> None:
        super().__init__(member, group, timing, incarnation, recovered)
        self.outbox = _OutboxBlindToCommits(
            timing.max_outbox,
            timing.max_outbox_bytes,
            timing.max_forward,
            timing.resend_ticks,
            timing.max_forward_bytes,
        )

    def _apply_committed(self) -> None:
        handed = len(self._ready.deliveries)
        super()._apply_committed()
        ledger = self.ledger
        for delivery in self._ready.deliveries[handed:]:
            where = delivery.origin_partition
            if ledger is not None and where is not None and where[0] == self.member:
                self.outbox.settle(where, ledger.marks.get(where, 0))
                if delivery.verdict == BatchVerdict.GAP:
                    self.outbox.offer_again()


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


class SplicingRecovery(WitnessRecovery):
    """Takes every part of an answer as the continuation of what it holds, without
    checking that the part starts where the held entries end (log matching)."""

    def reply(
        self, sender: str, reply: RecoverReply, term: int
    ) -> RecoveredWitness | RecoverRequest | None:
        partial = self._partial.get(sender)
        if partial is not None and reply.nonce == self._out.get(sender):
            index, entry_term = partial.last()
            reply = replace(reply, prev_index=index, prev_term=entry_term)
        return super().reply(sender, reply, term)


class CommitByCountingOldTerms(OrderingNode):
    """A leader commits an entry of an earlier term once a majority stores it, without an
    entry of its own term on top (the "figure 8" of the Raft paper): a later leader that
    never had the entry can overwrite it after it was applied."""

    def _leader_commit(self) -> None:
        assert self._tracker is not None
        majority_index = self._tracker.quorum_match(
            self._own_durable(), self.config.voters, self.member, self._quorum()
        )
        if majority_index > self.commit_index:
            self._advance_commit(majority_index)


class ElectionsWithoutPreVoteOrBackoff(OrderingNode):
    """Campaigns straight away on every election timeout, with a timeout that never
    grows (the protocol before issue #11): when writing a vote takes longer than an
    election timeout, every round of votes outlasts the timeout that started it, terms
    climb and no leader is ever elected."""

    def _start_pre_vote(self) -> None:
        self._timer.level = 0
        self._campaign()


class CountsStartupMajority(OrderingNode):
    """Counts majorities as the group's startup file has it, whatever members were added
    or removed since: a group grown from 3 to 5 commits with 2 copies and elects with 2
    votes, so two majorities need not overlap; one shrunk from 5 to 3 needs all 3."""

    def _quorum(self) -> int:
        return len(self.group.members) // 2 + 1


# Broken variants of the member driver, run by the simulator exactly as it runs the real
# one: the bookkeeping around the core is where exactly-once lives.


class AppliedBeforeCommit(MemberDriver):
    """Marks entries applied when their transaction starts, not when it commits: the
    in-memory log is compacted and the durable log trimmed of entries that are not yet in
    T-global, and a crash before the commit leaves nobody able to replay them."""

    def _maybe_write(self) -> None:
        super()._maybe_write()
        taken = self._writing
        if taken:
            index = taken[-1].deliveries[-1].index
            self.state.durable_applied = max(self.state.durable_applied, index)
            self.node.applied(index)


class DropHeldBatch(MemberDriver):
    """A batch the core refuses (its outbox is full) is dropped instead of held: the
    source reader has moved past it, so those events are never offered again."""

    def _offer_sources(self) -> None:
        source = self.ports.source
        if source is None:
            return
        while (batch := source.take()) is not None:
            if self.node.offer(batch):
                self.state.events_in += len(batch.events)


class PositionsAheadOfLedger(MemberDriver):
    """Commits the source positions of the newest delivered chunk, not of the one just
    written: the consumer group's offsets run ahead of what T-global holds."""

    def transaction_committed(self) -> None:
        newest = self._chunks[-1].ledger if self._chunks else None
        super().transaction_committed()
        if newest is not None and self.ports.source is not None:
            self.ports.source.commit(newest.positions_of(self.node.member))


def _driver(cls: type[MemberDriver]) -> Callable[..., MemberDriver]:
    def make(
        node: OrderingNode, ports: DriverPorts, limits: DriverLimits, ledger: LedgerState | None
    ) -> MemberDriver:
        return cls(node, ports, limits, recovered_ledger=ledger)

    return make


MUTANTS: dict[str, type[OrderingNode]] = {
    "deliver-before-commit": DeliverBeforeCommit,
    "vote-without-log-check": VoteWithoutLogCheck,
    "forget-marks-on-restart": ForgetMarksOnRestart,
    "witness-without-recovery": WitnessWithoutRecovery,
    "compacts-uncommitted-entries": CompactsUncommittedEntries,
    "learns-own-batches-only-when-applied": LearnsOwnBatchesOnlyWhenApplied,
    "elections-without-pre-vote-or-backoff": ElectionsWithoutPreVoteOrBackoff,
    # Caught by the leader-churn scenarios, which aim at leader changes at commit time;
    # tests/unit/test_ordering_node.py also plays figure 8 step by step.
    "commit-old-terms-by-counting": CommitByCountingOldTerms,
    # Membership changes (docs/ordering.md, "Membership changes").
    "counts-startup-majority": CountsStartupMajority,
}

# A witness's recovery on its own: tests/unit/test_witness_recovery_parts.py must catch it.
# The simulator did (after 217 seeds) while a recovering witness took every copy of an
# answer that started afresh; since it keeps one request out per member (seed 6017355),
# a log overwritten between two parts comes up a few times in 4,000 seeds and the
# spliced logs did no harm there within 4,000 seeds.
RECOVERY_MUTANTS: dict[str, type[WitnessRecovery]] = {
    "witness-splices-recovery-parts": SplicingRecovery,
}

DRIVER_MUTANTS: dict[str, Callable[..., MemberDriver]] = {
    "applied-before-commit": _driver(AppliedBeforeCommit),
    "drop-held-batch": _driver(DropHeldBatch),
    "positions-ahead-of-ledger": _driver(PositionsAheadOfLedger),
}
