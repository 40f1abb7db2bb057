"""One member's ordering state machine: Raft over origin batches, sans I/O.

Inputs: ``tick()``, ``receive(sender, message)``, ``offer(batch)``, ``applied(index)``
and ``entries_loaded(entries)``. Outputs accumulate until ``ready()`` returns them:
state to persist, then messages to send, then deliveries to write. The shell must make
the persisted state durable *before* it sends the messages of the same ``Ready``.

Design (see docs/ordering.md for the invariants and why they hold):
- Raft (Ongaro & Ousterhout) orders entries, each carrying one origin batch; data
  members persist term, vote and log entries in their own Kafka cluster.
- Witnesses keep nothing durable. A witness that (re)starts first recovers: it asks every
  other member for its term and log, adopts the highest term with its vote in that term
  withheld, and the most up-to-date log. Until then it neither votes nor acknowledges.
- A witness may lead when no data member can (e.g. the only up-to-date data member is
  gone), and hands leadership to a caught-up data member as soon as there is one.
- Exactly-once is decided at apply time by ``DeliveryLedger`` from the ordered stream.
"""

from __future__ import annotations

import zlib
from collections import deque
from dataclasses import dataclass, field, replace
from enum import Enum

from kdsync.ordering.events import OriginBatch, OriginPartition
from kdsync.ordering.group import GroupSpec, Timing
from kdsync.ordering.ledger import BatchVerdict, Delivery, DeliveryLedger, LedgerState
from kdsync.ordering.log import Entry, ReplicatedLog
from kdsync.ordering.messages import (
    Append,
    AppendReply,
    Forward,
    Message,
    Outbound,
    RecoverReply,
    RecoverRequest,
    TimeoutNow,
    VoteReply,
    VoteRequest,
)


class Role(Enum):
    RECOVERING = "recovering"
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class HardState:
    term: int = 0
    voted_for: str | None = None


@dataclass(frozen=True, slots=True)
class RecoveredState:
    """What a data member reads back from its own Kafka cluster at start-up."""

    hard_state: HardState = field(default_factory=HardState)
    ledger: LedgerState = field(default_factory=LedgerState)
    entries: tuple[Entry, ...] = ()  # persisted log entries after ledger.applied_index


@dataclass(slots=True)
class Ready:
    hard_state: HardState | None = None
    persist_from: int | None = None  # persist ``entries``, truncating the log at this index
    entries: list[Entry] = field(default_factory=list)
    messages: list[Outbound] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    ledger: LedgerState | None = None  # the ledger after ``deliveries``
    loads: list[tuple[int, int]] = field(default_factory=list)  # entries to read back

    def is_empty(self) -> bool:
        return not (
            self.hard_state
            or self.persist_from is not None
            or self.messages
            or self.deliveries
            or self.loads
        )


@dataclass(slots=True)
class _Pending:
    batch: OriginBatch
    sent_at: int | None = None


@dataclass(frozen=True, slots=True)
class NodeStatus:
    member: str
    role: Role
    term: int
    leader: str | None
    last_index: int
    commit_index: int
    applied_index: int
    outbox: int


