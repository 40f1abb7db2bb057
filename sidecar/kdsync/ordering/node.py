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

The node is one state machine whose steps live in one module per concept, as methods of
classes over the same fields (the way etcd raft spreads the methods of its ``raft``
struct over several files); ``OrderingNode`` puts them together:
- ``kdsync.ordering.node_state``: the fields, and the steps every part takes;
- ``kdsync.ordering.elections``: roles, pre-vote, votes, check-quorum, handing
  leadership over, a restarted witness's recovery;
- ``kdsync.ordering.replication``: Appends and their answers, probes, entries read back
  for a lagging peer, commit, compaction of the in-memory log;
- ``kdsync.ordering.admission``: batches from the origins' outboxes into the leader's log;
- this module: the inputs, ``ready()`` with the deliveries it hands out, and status.
"""

from __future__ import annotations

from dataclasses import replace

from kdsync.ordering.admission import Admission
from kdsync.ordering.configuration import Configuration
from kdsync.ordering.elections import Elections
from kdsync.ordering.events import OriginBatch
from kdsync.ordering.group import GroupSpec, Timing
from kdsync.ordering.ledger import DeliveryLedger
from kdsync.ordering.log import Entry, entry_size
from kdsync.ordering.membership import Membership
from kdsync.ordering.messages import (
    Append,
    AppendReply,
    Forward,
    Message,
    PreVoteReply,
    PreVoteRequest,
    RecoverReply,
    RecoverRequest,
    TimeoutNow,
    VoteReply,
    VoteRequest,
)
from kdsync.ordering.progress import NEVER
from kdsync.ordering.ready import HardState, NodeStatus, Ready, RecoveredState, Role
from kdsync.ordering.replication import Replication
from kdsync.ordering.witness import WitnessRecovery, recover_reply


class OrderingNode(Elections, Replication, Admission, Membership):
    def __init__(
        self,
        member: str,
        group: GroupSpec,
        timing: Timing,
        incarnation: int,
        recovered: RecoveredState | None = None,
    ) -> None:
        # A data member's configuration is the one its ledger last applied, if any: the
        # startup file only seeds a new group (docs/ordering.md, "Membership changes").
        ledger_state = recovered.ledger if recovered is not None else None
        base: tuple[int, Configuration] | None = None
        if ledger_state is not None and ledger_state.config is not None:
            base = (ledger_state.config_index, ledger_state.config)
        super().__init__(member, group, timing, incarnation, base)
        if self.is_witness:
            self.role = Role.RECOVERING
            self._recovery = WitnessRecovery(self._peers, incarnation, member)
            self._send_recover_requests()
        else:
            state = recovered or RecoveredState()
            self.term = state.hard_state.term
            self.voted_for = state.hard_state.voted_for
            ledger = state.ledger
            self.ledger = DeliveryLedger(ledger)
            self.log.reset(ledger.applied_index, ledger.applied_term, list(state.entries))
            self._log_start = (ledger.applied_index, ledger.applied_term)
            self._configs_changed(ledger.applied_index + 1, list(state.entries))
            self.commit_index = ledger.applied_index
            self._durable_applied = ledger.applied_index
            self._trimmed_below = state.trimmed_below
            self.outbox.start_from({w: m for w, m in ledger.marks.items() if w[0] == member})
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
                self._maybe_promote_learner()
        elif self._timer.expired():
            if self._is_voter():
                self._start_pre_vote()
            else:
                self._timer.reset()  # a learner, or removed: it never campaigns
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
        if self.outbox.ordered(batch):
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
        if self.log.bytes > self.timing.max_log_bytes:
            self._compact()  # what was just written may leave memory now
        if self._tracker is not None:
            self._leader_commit()
        elif self.role == Role.FOLLOWER and self.leader is not None:
            durable = self._written_of_leader()
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
        self._forget_loaded()  # what a peer or our applying has moved past meanwhile
        self._loads_out = ()  # the spans asked while it ran go next
        self._replication_due = True

    def receive(self, sender: str, message: Message) -> None:
        # Taken from anyone, as Raft does: a leader or candidate of a configuration we
        # have not received yet is still one. A member removed cannot disturb: its
        # campaigns need a pre-vote, refused while a live leader is heard, and its log
        # lacks its own removal on every member that could vote for it.
        if sender == self.member:
            return
        self._stirred = True
        self._heard_at[sender] = self._now
        if isinstance(message, RecoverRequest):
            reply = recover_reply(
                self.term,
                self.log,
                self.commit_index,
                message,
                self.timing.max_recover_bytes,
                self._config_news(self.commit_index, to=sender),
            )
            self._send(sender, reply)
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
        elif message.term == self.term and self.role == Role.FOLLOWER and self._is_voter():
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
            self._hand_out_loads()
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
        config = self.config
        if self._tracker is not None:
            return self._tracker.acked_since(horizon, config.voters) + 1 >= self._quorum()
        if self.leader is not None and self._heard_at.get(self.leader, NEVER) >= horizon:
            return True
        return sum(1 for m in self.view() if config.is_voter(m)) >= self._quorum()

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

    @property
    def trimmed_below(self) -> int:
        """Our log topic held no entry below this when we started (0: never trimmed).
        ``all_durable`` covers what we trim later; a restart forgets it, not this."""
        return self._trimmed_below

    def outbox_size(self) -> int:
        return len(self.outbox)

    def log_memory_bytes(self) -> int:
        """The batches this member holds in its in-memory log (committed ones bounded by
        ``max_log_bytes``, uncommitted ones by the leader's ``max_uncommitted_bytes``) and
        read back from storage, in ``OriginBatch.size_bytes``."""
        return self.log.bytes + sum(entry_size(e) for e in self._loaded.values())

    # ------------------------------------------------------------------ apply

    def _apply_committed(self) -> None:
        """Hand committed entries to the shell, a bounded amount ahead of its writing."""
        ledger = self.ledger
        if ledger is None:
            return
        while ledger.applied_index < self.commit_index:
            if self._applying and self._applying_bytes >= self.timing.max_apply_bytes:
                return
            entry = self._committed_entry(ledger.applied_index + 1)
            if entry is None:
                return  # compacted from memory: being read back from our ordering log
            delivery = ledger.apply(entry)
            size = entry_size(entry)
            self._applying.append((entry.index, size))
            self._applying_bytes += size
            self._ready.deliveries.append(delivery)
