"""One member's ordering state machine: Raft over origin batches, sans I/O.

Inputs: ``tick()``, ``receive(sender, message)``, ``offer(batch)``, ``persisted(index)``,
``applied(index)`` and ``entries_loaded(entries)``. Outputs accumulate until ``ready()``
returns them: state to persist, then messages to send, then deliveries to write. The
shell must make the persisted state durable *before* it sends the messages of the same
``Ready`` — except those ``may_precede_persist`` allows — and report each completed
write with ``persisted(ready.number)``. As in etcd raft's asynchronous storage writes, a
leader replicates while it writes its own log (Raft thesis 10.2.1) and counts its own
copy once written, and a follower acknowledges at once but only what it has written,
acknowledging more when a write completes: no message that keeps a group alive waits
for a slow disk, and nothing unwritten is ever counted.

Design (see docs/ordering.md for the invariants and why they hold):
- Raft (Ongaro & Ousterhout) orders entries, each carrying one origin batch; data
  members persist term, vote and log entries in their own Kafka cluster.
- Elections start with a pre-vote (Raft thesis 9.6), leaders step down when they no
  longer hear a majority (check-quorum), and the election timeout backs off after every
  election that ends without a leader: a member that cannot win never disturbs the
  others, and elections succeed however slow the round trips become.
- Overload slows the sources, never the heartbeats: an origin has a bounded window of
  batches travelling to the leader (``Outbox``), the leader admits new batches only while
  the group's applying keeps up, and committed entries are handed to the shell for
  writing a bounded amount at a time.
- Witnesses keep nothing durable; a (re)started witness recovers from every other member
  before it votes (``kdsync.ordering.witness``).
- Exactly-once is decided at apply time by ``DeliveryLedger`` from the ordered stream.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from kdsync.ordering.election_timer import ElectionTimer
from kdsync.ordering.events import OriginBatch
from kdsync.ordering.group import GroupSpec, Timing
from kdsync.ordering.ledger import BatchVerdict, DeliveryLedger
from kdsync.ordering.log import Entry, ReplicatedLog
from kdsync.ordering.messages import (
    Append,
    AppendReply,
    Forward,
    Message,
    Outbound,
    PreVoteReply,
    PreVoteRequest,
    RecoverReply,
    RecoverRequest,
    TimeoutNow,
    VoteReply,
    VoteRequest,
)
from kdsync.ordering.outbox import BatchKey, Outbox, batch_key
from kdsync.ordering.progress import NEVER, ProgressState, ProgressTracker
from kdsync.ordering.ready import HardState, NodeEvent, NodeStatus, Ready, RecoveredState, Role
from kdsync.ordering.witness import WitnessRecovery, recover_reply

# How many Appends' worth of entries a leader reads back at once for a lagging peer.
_READ_AHEAD_APPENDS = 4


class OrderingNode:
    def __init__(
        self,
        member: str,
        group: GroupSpec,
        timing: Timing,
        incarnation: int,
        recovered: RecoveredState | None = None,
    ) -> None:
        if member not in group.members:
            raise ValueError(f"{member!r} is not a member of the group {list(group.members)}")
        self.member = member
        self.group = group
        self.timing = timing
        self.incarnation = incarnation
        self.is_witness = group.is_witness(member)
        self._peers = tuple(m for m in group.members if m != member)

        self.term = 0
        self.voted_for: str | None = None
        self._vote_withheld_term = -1  # a recovered witness may have voted in this term
        self.leader: str | None = None
        self.role = Role.FOLLOWER
        self.log = ReplicatedLog()
        self.commit_index = 0
        self.ledger: DeliveryLedger | None = None
        self._durable_applied = 0
        # Readys whose log writes the shell has not confirmed: (number, first index written).
        self._unpersisted: deque[tuple[int, int]] = deque()
        self._ready_number = 0
        # As a follower: our log matches the leader's up to here, we told it this much.
        self._leader_match = 0
        self._reported_match = 0
        self._leader_incarnation = 0
        self._all_durable = 0
        self._known_commit = 0  # the highest commit index a leader has told us about

        self._now = 0
        base = timing.election_ticks
        if self.is_witness:
            base *= timing.witness_election_factor  # witnesses campaign last
        self._timer = ElectionTimer(
            member, incarnation, base, timing.election_backoff, timing.election_ticks
        )
        self._recover_elapsed = 0
        self._heartbeat_elapsed = 0
        self._votes: set[str] = set()
        self._heard_at: dict[str, int] = {}  # tick of the last message from each peer
        self._tracker: ProgressTracker | None = None  # while leading
        self._led_since = NEVER
        self._transfer_sent_at = NEVER
        # Batches in the leader's uncommitted suffix: an origin's resend of one of them is
        # not appended again (it would only be dropped as a duplicate after ordering).
        self._uncommitted: dict[BatchKey, int] = {}
        # Forwarded batches wait here while the leader may not admit more (bounded).
        self._admission: deque[OriginBatch] = deque()

        self.outbox = Outbox(
            timing.max_outbox, timing.max_outbox_bytes, timing.max_forward, timing.resend_ticks
        )
        self._opened: set[tuple[str, str, int]] = set()
        self._loaded: dict[int, Entry] = {}
        self._loads_asked: set[tuple[int, int]] = set()
        # Delivered to the shell, not yet durably applied: (index, bytes), in order.
        self._applying: deque[tuple[int, int]] = deque()
        self._applying_bytes = 0

        self._ready = Ready()
        self._hard_dirty = False
        # Set by every input: ready() has work to look at (a second call in a row, as a
        # shell makes to see that nothing is left, then costs nothing).
        self._stirred = True
        # On a leader: something may be worth sending (new entries, a higher commit, an
        # answered probe, entries read back); heartbeats go out regardless.
        self._replication_due = True
        self._recovery: WitnessRecovery | None = None

        if self.is_witness:
            self.role = Role.RECOVERING
            self._recovery = WitnessRecovery(self._peers, incarnation)
            self._send_recover_requests()
        else:
            state = recovered or RecoveredState()
            self.term = state.hard_state.term
            self.voted_for = state.hard_state.voted_for
            ledger = state.ledger
            self.ledger = DeliveryLedger(ledger)
            self.log.reset(ledger.applied_index, ledger.applied_term, list(state.entries))
            self.commit_index = ledger.applied_index
            self._durable_applied = ledger.applied_index
        self._timer.reset()

    # ------------------------------------------------------------------ inputs

    def tick(self) -> None:
        self._now += 1
        self._stirred = True
        if self.leader is not None:
            self._timer.decay(self._now)
        if self.role == Role.RECOVERING:
            self._recover_elapsed += 1
            if self._recover_elapsed >= self.timing.election_ticks:
                self._recover_elapsed = 0
                self._send_recover_requests()
            return
        if self.role == Role.LEADER:
            self._heartbeat_elapsed += 1
            if self._heartbeat_elapsed >= self.timing.heartbeat_ticks:
                self._heartbeat_elapsed = 0
                if self._lost_quorum():
                    return
                self._replicate(heartbeat=True)
                self._maybe_hand_over()
        elif self._timer.expired():
            self._start_pre_vote()
        self._flush_outbox()

    def offer(self, batch: OriginBatch) -> bool:
        """Queue a batch of this member's own events for ordering; False when full."""
        if self.is_witness:
            raise ValueError("a witness owns no Kafka cluster and has no events to offer")
        if batch.origin != self.member:
            raise ValueError(f"batch from {batch.origin!r} offered to {self.member!r}")
        if not self.outbox.has_room():
            return False
        self._stirred = True
        where = batch.origin_partition
        if self.ledger is not None and self.ledger.covers(batch):
            # Already in the ordered stream (we restarted behind our own deliveries).
            return True
        opens = where not in self._opened
        self._opened.add(where)
        if batch.opens != opens:
            batch = replace(batch, opens=opens)
        self.outbox.add(batch)
        return True

    def persisted(self, number: int) -> None:
        """The shell has written what every ``Ready`` up to ``number`` asked to persist."""
        self._stirred = True
        while self._unpersisted and self._unpersisted[0][0] <= number:
            self._unpersisted.popleft()
        if self._tracker is not None:
            self._leader_commit()
        elif self.role == Role.FOLLOWER and self.leader is not None:
            durable = min(self._leader_match, self._durable_end())
            if durable > self._reported_match:
                self._reported_match = durable
                self._send(
                    self.leader,
                    AppendReply(
                        self.term,
                        True,
                        durable,
                        self._leader_match,
                        0,
                        self._leader_incarnation,
                        self.incarnation,
                        self._durable_applied,
                    ),
                )

    def applied(self, index: int) -> None:
        """The shell has durably written every delivery up to ``index``."""
        self._stirred = True
        self._durable_applied = max(self._durable_applied, index)
        while self._applying and self._applying[0][0] <= index:
            self._applying_bytes -= self._applying.popleft()[1]
        self._compact()

    def entries_loaded(self, entries: list[Entry]) -> None:
        """Entries the shell read back from durable storage after a ``loads`` request."""
        self._stirred = True
        for entry in entries:
            if entry.index <= self.log.snapshot_index:
                self._loaded[entry.index] = entry
        self._loads_asked.clear()
        self._replication_due = True

    def receive(self, sender: str, message: Message) -> None:
        if sender not in self.group.members or sender == self.member:
            return
        self._stirred = True
        self._heard_at[sender] = self._now
        if isinstance(message, RecoverRequest):
            self._send(sender, recover_reply(self.term, self.log, self.commit_index, message))
            return
        if self.role == Role.RECOVERING:
            if isinstance(message, RecoverReply):
                self._on_recover_reply(sender, message)
            return
        if isinstance(message, Forward):
            self._on_forward(message)
        elif isinstance(message, PreVoteRequest):
            self._on_pre_vote_request(sender, message)
        elif isinstance(message, PreVoteReply):
            self._on_pre_vote_reply(sender, message)
        elif isinstance(message, RecoverReply) or (
            isinstance(message, VoteRequest) and self._leader_is_alive(message.transfer)
        ):
            return  # a late recovery answer, or a campaign while a live leader leads
        else:
            self._on_term_message(sender, message)

    def _on_term_message(
        self,
        sender: str,
        message: VoteRequest | VoteReply | Append | AppendReply | TimeoutNow,
    ) -> None:
        if message.term > self.term:
            leader = sender if isinstance(message, Append) else None
            self._become_follower(message.term, leader, f"{sender} is in term {message.term}")
        if isinstance(message, VoteRequest):
            self._on_vote_request(sender, message)
        elif isinstance(message, VoteReply):
            self._on_vote_reply(sender, message)
        elif isinstance(message, Append):
            self._on_append(sender, message)
        elif isinstance(message, AppendReply):
            self._on_append_reply(sender, message)
        elif message.term == self.term and self.role == Role.FOLLOWER:
            self._campaign(transfer=True)  # TimeoutNow: the leader hands over to us

    # ------------------------------------------------------------------ outputs

    def ready(self) -> Ready:
        if self._stirred:
            self._stirred = False
            self._flush_outbox()
            if self.role == Role.LEADER:
                self._admit()
                if self._replication_due:
                    self._replicate(heartbeat=False)
            self._apply_committed()
        ready = self._ready
        if self._hard_dirty:
            ready.hard_state = HardState(self.term, self.voted_for)
            self._hard_dirty = False
        if ready.persist_from is not None:
            ready.entries = self.log.slice(ready.persist_from, self.log.last_index)
        if ready.persist_from is not None or ready.hard_state is not None:
            self._ready_number += 1
            ready.number = self._ready_number
            if ready.persist_from is not None:
                self._unpersisted.append((ready.number, ready.persist_from))
        if ready.deliveries and self.ledger is not None:
            ready.ledger = self.ledger.snapshot()
        self._ready = Ready()
        return ready

    def status(self) -> NodeStatus:
        applied = self.ledger.applied_index if self.ledger else self.commit_index
        return NodeStatus(
            self.member,
            self.role,
            self.term,
            self.leader,
            self.log.last_index,
            self.commit_index,
            applied,
            len(self.outbox),
        )

    def view(self) -> frozenset[str]:
        """This member and the peers heard from within an election timeout: the members
        it can currently count on. A majority view means it takes part in ordering."""
        horizon = self._now - self.timing.election_ticks
        heard = {m for m, at in self._heard_at.items() if at >= horizon}
        return frozenset({self.member, *heard})

    def in_majority(self) -> bool:
        """Takes part in ordering: a leader that a majority answered within an election
        timeout, a follower that hears such a leader (check-quorum makes a leader that
        lost its majority step down), or a member that hears a majority itself."""
        horizon = self._now - self.timing.election_ticks
        if self._tracker is not None:
            return self._tracker.acked_since(horizon) + 1 >= self.group.quorum
        if self.leader is not None and self._heard_at.get(self.leader, NEVER) >= horizon:
            return True
        return len(self.view()) >= self.group.quorum

    def peer_match(self) -> dict[str, int]:
        """On a leader: how far each peer's log is known to match ours (else empty)."""
        return self._tracker.matches() if self._tracker is not None else {}

    @property
    def known_commit(self) -> int:
        """The group's commit index as far as this member knows: how far it must apply
        to be caught up."""
        return max(self._known_commit, self.commit_index)

    @property
    def all_durable(self) -> int:
        """Every data member has stored the log up to here; older entries are needed
        only by witnesses and by this member's own recovery."""
        return self._all_durable

    def outbox_size(self) -> int:
        return len(self.outbox)

    # ------------------------------------------------------------------ roles

    def _event(self, kind: str, detail: str) -> None:
        self._ready.events.append(NodeEvent(kind, self.term, detail))

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
        self._uncommitted.clear()
        self._admission.clear()
        self._timer.reset()
        if was_role != Role.FOLLOWER or term != was_term:
            following = f"following {leader}" if leader else "no leader known"
            self._event("follower", f"{why}; {following}")
        elif leader is not None and leader != was_leader:
            self._event("follower", f"{leader} leads")
        if leader != was_leader and leader is not None:
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
        request = PreVoteRequest(
            self.term + 1, self.log.last_index, self.log.last_term, self.incarnation
        )
        for peer in self._peers:
            self._send(peer, request)

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
        for peer in self._peers:
            self._send(peer, request)

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader = self.member
        self._timer.leader_known(self._now)
        self._transfer_sent_at = NEVER
        self._led_since = self._now
        self._tracker = ProgressTracker(self._peers, self.log.last_index + 1, self._now)
        self._uncommitted = {}
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
        heard = self._tracker.acked_since(self._now - window) + 1
        if heard >= self.group.quorum:
            return False
        self._become_follower(
            self.term,
            None,
            f"stepped down: only {heard} of {len(self.group.members)} members "
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
            return self._tracker.acked_since(horizon) + 1 >= self.group.quorum
        leader = self.leader
        return (
            self.role == Role.FOLLOWER
            and leader is not None
            and self._heard_at.get(leader, NEVER) >= horizon
        )

    def _on_pre_vote_request(self, candidate: str, request: PreVoteRequest) -> None:
        # Neither our term nor our timer changes: a pre-vote disturbs nobody.
        grant = (
            request.term > self.term
            and not self._leader_is_alive()
            and self._log_is_current(request.last_index, request.last_term)
        )
        if not grant and request.term > self.term:
            reason = (
                "a live leader is known"
                if self._leader_is_alive()
                else f"its log ({request.last_term}, {request.last_index}) is behind ours "
                f"({self.log.last_term}, {self.log.last_index})"
            )
            self._event(
                "vote-refused", f"pre-vote of {candidate} for term {request.term}: {reason}"
            )
        self._send(candidate, PreVoteReply(self.term, grant, request.incarnation))

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
        if len(self._votes) >= self.group.quorum:
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
        if len(self._votes) >= self.group.quorum:
            self._become_leader()

    # ------------------------------------------------------------------ replication

    def _append_local(self, batch: OriginBatch | None) -> None:
        self._replication_due = True
        index = self.log.last_index + 1
        entry = Entry(index, self.term, batch)
        self.log.append(entry)
        self._track_uncommitted(entry)
        self._mark_persist(index)

    def _track_uncommitted(self, entry: Entry) -> None:
        if entry.batch is not None:
            self._uncommitted[batch_key(entry.batch)] = entry.index

    def _mark_persist(self, index: int) -> None:
        if self.ledger is None:
            return  # a witness keeps nothing durable
        current = self._ready.persist_from
        self._ready.persist_from = index if current is None else min(current, index)

    def _entries_for(self, first: int, limit: int | None = None) -> list[Entry] | None:
        """Entries from ``first`` for an Append, or None while they must be loaded."""
        entries = self._entries_from(first)
        if entries is not None and limit is not None:
            entries = entries[:limit]
        if entries is None or len(entries) < 2:
            return entries
        budget = self.timing.max_append_bytes
        for count, entry in enumerate(entries):
            if entry.batch is not None:
                budget -= entry.batch.size_bytes()
            if budget < 0 and count > 0:
                return entries[:count]
        return entries

    def _entries_from(self, first: int) -> list[Entry] | None:
        last = min(self.log.last_index, first + self.timing.max_entries_per_append - 1)
        if first > last:
            return []
        if first > self.log.snapshot_index:
            return self.log.slice(first, last)
        # The peer is behind our in-memory log: use entries read back from storage.
        upto = min(last, self.log.snapshot_index)
        loaded: list[Entry] = []
        for index in range(max(1, first - 1), upto + 1):
            entry = self._loaded.get(index)
            if entry is None:
                if not self.is_witness:
                    # Load the entry before ``first`` too: its term is the Append's prev_term.
                    # Read ahead a window's worth: a lagging peer then catches up at the
                    # pace of the pipeline, not one read per Append.
                    ahead = min(
                        self.log.snapshot_index,
                        first - 1 + _READ_AHEAD_APPENDS * (self.timing.max_entries_per_append),
                    )
                    span = (max(1, first - 1), max(upto, ahead))
                    if span not in self._loads_asked:
                        self._loads_asked.add(span)
                        self._ready.loads.append(span)
                return None
            if index >= first:
                loaded.append(entry)
        if upto < last:
            loaded.extend(self.log.slice(upto + 1, last))
        return loaded

    def _term_of(self, index: int) -> int | None:
        if index == 0:
            return 0
        term = self.log.term_at(index)
        if term is None and index in self._loaded:
            term = self._loaded[index].term
        return term

    def _send_append(self, peer: str, entries: list[Entry], prev_index: int) -> bool:
        assert self._tracker is not None
        prev_term = self._term_of(prev_index)
        if prev_term is None:
            return False
        self._send(
            peer,
            Append(
                self.term,
                prev_index,
                prev_term,
                tuple(entries),
                self.commit_index,
                self.incarnation,
                self._all_durable,
            ),
        )
        progress = self._tracker[peer]
        progress.sent_commit = self.commit_index
        if entries:
            progress.next = entries[-1].index + 1
        return True

    def _replicate(self, heartbeat: bool) -> None:
        """Send each peer what it lacks; on heartbeats also repair lost messages."""
        self._replication_due = False
        tracker = self._tracker
        assert tracker is not None
        self._refresh_all_durable()
        last = self.log.last_index
        for peer in self._peers:
            pr = tracker[peer]
            if heartbeat:
                pr.probe_sent = False
                stalled = self._now - pr.progress_at >= self.timing.election_ticks
                if pr.state == ProgressState.REPLICATE and stalled and pr.match < last:
                    pr.become_probe(self._probe_floor(peer))
            if self.group.is_witness(peer) and pr.next <= self.log.snapshot_index:
                # A witness needs no history, only our log's shape: it takes our compacted
                # (committed) prefix as its own and continues from there.
                pr.next = self.log.snapshot_index + 1
            if pr.state == ProgressState.PROBE:
                if pr.probe_sent:
                    continue
                pr.probe_sent = True
                first = pr.next
                # A probe carries one entry, and a resent one none: it goes out every
                # heartbeat until the peer answers, and must stay cheap for a slow peer.
                bare = pr.unanswered_probes and self._term_of(first - 1) is not None
                entries = self._entries_for(first, 1) if first <= last and not bare else []
                if entries is not None and self._send_append(peer, entries, first - 1):
                    pr.unanswered_probes += 1
                pr.next = first  # probes do not advance optimistically
            elif pr.next <= last and pr.window_open(4 * self.timing.max_append_bytes):
                # Bound what is in flight to a peer, in Appends and bytes (etcd's Inflights),
                # so a slow peer's queue stays short and it hears heartbeats in time.
                entries = self._entries_for(pr.next)
                if entries and self._send_append(peer, entries, pr.next - 1):
                    pr.sent(entries[-1].index, sum(_entry_size(e) for e in entries))
            elif heartbeat or pr.sent_commit < self.commit_index:
                # Nothing new: a bare heartbeat at a position the peer is known to hold.
                self._send_append(peer, [], pr.match)

    def _on_append(self, leader: str, append: Append) -> None:
        if append.term < self.term:
            self._send(
                leader,
                AppendReply(
                    self.term, False, 0, 0, append.prev_index, append.incarnation, self.incarnation
                ),
            )
            return
        if self.role != Role.FOLLOWER or self.leader != leader:
            self._become_follower(append.term, leader, f"{leader} leads term {append.term}")
        self._timer.reset()
        prev_index, prev_term, entries = append.prev_index, append.prev_term, list(append.entries)
        if prev_index < self.log.snapshot_index:
            # Our compacted prefix is committed, so it matches: skip what it covers.
            entries = [e for e in entries if e.index > self.log.snapshot_index]
            prev_index, prev_term = self.log.snapshot_index, self.log.snapshot_term
            if entries and entries[0].index != prev_index + 1:
                entries = []
        if self.log.term_at(prev_index) != prev_term:
            if self.is_witness and self.commit_index < prev_index <= append.commit:
                # The leader's entry at prev_index is committed, so everything up to it is
                # settled: a witness, which applies nothing, takes it as its new start.
                self.log.reset(prev_index, prev_term, [])
                self.commit_index = prev_index
            else:
                hint = min(self.log.last_index, prev_index - 1)
                self._send(
                    leader,
                    AppendReply(
                        self.term,
                        False,
                        0,
                        hint,
                        prev_index,
                        append.incarnation,
                        self.incarnation,
                    ),
                )
                return
        changed = self.log.merge(entries)
        if changed is not None:
            self._mark_persist(changed)
        applied = self.ledger.applied_index if self.ledger is not None else self.commit_index
        for entry in entries:
            # Only entries still to be applied: an old Append seen again must not mark a
            # batch as on its way once its entry was applied (as a gap, say).
            batch = entry.batch
            if batch is not None and batch.origin == self.member and entry.index > applied:
                self.outbox.appended(batch_key(batch))
        match = prev_index + len(entries)
        self._all_durable = max(self._all_durable, append.all_durable)
        self._known_commit = max(self._known_commit, append.commit)
        self._advance_commit(min(append.commit, match))
        # Acknowledge at once, but only what is written (``persisted`` acknowledges the
        # rest); ``hint_index`` says how far our log matches, for the next Append.
        self._leader_match = max(self._leader_match, match)
        self._leader_incarnation = append.incarnation
        durable = min(match, self._durable_end())
        self._reported_match = max(self._reported_match, durable)
        self._send(
            leader,
            AppendReply(
                self.term,
                True,
                durable,
                match,
                0,
                append.incarnation,
                self.incarnation,
                self._durable_applied,
            ),
        )

    def _on_append_reply(self, peer: str, reply: AppendReply) -> None:
        tracker = self._tracker
        if tracker is None or reply.term != self.term or reply.incarnation != self.incarnation:
            return
        pr = tracker[peer]
        self._replication_due = True
        if pr.incarnation is not None and pr.incarnation != reply.peer_incarnation:
            pr.restarted(self.log.last_index)
        pr.incarnation = reply.peer_incarnation
        pr.acked_at = self._now
        if reply.success or reply.rejected_index == pr.next - 1:
            # This answers the probe in flight (older answers must not trigger resends).
            pr.probe_sent = False
            pr.unanswered_probes = 0
        if reply.success:
            pr.applied = max(pr.applied, reply.applied_index)
            if pr.update_match(reply.match_index, self._now):
                self._leader_commit()
            if pr.state == ProgressState.PROBE:
                pr.become_replicate()
            # The peer holds (not yet all written) entries up to hint_index: go on from there.
            pr.next = max(pr.next, reply.hint_index + 1)
        elif pr.state == ProgressState.REPLICATE:
            if reply.rejected_index > pr.match:
                pr.become_probe(self._probe_floor(peer))
        elif reply.rejected_index == pr.next - 1:
            # Only the answer to the current probe moves it; older rejections are stale.
            pr.next = max(pr.match + 1, min(reply.rejected_index, reply.hint_index + 1))

    def _probe_floor(self, peer: str) -> int:
        return 0 if self.group.is_witness(peer) else min(self._all_durable, self.commit_index)

    def _leader_commit(self) -> None:
        assert self._tracker is not None
        majority_index = self._tracker.quorum_match(self._own_durable(), self.group.quorum)
        # Only entries of the current term commit by counting (Raft, figure 8).
        if majority_index > self.commit_index and self.log.term_at(majority_index) == self.term:
            self._advance_commit(majority_index)

    def _own_durable(self) -> int:
        return self._durable_end()

    def _durable_end(self) -> int:
        """Our log is written up to here (a witness, which writes nothing, counts what
        it holds): unconfirmed writes, and the one being gathered, start after it."""
        if self.ledger is None or (not self._unpersisted and self._ready.persist_from is None):
            return self.log.last_index
        starts = [first for _, first in self._unpersisted]
        if self._ready.persist_from is not None:
            starts.append(self._ready.persist_from)
        return min([self.log.last_index, *(first - 1 for first in starts)])

    def _refresh_all_durable(self) -> None:
        if self._tracker is None:
            return
        durable = self._tracker.durable_floor(
            self.group.data_members, self.member, self._own_durable()
        )
        self._all_durable = max(self._all_durable, durable)

    def _advance_commit(self, index: int) -> None:
        if index <= self.commit_index:
            return
        if self._uncommitted:
            for position in range(self.commit_index + 1, index + 1):
                batch = self.log.entry(position).batch
                if batch is not None:
                    self._uncommitted.pop(batch_key(batch), None)
        self.commit_index = index
        self._replication_due = True
        if self.ledger is None:
            self._compact()

    def _apply_committed(self) -> None:
        """Hand committed entries to the shell, a bounded amount ahead of its writing."""
        ledger = self.ledger
        if ledger is None:
            return
        while ledger.applied_index < self.commit_index:
            if self._applying and self._applying_bytes >= self.timing.max_apply_bytes:
                return
            entry = self.log.entry(ledger.applied_index + 1)
            delivery = ledger.apply(entry)
            size = entry.batch.size_bytes() if entry.batch is not None else 0
            self._applying.append((entry.index, size))
            self._applying_bytes += size
            self._ready.deliveries.append(delivery)
            where = delivery.origin_partition
            if where is not None and where[0] == self.member:
                self.outbox.settle(where, ledger.marks.get(where, 0))
                if delivery.verdict == BatchVerdict.GAP:
                    # An earlier batch of ours went missing: offer everything again.
                    self.outbox.offer_again()

    def _compact(self) -> None:
        if self.ledger is None:
            # A witness keeps what some data member has not stored yet (it may have to
            # lead that member up to date), within a memory bound.
            upto = min(self.commit_index, self._all_durable)
            excess = self.log.bytes - self.timing.witness_retained_bytes
            if excess > 0:
                upto = max(upto, self.log.index_after_bytes(self.log.snapshot_index + 1, excess))
            upto = min(upto, self.commit_index)
        else:
            floor = max(self._all_durable, self._durable_applied - self.timing.retained_applied)
            upto = min(self._durable_applied, floor)
        if upto > self.log.snapshot_index:
            self.log.compact(upto)
            span = _READ_AHEAD_APPENDS * self.timing.max_entries_per_append
            stale = upto - span
            # Entries read back for a lagging peer stay until they are sent (its next
            # Append starts at next - 1, for prev_term): a busy leader compacts between
            # the load and the next probe, and must not drop them meanwhile.
            wanted = (
                [self._tracker[p].next - 1 for p in self._peers]
                if self._tracker is not None
                else []
            )
            for index in [
                i
                for i in self._loaded
                if i <= stale and not any(0 <= i - first <= span for first in wanted)
            ]:
                del self._loaded[index]

    # ------------------------------------------------------------------ handing over

    def _maybe_hand_over(self) -> None:
        """A witness leader hands leadership to a caught-up data member as soon as there
        is one; so does a data member whose own destination has fallen far behind one
        that writes faster (halted, say): the group then goes on at the faster pace."""
        tracker = self._tracker
        assert tracker is not None
        if self._transferring():
            return
        if self.commit_index != self.log.last_index:
            return
        # Only to a member that answered lately: one that went down keeps its old match,
        # and handing over to it again and again would keep admission paused for good.
        recently = self._now - self.timing.election_ticks
        caught_up = [
            p
            for p in self.group.data_members
            if p != self.member
            and tracker[p].match == self.log.last_index
            and tracker[p].acked_at >= recently
        ]
        if not caught_up:
            return
        target = max(caught_up, key=lambda p: tracker[p].applied)
        if self.ledger is not None:
            behind = self.commit_index - self._durable_applied > 2 * self.timing.max_unapplied
            if not (behind and tracker[target].applied > self._durable_applied):
                return
        self._transfer_sent_at = self._now
        self._event("step-down", f"handing leadership to {target}")
        self._send(target, TimeoutNow(self.term))

    def _transferring(self) -> bool:
        """A handover was asked for lately: admit nothing new meanwhile (as etcd does),
        or the target's log falls behind ours and our vote refuses it."""
        return self._now - self._transfer_sent_at < self.timing.election_ticks * 2

    # ------------------------------------------------------------------ witness recovery

    def _send_recover_requests(self) -> None:
        assert self._recovery is not None
        for peer, request in self._recovery.requests(self.term):
            self._send(peer, request)

    def _on_recover_reply(self, sender: str, reply: RecoverReply) -> None:
        assert self._recovery is not None
        outcome = self._recovery.reply(sender, reply)
        if outcome is None:
            return
        self.log.reset(outcome.commit_index, outcome.commit_term, list(outcome.entries))
        self.commit_index = outcome.commit_index
        # We may have voted in `term` before we lost our memory: do not vote in it again.
        self._vote_withheld_term = outcome.term
        self._set_term(outcome.term, None)
        self.role = Role.FOLLOWER
        self._recovery = None
        self._event("follower", f"recovered from every member, term {outcome.term}")
        self._timer.reset()

    # ------------------------------------------------------------------ origin outbox

    def _on_forward(self, forward: Forward) -> None:
        if self.role != Role.LEADER:
            return  # the origin offers again once it learns who leads
        room = 2 * self.timing.max_uncommitted - len(self._admission)
        self._admission.extend(forward.batches[: max(0, room)])
        self._admit()

    def _admit(self) -> None:
        while self._admission and self._accept_batch(self._admission[0]):
            self._admission.popleft()

    def _may_admit(self) -> bool:
        if self.log.last_index - self.commit_index >= self.timing.max_uncommitted:
            return False
        if self._transferring():
            return False
        assert self._tracker is not None
        if self.ledger is not None:
            own = self._durable_applied
        else:  # a witness leads only briefly; it waits for whoever applies
            own = max((pr.applied for pr in self._tracker.peers.values()), default=0)
        since = self._now - self.timing.election_ticks
        applied = self._tracker.applied_by_half(self.group.data_members, self.member, own, since)
        return self.commit_index - applied < self.timing.max_unapplied

    def _accept_batch(self, batch: OriginBatch) -> bool:
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

    # ------------------------------------------------------------------ plumbing

    def _send(self, peer: str, message: Message) -> None:
        self._ready.messages.append(Outbound(peer, message))


def _entry_size(entry: Entry) -> int:
    return entry.batch.size_bytes() if entry.batch is not None else 0
