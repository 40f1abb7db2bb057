"""Replication: Appends and their answers, probes, read-back for lagging peers,
commit, and compaction of the in-memory log.

A leader sends each peer what it lacks, a bounded window at a time (``Progress``
tracks each peer), probing where the peer's log diverges; entries already compacted
from memory are read back from durable storage through ``Ready.loads``. A follower
acknowledges only what it has written. Entries of the current term commit once a
majority has written them.
"""

from __future__ import annotations

from kdsync.ordering.events import OriginBatch
from kdsync.ordering.log import Entry, entry_size
from kdsync.ordering.messages import Append, AppendReply
from kdsync.ordering.node_state import NodeState
from kdsync.ordering.outbox import batch_key
from kdsync.ordering.progress import ProgressState
from kdsync.ordering.ready import Role

# How many Appends' worth of entries a leader reads back at once for a lagging peer.
_READ_AHEAD_APPENDS = 4


class Replication(NodeState):
    # ------------------------------------------------------------------ the leader's log

    def _append_local(self, batch: OriginBatch | None) -> None:
        self._replication_due = True
        index = self.log.last_index + 1
        entry = Entry(index, self.term, batch)
        self.log.append(entry)
        self._track_uncommitted(entry)
        self._mark_persist(index)

    def _track_uncommitted(self, entry: Entry) -> None:
        if entry.batch is not None:
            key = batch_key(entry.batch)
            if key not in self._uncommitted:
                self._uncommitted_bytes += entry.batch.size_bytes()
            self._uncommitted[key] = entry.index

    def _mark_persist(self, index: int) -> None:
        if self.ledger is None:
            return  # a witness keeps nothing durable
        current = self._ready.persist_from
        self._ready.persist_from = index if current is None else min(current, index)

    # ------------------------------------------------------------------ sending

    def _entries_for(self, first: int, limit: int | None = None) -> list[Entry] | None:
        """Entries from ``first`` for an Append, or None while they must be loaded."""
        entries = self._entries_from(first)
        if entries is not None and limit is not None:
            entries = entries[:limit]
        if entries is None or len(entries) < 2:
            return entries
        budget = self.timing.max_append_bytes
        for count, entry in enumerate(entries):
            budget -= entry_size(entry)
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
        for index in range(self._append_start(first), upto + 1):
            entry = self._loaded.get(index)
            if entry is None:
                if index > first:
                    return loaded  # a read-back stops at its byte bound: send what came
                if not self.is_witness:
                    # Load the entry before ``first`` too: its term is the Append's prev_term.
                    self._ask_load(index, first - 1)
                return None
            if index >= first:
                loaded.append(entry)
        if upto < last:
            loaded.extend(self.log.slice(upto + 1, last))
        return loaded

    def _ask_load(self, first: int, base: int) -> None:
        """Ask the shell to read entries back from ``first`` to a window's worth past
        ``base``: a lagging peer, or our own applying, then goes at the pace of the
        pipeline, not one read per Append (the shell stops at ``max_load_bytes``).

        The span may reach past our compacted prefix, up to what is committed and
        written here (its stored form is final): a busy leader compacts on while a slow
        read-back runs, and ``entries_loaded`` keeps what left memory meanwhile. Capped
        at the compacted prefix, each read-back would end where compaction already
        was, and a peer far behind would chase it for as long as traffic lasts."""
        final = max(self.log.snapshot_index, min(self.commit_index, self._durable_end()))
        last = min(final, base + self._read_ahead())
        if first not in self._loads_out:
            self._loads_wanted[first] = max(last, self._loads_wanted.get(first, last))

    def _read_ahead(self) -> int:
        """Entries a read-back reaches past where its consumer stands, and what is kept
        of it (``_forget_loaded``): the two must agree, or what is read is dropped."""
        return _READ_AHEAD_APPENDS * self.timing.max_entries_per_append

    def _hand_out_loads(self) -> None:
        """The spans asked go to the shell together once no read-back is out (see
        ``entries_loaded``); the shell bounds each span's bytes on its own, so none
        starves behind another."""
        if self._loads_out or not self._loads_wanted:
            return
        needed = self._first_unloaded()
        # Spans queued a while may be stale: their peer moved on, or another read-back
        # brought what they were for. Reading them would spend a read on nobody.
        spans = [
            (first, last)
            for first, last in self._loads_wanted.items()
            if any(first <= index <= last for index in needed)
        ]
        self._loads_wanted = {}
        if spans:
            self._ready.loads = spans
            self._loads_out = tuple(first for first, _ in spans)

    def _read_back_starts(self) -> list[int]:
        """Where each lagging peer's next Append (from its next - 1, whose term the
        Append carries) and our own applying go on from."""
        starts = (
            [self._append_start(self._tracker[p].next) for p in self._peers]
            if self._tracker is not None
            else []
        )
        if self.ledger is not None:
            starts.append(self.ledger.applied_index + 1)
        return starts

    def _first_unloaded(self) -> set[int]:
        """For each start, the first compacted entry it needs that is not read back."""
        needed: set[int] = set()
        for start in self._read_back_starts():
            index = start
            while index in self._loaded:
                index += 1
            if index <= self.log.snapshot_index:
                needed.add(index)
        return needed

    def _append_start(self, first: int) -> int:
        """The first entry an Append from ``first`` needs: the one before it (its term
        is the Append's prev_term), unless that is where our log starts, whose term we
        know without it (a member seeded by a backfill holds no entry there)."""
        return first if first - 1 == self._log_start[0] else max(1, first - 1)

    def _committed_entry(self, index: int) -> Entry | None:
        """A committed entry to apply, or None while it is read back from storage."""
        if index > self.log.snapshot_index:
            return self.log.entry(index)
        entry = self._loaded.get(index)
        if entry is None:
            self._ask_load(index, index - 1)
        return entry

    def _term_of(self, index: int) -> int | None:
        if index == 0:
            return 0
        term = self.log.term_at(index)
        if term is None and index in self._loaded:
            term = self._loaded[index].term
        if term is None and index == self._log_start[0]:
            term = self._log_start[1]
        return term

    def _send_append(self, peer: str, entries: list[Entry], prev_index: int) -> bool:
        assert self._tracker is not None
        prev_term = self._term_of(prev_index)
        if prev_term is None:
            return False
        witness = self.config.is_witness(peer)
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
                self._config_news(prev_index, to=peer) if witness else None,
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
                # A peer that has not answered receiving an Append for an election
                # timeout is probed again; not one that writes slowly. One with none out
                # waits on a read-back for it, which may take longer on a busy broker:
                # probing would restart it one entry at a time (Progress.stalled).
                stalled = pr.stalled(self._now, self.timing.election_ticks)
                if pr.state == ProgressState.REPLICATE and stalled and pr.match < last:
                    pr.become_probe(self._probe_floor(peer))
            if self.config.is_witness(peer) and pr.next <= self.log.snapshot_index:
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
                    pr.sent(entries[-1].index, sum(entry_size(e) for e in entries), self._now)
                elif entries is None and heartbeat:
                    # Read back for the peer meanwhile: it must still hear us, or it
                    # campaigns while we wait on a slow broker.
                    self._send_heartbeat(peer)
            elif heartbeat or pr.sent_commit < self.commit_index:
                self._send_heartbeat(peer)

    def _send_heartbeat(self, peer: str) -> None:
        """An Append with nothing new, at a position the peer is known to hold, or at our
        compacted prefix once that position left memory (committed past max_log_bytes):
        a peer that lacks it refuses it, and is probed if it was sent that far."""
        assert self._tracker is not None
        match = self._tracker[peer].match
        at = match if self._term_of(match) is not None else self.log.snapshot_index
        self._send_append(peer, [], at)

    # ------------------------------------------------------------------ receiving

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
                committed = self.commit_index
                self.log.reset(prev_index, prev_term, [])
                self.commit_index = prev_index
                self._start_over_configs(prev_index, append.config, committed)
            else:
                hint = min(self.log.last_index, prev_index - 1)
                # What we wrote of this leader's log still counts: a heartbeat at a position
                # we lack (its compacted prefix) must not hide a slow write's progress.
                self._send(
                    leader,
                    AppendReply(
                        self.term,
                        False,
                        self._written_of_leader(),
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
            self._configs_changed(changed, [e for e in entries if e.index >= changed])
        committed = self.commit_index
        for entry in entries:
            # Only entries not yet committed: an old Append seen again must not mark a
            # batch as on its way once its entry committed (as a gap, say: the outbox
            # decides that at commit, and the batch must travel again).
            batch = entry.batch
            if batch is not None and batch.origin == self.member and entry.index > committed:
                self.outbox.appended(batch_key(batch))
        match = prev_index + len(entries)
        self._all_durable = max(self._all_durable, append.all_durable)
        self._known_commit = max(self._known_commit, append.commit)
        self._advance_commit(min(append.commit, match))
        # Acknowledge at once, but only what is written (``persisted`` acknowledges the
        # rest); ``hint_index`` says how far our log matches, for the next Append. Both
        # count everything this leader sent us, not only this Append: a heartbeat's answer
        # then repairs a lost acknowledgement of a slow write.
        self._leader_match = max(self._leader_match, match)
        self._leader_incarnation = append.incarnation
        durable = self._written_of_leader()
        self._reported_match = max(self._reported_match, durable)
        self._send(
            leader,
            AppendReply(
                self.term,
                True,
                durable,
                self._leader_match,
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
        if peer not in tracker.peers:
            return  # removed from the group since we sent to it
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
        # A refusal says what the peer wrote of our log too, but not how far it holds it.
        received = reply.hint_index if reply.success else reply.match_index
        if pr.update_match(reply.match_index, received, self._now):
            self._leader_commit()
        if reply.success:
            pr.applied = max(pr.applied, reply.applied_index)
            if pr.state == ProgressState.PROBE:
                pr.become_replicate(self._probe_floor(peer))
            # The peer holds (not yet all written) entries up to hint_index: go on from there.
            pr.next = max(pr.next, reply.hint_index + 1)
        elif pr.state == ProgressState.REPLICATE:
            # Refused at or past ``next``: a heartbeat at our compacted prefix to a peer
            # that has not been sent that far yet (it waits on a read-back), which says
            # nothing new. Refused below: its log diverges from what we sent, so probe.
            if pr.match < reply.rejected_index < pr.next:
                pr.become_probe(self._probe_floor(peer))
        elif reply.rejected_index == pr.next - 1:
            # Only the answer to the current probe moves it; older rejections are stale.
            probed = pr.next
            pr.next = max(pr.match + 1, min(reply.rejected_index, reply.hint_index + 1))
            if pr.next >= probed:
                # Refused where it is known to match (a late duplicate, or a peer that
                # lost what it acknowledged): probe again on the next heartbeat, not in
                # a loop as fast as the replies come.
                pr.probe_sent = True

    def _written_of_leader(self) -> int:
        """How far our log is written and matches the current leader's: what every answer
        to it acknowledges (``persisted`` too)."""
        return min(self._leader_match, self._durable_end())

    def _probe_floor(self, peer: str) -> int:
        return 0 if self.config.is_witness(peer) else min(self._all_durable, self.commit_index)

    # ------------------------------------------------------------------ commit

    def _leader_commit(self) -> None:
        assert self._tracker is not None
        majority_index = self._tracker.quorum_match(
            self._own_durable(), self.config.voters, self.member, self._quorum()
        )
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
            self.config.data_members, self.member, self._own_durable()
        )
        self._all_durable = max(self._all_durable, durable)

    def _advance_commit(self, index: int) -> None:
        if index <= self.commit_index:
            return
        if self._uncommitted or self.ledger is not None:
            # Uncommitted entries are all in memory (compaction stops at the commit index).
            for position in range(self.commit_index + 1, index + 1):
                batch = self.log.entry(position).batch
                if batch is None:
                    continue
                if self._uncommitted and self._uncommitted.pop(batch_key(batch), None) is not None:
                    self._uncommitted_bytes -= batch.size_bytes()
                if batch.origin == self.member and not self.outbox.committed(batch):
                    # A batch of ours ahead of it went missing: offer everything again.
                    self.outbox.offer_again()
        self.commit_index = index
        self._replication_due = True
        if self.ledger is None or self.log.bytes > self.timing.max_log_bytes:
            self._compact()

    # ------------------------------------------------------------------ compaction

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
            excess = self.log.bytes - self.timing.max_log_bytes
            if excess > 0:
                # Over the memory bound (this member applies slower than the group
                # commits, or not at all while its T-global refuses a write): committed
                # entries already in our own ordering log leave memory. They are read
                # back when applied or sent to a lagging peer.
                over = self.log.index_after_bytes(self.log.snapshot_index + 1, excess) + 1
                upto = max(upto, min(over, self.commit_index, self._durable_end()))
        if upto > self.log.snapshot_index:
            self.log.compact(upto)
            self._forget_settled_configs()
        if self._loaded:
            self._forget_loaded()

    def _forget_loaded(self) -> None:
        """Keep entries read back only where something is about to send or apply them:
        from a lagging peer's next - 1 (its next Append's prev_term) or our applied index
        + 1, what was read in one run, up to a read-back's span and bytes. A busy leader
        compacts between the load and the next probe, and must not drop them meanwhile;
        a member that applies nothing (its T-global refuses a write) must still drop
        what its peers have moved past; and a peer stuck for good must not make us keep
        every entry after it as others' read-backs join up behind it."""
        ahead = self._read_ahead()
        keep: set[int] = set()
        for start in self._read_back_starts():
            # At least two: a peer's Append needs the entry before the first it carries.
            index, budget = start, self.timing.max_load_bytes
            while index <= start + ahead and (entry := self._loaded.get(index)) is not None:
                keep.add(index)
                budget -= entry_size(entry)
                if budget < 0 and index > start:
                    break
                index += 1
        for index in [i for i in self._loaded if i not in keep]:
            del self._loaded[index]