_NEVER = -(10**18)


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
        self._rng = (zlib.crc32(member.encode()) ^ incarnation) & 0xFFFFFFFF or 0x9E3779B9

        self.term = 0
        self.voted_for: str | None = None
        self._vote_withheld_term = -1  # a recovered witness may have voted in this term
        self.leader: str | None = None
        self.log = ReplicatedLog()
        self.commit_index = 0
        self.ledger: DeliveryLedger | None = None
        self._durable_applied = 0
        self._all_durable = 0

        self._now = 0
        self._election_elapsed = 0
        self._election_timeout = 0
        self._heartbeat_elapsed = 0
        self._votes: set[str] = set()
        self._next: dict[str, int] = {}
        self._match: dict[str, int] = {}
        self._transfer_sent_at = _NEVER
        # Flow control per peer, as in etcd's raft: a peer is "probing" (one Append in
        # flight, until a position is confirmed) or "replicating" (optimistic pipeline).
        self._probing: set[str] = set()
        self._probe_inflight: set[str] = set()
        self._progress_at: dict[str, int] = {}
        self._sent_commit: dict[str, int] = {}
        self._peer_incarnation: dict[str, int] = {}
        self._heard_at: dict[str, int] = {}  # tick of the last message from each peer
        self._acked_at: dict[str, int] = {}  # as leader: last AppendReply of this term
        self._known_commit = 0  # the highest commit index a leader has told us about
        # Batches in the leader's uncommitted suffix: an origin's resend of one of them is
        # not appended again (it would only be dropped as a duplicate after ordering).
        self._uncommitted: dict[tuple[OriginPartition, int, int], int] = {}
        # Forwarded batches wait here while the uncommitted backlog is full (bounded).
        self._admission: deque[OriginBatch] = deque()

        self._outbox: dict[OriginPartition, deque[_Pending]] = {}
        self._opened: set[OriginPartition] = set()
        self._loaded: dict[int, Entry] = {}
        self._loads_asked: set[tuple[int, int]] = set()

        self._recover_nonce = 0
        self._recover_replies: dict[str, RecoverReply] = {}

        self._ready = Ready()
        self._hard_dirty = False

        if self.is_witness:
            self.role = Role.RECOVERING
            self._recover_nonce = incarnation
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
            self.role = Role.FOLLOWER
        self._reset_election_timer()

    # ------------------------------------------------------------------ inputs

    def tick(self) -> None:
        self._now += 1
        if self.role == Role.RECOVERING:
            self._election_elapsed += 1
            if self._election_elapsed >= self.timing.election_ticks:
                self._election_elapsed = 0
                self._send_recover_requests()
            return
        if self.role == Role.LEADER:
            self._heartbeat_elapsed += 1
            if self._heartbeat_elapsed >= self.timing.heartbeat_ticks:
                self._heartbeat_elapsed = 0
                self._replicate(heartbeat=True)
                if self.is_witness:
                    self._hand_over_leadership()
        else:
            self._election_elapsed += 1
            if self._election_elapsed >= self._election_timeout:
                self._campaign()
        self._flush_outbox()

    def offer(self, batch: OriginBatch) -> bool:
        """Queue a batch of this member's own events for ordering; False when full."""
        if self.is_witness:
            raise ValueError("a witness owns no Kafka cluster and has no events to offer")
        if batch.origin != self.member:
            raise ValueError(f"batch from {batch.origin!r} offered to {self.member!r}")
        if self.outbox_size() >= self.timing.max_outbox:
            return False
        where = batch.origin_partition
        if self.ledger is not None and self.ledger.covers(batch):
            # Already in the ordered stream (we restarted behind our own deliveries).
            return True
        opens = where not in self._opened
        self._opened.add(where)
        if batch.opens != opens:
            batch = replace(batch, opens=opens)
        self._outbox.setdefault(where, deque()).append(_Pending(batch))
        return True

    def applied(self, index: int) -> None:
        """The shell has durably written every delivery up to ``index``."""
        self._durable_applied = max(self._durable_applied, index)
        self._compact()

    def entries_loaded(self, entries: list[Entry]) -> None:
        """Entries the shell read back from durable storage after a ``loads`` request."""
        for entry in entries:
            if entry.index <= self.log.snapshot_index:
                self._loaded[entry.index] = entry
        self._loads_asked.clear()

    def receive(self, sender: str, message: Message) -> None:
        if sender not in self.group.members or sender == self.member:
            return
        self._heard_at[sender] = self._now
        if isinstance(message, RecoverRequest):
            self._on_recover_request(sender, message)
            return
        if self.role == Role.RECOVERING:
            if isinstance(message, RecoverReply):
                self._on_recover_reply(sender, message)
            return
        if isinstance(message, Forward):
            self._on_forward(message)
            return
        if isinstance(message, RecoverReply):
            return
        if isinstance(message, VoteRequest) and self._leader_is_alive(message):
            return
        if message.term > self.term:
            leader = sender if isinstance(message, Append) else None
            self._become_follower(message.term, leader)
        if isinstance(message, VoteRequest):
            self._on_vote_request(sender, message)
        elif isinstance(message, VoteReply):
            self._on_vote_reply(sender, message)
        elif isinstance(message, Append):
            self._on_append(sender, message)
        elif isinstance(message, AppendReply):
            self._on_append_reply(sender, message)
        elif (
            isinstance(message, TimeoutNow)
            and message.term == self.term
            and self.role == Role.FOLLOWER
        ):
            self._campaign(transfer=True)

    # ------------------------------------------------------------------ outputs

    def ready(self) -> Ready:
        self._flush_outbox()
        if self.role == Role.LEADER:
            self._admit()
            self._replicate(heartbeat=False)
        ready = self._ready
        if self._hard_dirty:
            ready.hard_state = HardState(self.term, self.voted_for)
            self._hard_dirty = False
        if ready.persist_from is not None:
            ready.entries = self.log.slice(ready.persist_from, self.log.last_index)
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
            self.outbox_size(),
        )

    def view(self) -> frozenset[str]:
        """This member and the peers heard from within an election timeout: the members
        it can currently count on. A majority view means it takes part in ordering."""
        horizon = self._now - self.timing.election_ticks
        heard = {m for m, at in self._heard_at.items() if at >= horizon}
        return frozenset({self.member, *heard})

    def peer_match(self) -> dict[str, int]:
        """On a leader: how far each peer's log is known to match ours (else empty)."""
        return dict(self._match) if self.role == Role.LEADER else {}

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
        return sum(len(queue) for queue in self._outbox.values())

    # ------------------------------------------------------------------ roles

    def _random(self) -> int:
        # xorshift32: deterministic jitter from the shell-given incarnation, no RNG inside.
        x = self._rng
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        self._rng = x
        return x

    def _reset_election_timer(self) -> None:
        base = self.timing.election_ticks
        if self.is_witness:
            base *= self.timing.witness_election_factor
        self._election_elapsed = 0
        self._election_timeout = base + self._random() % base

    def _set_term(self, term: int, voted_for: str | None) -> None:
        if term != self.term or voted_for != self.voted_for:
            self.term = term
            self.voted_for = voted_for
            self._hard_dirty = True

    def _become_follower(self, term: int, leader: str | None) -> None:
        was_leader = self.leader
        self._set_term(term, None if term > self.term else self.voted_for)
        self.role = Role.FOLLOWER
        self.leader = leader
        self._votes.clear()
        self._uncommitted.clear()
        self._admission.clear()
        self._reset_election_timer()
        if leader != was_leader and leader is not None:
            self._on_leader_change()

    def _campaign(self, transfer: bool = False) -> None:
        self.role = Role.CANDIDATE
        self.leader = None
        self._set_term(self.term + 1, self.member)
        self._votes = {self.member}
        self._reset_election_timer()
        request = VoteRequest(
            self.term, self.log.last_index, self.log.last_term, self.incarnation, transfer
        )
        for peer in self._peers:
            self._send(peer, request)

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader = self.member
        self._transfer_sent_at = _NEVER
        start = self.log.last_index + 1
        self._next = {p: start for p in self._peers}
        self._match = {p: 0 for p in self._peers}
        self._probing = set(self._peers)
        self._probe_inflight = set()
        self._uncommitted = {}
        for index in range(self.commit_index + 1, self.log.last_index + 1):
            self._track_uncommitted(self.log.entry(index))
        self._progress_at = {p: self._now for p in self._peers}
        self._acked_at = {}
        self._sent_commit = {p: 0 for p in self._peers}
        # A no-op in the new term lets earlier entries commit (Raft, section 5.4.2).
        self._append_local(None)
        self._on_leader_change()

    def _on_leader_change(self) -> None:
        # Batches sent to an earlier leader may have died with its term: offer them again.
        for queue in self._outbox.values():
            for pending in queue:
                pending.sent_at = None
        self._flush_outbox()

    # ------------------------------------------------------------------ votes

    def _log_is_current(self, last_index: int, last_term: int) -> bool:
        return (last_term, last_index) >= (self.log.last_term, self.log.last_index)

    def _leader_is_alive(self, request: VoteRequest) -> bool:
        """Ignore a campaign while a live leader is known (Raft thesis 4.2.3): a member
        that fell behind or was cut off, and campaigns again and again, must not depose a
        leader the rest of the group still follows. Ignoring a message is always safe."""
        if request.transfer or request.term <= self.term:
            return False
        horizon = self._now - self.timing.election_ticks
        if self.role == Role.LEADER:
            # Followers that answered our Appends lately; a campaigning peer does not count.
            acked = sum(1 for at in self._acked_at.values() if at >= horizon)
            return acked + 1 >= self.group.quorum
        leader = self.leader
        return (
            self.role == Role.FOLLOWER
            and leader is not None
            and self._heard_at.get(leader, _NEVER) >= horizon
        )

    def _on_vote_request(self, candidate: str, request: VoteRequest) -> None:
        grant = (
            request.term == self.term
            and request.term > self._vote_withheld_term
            and self.voted_for in (None, candidate)
            and self._log_is_current(request.last_index, request.last_term)
        )
        if grant:
            self._set_term(self.term, candidate)
            self._reset_election_timer()
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
        index = self.log.last_index + 1
        entry = Entry(index, self.term, batch)
        self.log.append(entry)
        self._track_uncommitted(entry)
        self._mark_persist(index)

    def _track_uncommitted(self, entry: Entry) -> None:
        if entry.batch is not None:
            batch = entry.batch
            self._uncommitted[(batch.origin_partition, batch.start, batch.end)] = entry.index

    def _mark_persist(self, index: int) -> None:
        current = self._ready.persist_from
        self._ready.persist_from = index if current is None else min(current, index)

    def _entries_for(self, peer: str, first: int, limit: int | None = None) -> list[Entry] | None:
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
                    span = (max(1, first - 1), upto)
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

    def _send_append(self, peer: str, entries: list[Entry], prev_index: int) -> None:
        prev_term = self._term_of(prev_index)
        if prev_term is None:
            return
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
        self._sent_commit[peer] = self.commit_index
        if entries:
            self._next[peer] = entries[-1].index + 1

    def _replicate(self, heartbeat: bool) -> None:
        """Send each peer what it lacks; on heartbeats also repair lost messages."""
        self._refresh_all_durable()
        last = self.log.last_index
        for peer in self._peers:
            if heartbeat:
                self._probe_inflight.discard(peer)
                stalled = self._now - self._progress_at[peer] >= self.timing.election_ticks
                if peer not in self._probing and stalled and self._match[peer] < last:
                    self._start_probing(peer)
            if peer in self._probing:
                if peer in self._probe_inflight:
                    continue
                self._probe_inflight.add(peer)
                first = self._next[peer]
                # A probe carries one entry: it may be resent every heartbeat until the
                # peer's position is known, and must stay cheap for a peer far behind.
                entries = self._entries_for(peer, first, 1) if first <= last else []
                if entries is not None:
                    self._send_append(peer, entries, first - 1)
                    self._next[peer] = first  # probes do not advance optimistically
            elif self._next[peer] <= last and self._window_open(peer):
                entries = self._entries_for(peer, self._next[peer])
                if entries is not None:
                    self._send_append(peer, entries, self._next[peer] - 1)
            elif heartbeat or self._sent_commit[peer] < self.commit_index:
                # Nothing new: a bare heartbeat at a position the peer is known to hold.
                self._send_append(peer, [], self._match[peer])

    def _window_open(self, peer: str) -> bool:
        # Bound what is in flight to a peer, so a slow peer cannot make us send the log
        # again and again (etcd's MaxInflightMsgs plays the same role).
        in_flight = self._next[peer] - 1 - self._match[peer]
        return in_flight < 4 * self.timing.max_entries_per_append

    def _start_probing(self, peer: str) -> None:
        self._probing.add(peer)
        self._probe_inflight.discard(peer)
        self._next[peer] = self._match[peer] + 1

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
            self._become_follower(append.term, leader)
        self._reset_election_timer()
        prev_index, prev_term, entries = append.prev_index, append.prev_term, list(append.entries)
        if prev_index < self.log.snapshot_index:
            # Our compacted prefix is committed, so it matches: skip what it covers.
            entries = [e for e in entries if e.index > self.log.snapshot_index]
            prev_index, prev_term = self.log.snapshot_index, self.log.snapshot_term
            if entries and entries[0].index != prev_index + 1:
                entries = []
        if self.log.term_at(prev_index) != prev_term:
            hint = min(self.log.last_index, prev_index - 1)
            self._send(
                leader,
                AppendReply(
                    self.term, False, 0, hint, prev_index, append.incarnation, self.incarnation
                ),
            )
            return
        changed = self.log.merge(entries)
        if changed is not None:
            self._mark_persist(changed)
        match = prev_index + len(entries)
        self._all_durable = max(self._all_durable, append.all_durable)
        self._known_commit = max(self._known_commit, append.commit)
        self._advance_commit(min(append.commit, match))
        self._send(
            leader, AppendReply(self.term, True, match, 0, 0, append.incarnation, self.incarnation)
        )

    def _on_append_reply(self, peer: str, reply: AppendReply) -> None:
        if (
            self.role != Role.LEADER
            or reply.term != self.term
            or reply.incarnation != self.incarnation
        ):
            return
        if self._peer_incarnation.get(peer, reply.peer_incarnation) != reply.peer_incarnation:
            # The peer restarted: what it acknowledged before may be gone (a witness).
            self._match[peer] = 0
            self._next[peer] = self.log.last_index + 1
            self._probing.add(peer)
        self._peer_incarnation[peer] = reply.peer_incarnation
        self._acked_at[peer] = self._now
        if reply.success or reply.rejected_index == self._next[peer] - 1:
            # This answers the probe in flight (older answers must not trigger resends).
            self._probe_inflight.discard(peer)
        if reply.success:
            if reply.match_index > self._match[peer]:
                # Only a growing match is progress: heartbeats are answered while lost
                # entries still need resending.
                self._progress_at[peer] = self._now
                self._match[peer] = reply.match_index
                self._leader_commit()
            if peer in self._probing:
                self._probing.discard(peer)
                self._next[peer] = self._match[peer] + 1
            else:
                self._next[peer] = max(self._next[peer], self._match[peer] + 1)
        elif peer not in self._probing:
            if reply.rejected_index > self._match[peer]:
                self._start_probing(peer)
        elif reply.rejected_index == self._next[peer] - 1:
            # Only the answer to the current probe moves it; older rejections are stale.
            self._next[peer] = max(
                self._match[peer] + 1, min(reply.rejected_index, reply.hint_index + 1)
            )

    def _leader_commit(self) -> None:
        own = self.log.last_index
        candidates = sorted([own, *self._match.values()], reverse=True)
        majority_index = candidates[self.group.quorum - 1]
        # Only entries of the current term commit by counting (Raft, figure 8).
        if majority_index > self.commit_index and self.log.term_at(majority_index) == self.term:
            self._advance_commit(majority_index)

    def _refresh_all_durable(self) -> None:
        if self.role != Role.LEADER:
            return
        durable = [
            self.log.last_index if m == self.member else self._match[m]
            for m in self.group.data_members
        ]
        self._all_durable = max(self._all_durable, min(durable))

    def _advance_commit(self, index: int) -> None:
        if index <= self.commit_index:
            return
        if self._uncommitted:
            for position in range(self.commit_index + 1, index + 1):
                batch = self.log.entry(position).batch
                if batch is not None:
                    self._uncommitted.pop((batch.origin_partition, batch.start, batch.end), None)
        self.commit_index = index
        if self.ledger is None:
            self._compact()
            return
        while self.ledger.applied_index < self.commit_index:
            delivery = self.ledger.apply(self.log.entry(self.ledger.applied_index + 1))
            self._ready.deliveries.append(delivery)
            where = delivery.origin_partition
            if where is not None and where[0] == self.member:
                self._settle_outbox(delivery)

    def _compact(self) -> None:
        if self.ledger is None:
            # A witness keeps what some data member may still need, within a bound.
            floor = max(self._all_durable, self.commit_index - self.timing.retained_applied)
            upto = min(self.commit_index, floor)
        else:
            floor = max(self._all_durable, self._durable_applied - self.timing.retained_applied)
            upto = min(self._durable_applied, floor)
        if upto > self.log.snapshot_index:
            self.log.compact(upto)
            span = self.timing.max_entries_per_append
            stale = upto - span
            # Entries read back for a lagging peer stay until they are sent (its next
            # Append starts at next - 1, for prev_term): a busy leader compacts between
            # the load and the next probe, and must not drop them meanwhile.
            wanted = [self._next[p] - 1 for p in self._peers] if self.role == Role.LEADER else []
            for index in [
                i
                for i in self._loaded
                if i <= stale and not any(0 <= i - first <= span for first in wanted)
            ]:
                del self._loaded[index]

    # ------------------------------------------------------------------ witness handover

    def _hand_over_leadership(self) -> None:
        if self._now - self._transfer_sent_at < self.timing.election_ticks * 2:
            return
        if self.commit_index != self.log.last_index:
            return
        for peer in self.group.data_members:
            if self._match[peer] == self.log.last_index:
                self._transfer_sent_at = self._now
                self._send(peer, TimeoutNow(self.term))
                return

    # ------------------------------------------------------------------ recovery

    def _send_recover_requests(self) -> None:
        self._recover_replies.clear()
        for peer in self._peers:
            self._send(peer, RecoverRequest(self.term, self._recover_nonce))

    def _on_recover_request(self, sender: str, request: RecoverRequest) -> None:
        # Everyone answers, recovering witnesses too (with their empty state): a candidate
        # we voted for before losing our memory is either alive and knows its term, or it
        # restarted and its old candidacy can no longer collect votes (incarnations).
        commit_term = self.log.term_at(self.commit_index)
        assert commit_term is not None
        entries = tuple(self.log.slice(self.commit_index + 1, self.log.last_index))
        self._send(
            sender,
            RecoverReply(self.term, request.nonce, self.commit_index, commit_term, entries),
        )

    def _on_recover_reply(self, sender: str, reply: RecoverReply) -> None:
        if reply.nonce != self._recover_nonce:
            return
        self._recover_replies[sender] = reply
        if any(m not in self._recover_replies for m in self._peers):
            return
        replies = list(self._recover_replies.values())
        term = max(r.term for r in replies)

        def freshness(r: RecoverReply) -> tuple[int, int]:
            last = r.entries[-1] if r.entries else None
            return (last.term, last.index) if last else (r.commit_term, r.commit_index)

        best = max(replies, key=freshness)
        self.log.reset(best.commit_index, best.commit_term, list(best.entries))
        self.commit_index = best.commit_index
        # We may have voted in `term` before we lost our memory: do not vote in it again.
        self._vote_withheld_term = term
        self._set_term(term, None)
        self.role = Role.FOLLOWER
        self._recover_replies.clear()
        self._reset_election_timer()

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

    def _accept_batch(self, batch: OriginBatch) -> bool:
        if self.log.last_index - self.commit_index >= self.timing.max_uncommitted:
            return False
        if self.ledger is not None and self.ledger.covers(batch):
            return True  # already delivered: ordering it again would only be dropped
        if (batch.origin_partition, batch.start, batch.end) in self._uncommitted:
            return True
        self._append_local(batch)
        return True

    def _flush_outbox(self) -> None:
        if not self._outbox or self.role == Role.RECOVERING:
            return
        if self.role == Role.LEADER:
            for queue in self._outbox.values():
                for pending in queue:
                    if self._due(pending) and self._accept_batch(pending.batch):
                        pending.sent_at = self._now
            return
        if self.leader is None:
            return
        due: list[OriginBatch] = []
        for queue in self._outbox.values():
            for pending in queue:
                if self._due(pending):
                    pending.sent_at = self._now
                    due.append(pending.batch)
        if due:
            self._send(self.leader, Forward(self.term, tuple(due)))

    def _due(self, pending: _Pending) -> bool:
        return pending.sent_at is None or self._now - pending.sent_at >= self.timing.resend_ticks

    def _settle_outbox(self, delivery: Delivery) -> None:
        where = delivery.origin_partition
        assert where is not None and self.ledger is not None
        queue = self._outbox.get(where)
        if not queue:
            return
        mark = self.ledger.marks.get(where)
        while queue and mark is not None and queue[0].batch.end <= mark:
            queue.popleft()
        if delivery.verdict == BatchVerdict.GAP:
            # An earlier batch of ours went missing: offer everything outstanding again.
            for pending in queue:
                pending.sent_at = None
        if not queue:
            del self._outbox[where]

    # ------------------------------------------------------------------ plumbing

    def _send(self, peer: str, message: Message) -> None:
        self._ready.messages.append(Outbound(peer, message))
