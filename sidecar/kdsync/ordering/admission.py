"""Admission: batches from the origins' outboxes into the leader's log.

Overload slows the sources, never the heartbeats: an origin has a bounded window of
batches travelling to the leader (``Outbox``), and the leader admits new batches only
while the group's applying keeps up and its uncommitted entries stay within
``max_uncommitted`` batches and ``max_uncommitted_bytes`` (they cannot leave memory),
and not while it hands leadership over.
"""

from __future__ import annotations

from kdsync.ordering.events import OriginBatch
from kdsync.ordering.messages import Forward
from kdsync.ordering.node_state import NodeState
from kdsync.ordering.outbox import batch_key
from kdsync.ordering.ready import Role


class Admission(NodeState):
    def _on_forward(self, forward: Forward) -> None:
        if self.role != Role.LEADER:
            return  # the origin offers again once it learns who leads
        # Bounded in batches and bytes: while admission is refused, origins resend what
        # they forwarded, and the duplicates must not pile up here (the rest is dropped;
        # origins offer it again).
        for batch in forward.batches:
            full = self._admission_bytes >= self.timing.max_uncommitted_bytes
            if len(self._admission) >= 2 * self.timing.max_uncommitted or (
                self._admission and full
            ):
                break
            self._admission.append(batch)
            self._admission_bytes += batch.size_bytes()
        self._admit()

    def _admit(self) -> None:
        while self._admission and self._accept_batch(self._admission[0]):
            self._admission_bytes -= self._admission.popleft().size_bytes()

    def _may_admit(self) -> bool:
        if self.log.last_index - self.commit_index >= self.timing.max_uncommitted:
            return False
        if self._uncommitted and self._uncommitted_bytes >= self.timing.max_uncommitted_bytes:
            return False  # uncommitted entries never leave memory: bounded here
        if self._transferring():
            return False
        assert self._tracker is not None
        if self.ledger is not None:
            own = self._durable_applied
        else:  # a witness leads only briefly; it waits for whoever applies
            own = max((pr.applied for pr in self._tracker.peers.values()), default=0)
        since = self._now - self.timing.election_ticks
        applied = self._tracker.applied_by_half(self.config.data_voters, self.member, own, since)
        return self.commit_index - applied < self.timing.max_unapplied

    def _accept_batch(self, batch: OriginBatch) -> bool:
        if batch.origin not in self.config.data_members:
            # A member removed, that may not know it yet: its events stay out of the
            # order from its removal on (``kdsync members remove`` drains it first).
            return True
        if self.ledger is not None and self.ledger.covers(batch):
            return True  # already delivered: ordering it again would only be dropped
        if batch_key(batch) in self._uncommitted:
            return True
        if not self._may_admit():
            return False
        self._append_local(batch)
        return True

    def _flush_outbox(self) -> None:
        if not len(self.outbox) or self.role == Role.RECOVERING:
            return
        if self.role == Role.LEADER:
            due = self.outbox.due(self._now)
            for position, batch in enumerate(due):
                if not self._accept_batch(batch):
                    for refused in due[position:]:
                        self.outbox.retract(batch_key(refused))
                    return
                self.outbox.appended(batch_key(batch))
            return
        if self.leader is None:
            return
        due = self.outbox.due(self._now)
        if due:
            self._send(self.leader, Forward(self.term, tuple(due)))
