"""Changing who is in the group: single-server changes with learners (Ongaro's
dissertation, section 4), proposed on the leader and carried by the log.

- A change takes effect where its entry is appended, on every member (``config``).
- One change at a time: a leader proposes one only when the previous one has committed,
  and only once an entry of its own term has (the known fix to single-server changes:
  without it, a change proposed by a new leader could decide alongside one its
  predecessor appended but never committed).
- A new data member joins as a learner: it stores and applies but neither votes nor
  counts. The leader makes it a voter once it holds what was committed an election
  timeout ago, or is within one Append of the commit index.
- A leader asked to remove itself hands leadership over first; the change is then
  proposed again on the new leader (the shell retries on whoever leads).
"""

from __future__ import annotations

from kdsync.ordering.configuration import Configuration, change_problem
from kdsync.ordering.log import Entry
from kdsync.ordering.node_state import NodeState
from kdsync.ordering.ready import Role


class Membership(NodeState):
    def propose_configuration(self, proposed: Configuration) -> str | None:
        """Append ``proposed`` as the next configuration; None when appended, else why
        not (the caller asks again later, or the leader: each reason says which)."""
        if self.role != Role.LEADER:
            where = f"{self.leader} leads" if self.leader else "no leader is known"
            return f"only the leader changes the membership; {where}"
        if self.change_pending:
            return "the previous membership change has not committed yet"
        if self.commit_index < self._term_start:
            return "this leader has not committed an entry of its own term yet"
        problem = change_problem(self.config, proposed)
        if problem is not None:
            return problem
        if not proposed.is_voter(self.member):
            self._leave_asked_at = self._now
            self._maybe_hand_over()
            return "the change removes the leader: it hands leadership over first; ask again"
        self._append_config(proposed)
        return None

    @property
    def change_pending(self) -> bool:
        """A membership change is appended and not yet committed."""
        return bool(self._configs) and self._configs[-1][0] > self.commit_index

    def _append_config(self, config: Configuration) -> None:
        self._replication_due = True
        index = self.log.last_index + 1
        entry = Entry(index, self.term, None, config)
        self.log.append(entry)
        self._mark_persist(index)
        self._configs_changed(index, [entry])

    def _maybe_promote_learner(self) -> None:
        """On a leader's heartbeat: a learner that has caught up becomes a voter.

        Caught up means it answered lately and holds what was committed an election
        timeout ago, or is within one Append of the commit index. A distance in entries
        alone never passed under steady traffic for a learner whose log writes (or link)
        are slower than the voters': it trails by its write time's worth of entries
        (tests/simulation/test_learner_promotion.py). Its time behind is what matters: a
        new voter behind by less than an election timeout is as good as any."""
        config = self.config
        tracker = self._tracker
        marks = self._commit_marks
        marks.append((self._now, self.commit_index))
        horizon = self._now - self.timing.election_ticks
        while len(marks) > 1 and marks[1][0] <= horizon:
            marks.popleft()  # keep the last mark at or before the horizon
        committed_then = marks[0][1] if marks[0][0] <= horizon else None
        if (
            not config.learners
            or tracker is None
            or self.change_pending
            or self.commit_index < self._term_start
            # A config entry now would put our log ahead of the target's, which would
            # then lose its vote: promote once the handover is over.
            or self._handover_sent_lately()
        ):
            return
        window = self.timing.max_entries_per_append
        for learner in config.learners:
            progress = tracker[learner]
            close = progress.match + window >= self.commit_index
            held_then = committed_then is not None and progress.match >= committed_then
            if progress.acked_at >= horizon and (close or held_then):
                self._append_config(config.promoted(learner))
                return
