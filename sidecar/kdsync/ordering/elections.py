"""Who leads: roles, pre-vote, votes, check-quorum, handing over, witness recovery.

Elections start with a pre-vote (Raft thesis 9.6), leaders step down when they no
longer hear a majority (check-quorum), and the election timeout backs off after every
election that ends without a leader: a member that cannot win never disturbs the
others, and elections succeed however slow the round trips become.
"""

from __future__ import annotations

from kdsync.ordering.messages import (
    PreVoteReply,
    PreVoteRequest,
    RecoverReply,
    RecoverRequest,
    TimeoutNow,
    VoteReply,
    VoteRequest,
)
from kdsync.ordering.node_state import NodeState
from kdsync.ordering.progress import NEVER, ProgressTracker
from kdsync.ordering.ready import Role


class Elections(NodeState):
    # ------------------------------------------------------------------ roles

    def _set_term(self, term: int, voted_for: str | None) -> None:
        if term != self.term or voted_for != self.voted_for:
            self.term = term
            self.voted_for = voted_for
            self._hard_dirty = True

    def _become_follower(self, term: int, leader: str | None, why: str) -> None:
        was_leader, was_role, was_term = self.leader, self.role, self.term
        self._set_term(term, None if term > self.term else self.voted_for)
        self.role = Role.FOLLOWER
        self.leader = leader
        self._timer.leader_known(self._now)
        self._leader_match = self._reported_match = 0
        self._votes.clear()
        self._tracker = None
        self._leave_asked_at = NEVER
        self._uncommitted.clear()
        self._uncommitted_bytes = 0
        self._admission.clear()
        self._admission_bytes = 0
        self._timer.reset()
        if was_role != Role.FOLLOWER or term != was_term:
            following = f"following {leader}" if leader else "no leader known"
            self._event("follower", f"{why}; {following}")
        elif leader is not None and leader != was_leader:
            self._event("follower", f"{leader} leads")
        if leader is not None and (leader != was_leader or term != was_term):
            # The same leader in a new term counts too: an entry carrying one of our
            # batches may have been overwritten by a leader of a term we never saw.
            self._on_leader_change()

    def _start_pre_vote(self) -> None:
        """Ask whether a campaign could win before starting one (Raft thesis 9.6)."""
        was_leader = self.leader
        if self.role in (Role.PRE_CANDIDATE, Role.CANDIDATE):
            # The last round ended without a leader.
            self._timer.round_failed()
        self.role = Role.PRE_CANDIDATE
        self.leader = None
        self._votes = {self.member}
        self._timer.reset()
        heard = f"no word from {was_leader}" if was_leader else "no leader"
        self._event(
            "pre-vote",
            f"{heard} for {self._timer.timeout} ticks; asking for term {self.term + 1}",
        )
        request = self._pre_vote_request()
        for peer in self._voting_peers():
            self._send(peer, request)

    def _pre_vote_request(self) -> PreVoteRequest:
        """What a pre-vote round asks: the next term, with our log's last entry."""
        return PreVoteRequest(
            self.term + 1, self.log.last_index, self.log.last_term, self.incarnation
        )

    def _campaign(self, transfer: bool = False) -> None:
        self.role = Role.CANDIDATE
        self.leader = None
        self._set_term(self.term + 1, self.member)
        self._votes = {self.member}
        self._timer.reset()
        self._event("campaign", "leadership handed over to us" if transfer else "pre-vote won")
        request = VoteRequest(
            self.term, self.log.last_index, self.log.last_term, self.incarnation, transfer
        )
        for peer in self._voting_peers():
            self._send(peer, request)

    def _voting_peers(self) -> list[str]:
        voters = self.config.voters
        return [p for p in self._peers if p in voters]

    def _has_majority(self, votes: set[str]) -> bool:
        return sum(1 for m in self.config.voters if m in votes) >= self._quorum()

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader = self.member
        self._timer.leader_known(self._now)
        self._transfer_sent_at = NEVER
        self._handover_hold_at = NEVER
        self._led_since = self._now
        self._tracker = ProgressTracker(self._peers, self.log.last_index + 1, self._now)
        self._term_start = self.log.last_index + 1  # where our no-op goes, below
        self._commit_marks.clear()
        self._uncommitted = {}
        self._uncommitted_bytes = 0
        for index in range(self.commit_index + 1, self.log.last_index + 1):
            self._track_uncommitted(self.log.entry(index))
        self._event("leader", f"won with votes of {sorted(self._votes)}")
        # A no-op in the new term lets earlier entries commit (Raft, section 5.4.2).
        self._append_local(None)
        self._on_leader_change()

    def _lost_quorum(self) -> bool:
        """Check-quorum: a leader that heard from no majority within an election timeout
        steps down, so a member cut off on one side cannot keep the others waiting."""
        if not self.timing.check_quorum or self._tracker is None:
            return False
        window = 2 * self.timing.election_ticks << self._timer.level
        if self._now - self._led_since < window:
            return False
        config = self.config
        heard = self._tracker.acked_since(self._now - window, config.voters) + 1
        if heard >= self._quorum():
            return False
        self._become_follower(
            self.term,
            None,
            f"stepped down: only {heard} of {len(config.voters)} voting members "
            f"answered within {window} ticks",
        )
        return True

    def _on_leader_change(self) -> None:
        # Batches sent to an earlier leader may have died with its term: offer them again.
        self.outbox.offer_again()
        self._flush_outbox()

    # ------------------------------------------------------------------ votes

    def _log_is_current(self, last_index: int, last_term: int) -> bool:
        return (last_term, last_index) >= (self.log.last_term, self.log.last_index)

    def _leader_is_alive(self, transfer: bool = False) -> bool:
        """Refuse campaigns while a live leader is known (Raft thesis 4.2.3): a member
        that fell behind or was cut off must not depose a leader the rest of the group
        still follows. Refusing is always safe; a requested handover is not refused."""
        if transfer:
            return False
        horizon = self._now - self.timing.election_ticks
        if self.role == Role.LEADER:
            assert self._tracker is not None
            voters = self.config.voters
            return self._tracker.acked_since(horizon, voters) + 1 >= self._quorum()
        leader = self.leader
        return (
            self.role == Role.FOLLOWER
            and leader is not None
            and self._heard_at.get(leader, NEVER) >= horizon
        )

    def _on_pre_vote_request(self, candidate: str, request: PreVoteRequest) -> None:
        # Neither our term nor our timer changes: a pre-vote disturbs nobody.
        alive = self._leader_is_alive()
        grant = (
            request.term > self.term
            and not alive
            and self._log_is_current(request.last_index, request.last_term)
        )
        if not grant and request.term > self.term:
            reason = (
                "a live leader is known"
                if alive
                else f"its log ({request.last_term}, {request.last_index}) is behind ours "
                f"({self.log.last_term}, {self.log.last_index})"
            )
            self._event(
                "vote-refused", f"pre-vote of {candidate} for term {request.term}: {reason}"
            )
            if not alive:
                self._ask_again(candidate, request.term)
        self._send(candidate, PreVoteReply(self.term, grant, request.incarnation))

    def _ask_again(self, voter: str, its_term: int) -> None:
        """Send ``voter`` our pre-vote request again, if a pre-vote round of ours is under
        way: it asks for votes it cannot win (its log is behind ours), so it is up, and it
        may have been down when we asked. Without this the round waits for our timeout,
        which rounds nobody could answer have backed off (a two-member group whose other
        member restarted waited 8-16 election timeouts). Only a voter of ours is asked, and
        only one in no higher term than the round's: its refusal would carry its term and
        turn us into a follower, the disturbance a pre-vote must not cause."""
        if self.role != Role.PRE_CANDIDATE or voter not in self._voting_peers():
            return
        request = self._pre_vote_request()
        if its_term <= request.term:
            self._send(voter, request)

    def _on_pre_vote_reply(self, voter: str, reply: PreVoteReply) -> None:
        if reply.incarnation != self.incarnation:
            return
        if not reply.granted:
            if reply.term > self.term:
                self._become_follower(reply.term, None, f"{voter} is in term {reply.term}")
            return
        if self.role != Role.PRE_CANDIDATE:
            return
        self._votes.add(voter)
        if self._has_majority(self._votes):
            self._campaign()

    def _on_vote_request(self, candidate: str, request: VoteRequest) -> None:
        current = self._log_is_current(request.last_index, request.last_term)
        grant = (
            request.term == self.term
            and request.term > self._vote_withheld_term
            and self.voted_for in (None, candidate)
            and current
        )
        if grant:
            self._set_term(self.term, candidate)
            self._timer.reset()
        elif request.term == self.term and not current:
            self._event(
                "vote-refused",
                f"{candidate}'s log ({request.last_term}, {request.last_index}) is behind ours "
                f"({self.log.last_term}, {self.log.last_index})",
            )
        self._send(candidate, VoteReply(self.term, grant, request.incarnation))

    def _on_vote_reply(self, voter: str, reply: VoteReply) -> None:
        if (
            self.role != Role.CANDIDATE
            or reply.term != self.term
            or reply.incarnation != self.incarnation
            or not reply.granted
        ):
            return
        self._votes.add(voter)
        if self._has_majority(self._votes):
            self._become_leader()

    # ------------------------------------------------------------------ handing over

    def _maybe_hand_over(self) -> None:
        """A witness leader hands leadership to a caught-up data member as soon as there
        is one; so does a leader asked to remove itself from the group, and a data member
        whose own destination has fallen far behind one that writes faster (halted, say):
        the group then goes on at the faster pace."""
        tracker = self._tracker
        assert tracker is not None
        if self._handover_sent_lately():
            return
        # Only to a member that answered lately: one that went down keeps its old match,
        # and handing over to it again and again would keep admission paused for good.
        recently = self._now - self.timing.election_ticks
        caught_up = [
            p
            for p in self.config.data_voters
            if p != self.member
            and tracker[p].match == self.log.last_index
            and tracker[p].acked_at >= recently
        ]
        if self.commit_index != self.log.last_index or not caught_up:
            if (
                (self.ledger is None or self._leaving())
                and not self._within_handover_window(self._handover_hold_at)
                and any(
                    tracker[p].acked_at >= recently
                    for p in self.config.data_voters
                    if p != self.member
                )
            ):
                # Must hand over, and nobody is caught up: admit nothing new for a while
                # (``_transferring``), so one can be. Resent batches of a member behind,
                # which a witness cannot tell from new ones, would otherwise keep the
                # log growing ahead of everyone for as long as traffic lasts. The hold
                # does not delay the handover, which goes at the first heartbeat that
                # finds a member caught up (docs/ordering.md: it once waited for the
                # lapse, and under steady traffic never went).
                self._handover_hold_at = self._now
            return
        target = max(caught_up, key=lambda p: tracker[p].applied)
        if self.ledger is not None and not self._leaving():
            behind = self.commit_index - self._durable_applied > 2 * self.timing.max_unapplied
            if not (behind and tracker[target].applied > self._durable_applied):
                return
        self._transfer_sent_at = self._now
        self._event("step-down", f"handing leadership to {target}")
        self._send(target, TimeoutNow(self.term))

    def _within_handover_window(self, since: int) -> bool:
        """Less than two election timeouts have passed since tick ``since``: how long a
        handover, or a hold before one, lasts."""
        return self._now - since < 2 * self.timing.election_ticks

    def _handover_sent_lately(self) -> bool:
        """A TimeoutNow went within the window: the handover is under way."""
        return self._within_handover_window(self._transfer_sent_at)

    def _transferring(self) -> bool:
        """A handover was asked for lately, or is being prepared: admit nothing new
        meanwhile (as etcd does), or the target's log falls behind ours and our vote
        refuses it."""
        held = self._within_handover_window(self._handover_hold_at)
        return held or self._handover_sent_lately()

    # ------------------------------------------------------------------ witness recovery

    def _send_recover_requests(self) -> None:
        assert self._recovery is not None
        for peer, request in self._recovery.requests(self.term):
            self._send(peer, request)

    def _on_recover_reply(self, sender: str, reply: RecoverReply) -> None:
        assert self._recovery is not None
        outcome = self._recovery.reply(sender, reply, self.term)
        if isinstance(outcome, RecoverRequest):
            self._send(sender, outcome)  # the next part of its answer
            return
        if outcome is None:
            for peer, request in self._recovery.new_requests(self.term):
                self._send(peer, request)  # members an answer named for the first time
            return
        self.log.reset(outcome.commit_index, outcome.commit_term, list(outcome.entries))
        self.commit_index = outcome.commit_index
        self._start_over_configs(outcome.commit_index, outcome.config, outcome.commit_index)
        self._configs_changed(outcome.commit_index + 1, list(outcome.entries))
        # We may have voted in `term` before we lost our memory: do not vote in it again.
        self._vote_withheld_term = outcome.term
        self._set_term(outcome.term, None)
        self.role = Role.FOLLOWER
        self._recovery = None
        self._event("follower", f"recovered from every member, term {outcome.term}")
        self._timer.reset()
