"""The fields every part of an ``OrderingNode`` shares, and the steps they all take.

The node's steps live in one module per concept (``kdsync.ordering.node`` lists them),
as methods of classes that all build on this one.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from kdsync.ordering.configuration import Configuration
from kdsync.ordering.election_timer import ElectionTimer
from kdsync.ordering.events import OriginBatch
from kdsync.ordering.group import GroupSpec, Timing
from kdsync.ordering.ledger import DeliveryLedger
from kdsync.ordering.log import Entry, ReplicatedLog
from kdsync.ordering.messages import Message, Outbound
from kdsync.ordering.outbox import BatchKey, Outbox
from kdsync.ordering.progress import NEVER, ProgressTracker
from kdsync.ordering.ready import NodeEvent, Ready, Role
from kdsync.ordering.witness import WitnessRecovery


class NodeState:
    """Fields of one member's ordering state machine (see ``OrderingNode``)."""

    def __init__(
        self,
        member: str,
        group: GroupSpec,
        timing: Timing,
        incarnation: int,
        config: tuple[int, Configuration] | None = None,
    ) -> None:
        config_base = config or (0, Configuration(group.members, group.witnesses))
        if member not in group.members and member not in config_base[1].members:
            raise ValueError(f"{member!r} is not a member of the group {list(group.members)}")
        self.member = member
        self.group = group  # the startup file's: it seeds a new group's configuration
        self.timing = timing
        self.incarnation = incarnation
        self.is_witness = group.is_witness(member) or config_base[1].is_witness(member)
        # Membership: the configuration at or below the compacted prefix (from the
        # ledger, or the seed), then every membership change in the log after it, in
        # order, committed or not. The latest is in force (``config``).
        self._config_base = config_base
        self._configs: list[tuple[int, Configuration]] = []
        self._peers = tuple(m for m in config_base[1].members if m != member)

        self.term = 0
        self.voted_for: str | None = None
        self._vote_withheld_term = -1  # a recovered witness may have voted in this term
        self.leader: str | None = None
        self.role = Role.FOLLOWER
        self.log = ReplicatedLog()
        # (index, term) where our durable log starts: the ledger's applied entry at start.
        # A member seeded by a backfill holds no entry at or below it, but a peer whose
        # log ends exactly there still gets Appends from it (their prev_term).
        self._log_start = (0, 0)
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
        self._trimmed_below = 0  # a data member's log topic, as recovered at start
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
        self._term_start = 0  # as leader: the index of our term's first entry (its no-op)
        # As leader: (tick, commit index) at each heartbeat, back to an election timeout
        # ago, to tell how long ago a learner's position was the commit index.
        self._commit_marks: deque[tuple[int, int]] = deque()
        # As leader: when we were asked to remove ourselves (we hand over first).
        self._leave_asked_at = NEVER
        self._transfer_sent_at = NEVER  # as leader: when we last sent a TimeoutNow
        # As leader that must hand over with nobody caught up: when we began holding
        # admission so that one can catch up (the handover goes as soon as one has).
        self._handover_hold_at = NEVER
        # Batches in the leader's uncommitted suffix: an origin's resend of one of them is
        # not appended again (it would only be dropped as a duplicate after ordering).
        self._uncommitted: dict[BatchKey, int] = {}
        self._uncommitted_bytes = 0  # their batches' size (OriginBatch.size_bytes)
        # Forwarded batches wait here while the leader may not admit more (bounded).
        self._admission: deque[OriginBatch] = deque()
        self._admission_bytes = 0

        self.outbox = Outbox(
            timing.max_outbox,
            timing.max_outbox_bytes,
            timing.max_forward,
            timing.resend_ticks,
            timing.max_forward_bytes,
        )
        self._opened: set[tuple[str, str, int]] = set()
        self._loaded: dict[int, Entry] = {}
        # Read-backs: one is out with the shell at a time (the first index of each of its
        # spans here); spans asked meanwhile wait, first index -> last, and go together
        # next. Dropping them instead let our own applying, which asks again after every
        # answer, starve a lagging peer's.
        self._loads_out: tuple[int, ...] = ()
        self._loads_wanted: dict[int, int] = {}
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

    # ------------------------------------------------------------------ membership

    @property
    def config(self) -> Configuration:
        """The configuration in force: the latest in our log, committed or not."""
        return self._configs[-1][1] if self._configs else self._config_base[1]

    @property
    def heard_configurations(self) -> tuple[Configuration, ...]:
        """Configurations a recovering witness's answers showed, which it does not use
        yet: their members must be reachable (empty when not recovering)."""
        return self._recovery.heard if self._recovery is not None else ()

    @property
    def config_index(self) -> int:
        """Where the configuration in force was appended (0: the startup file's)."""
        return self._configs[-1][0] if self._configs else self._config_base[0]

    def _config_at(self, index: int) -> Configuration | None:
        """The configuration in force at ``index``; None below what we still know
        (changes before our base have left memory)."""
        for at, config in reversed(self._configs):
            if at <= index:
                return config
        return self._config_base[1] if index >= self._config_base[0] else None

    def _configs_changed(self, first: int, entries: list[Entry]) -> None:
        """Our log changed from ``first`` on (truncated there, then ``entries``
        appended): drop the membership changes that went, take the new ones."""
        before = self.config
        self._configs = [(at, c) for at, c in self._configs if at < first]
        self._configs.extend((e.index, e.config) for e in entries if e.config is not None)
        if self.config != before:
            self._config_in_force_changed()

    def _forget_settled_configs(self) -> None:
        """Membership changes at or below the compacted prefix: only the latest of them
        is still needed, as the base."""
        settled = [(at, c) for at, c in self._configs if at <= self.log.snapshot_index]
        if settled:
            self._config_base = settled[-1]
            self._configs = self._configs[len(settled) :]

    def _start_over_configs(self, index: int, config: Configuration | None, committed: int) -> None:
        """Our log now starts after ``index`` with nothing in it (a witness taking a
        leader's committed prefix, or a recovery): ``config`` is the configuration in
        force there, if the sender said; else the latest we held that was committed
        (up to ``committed``: an uncommitted one may be of a branch that lost)."""
        before = self.config
        if config is not None:
            self._config_base = (index, config)
            self._configs = []
        else:
            self._configs = [(at, c) for at, c in self._configs if at <= min(index, committed)]
            self._forget_settled_configs()
        if self.config != before:
            self._config_in_force_changed()

    def _config_in_force_changed(self) -> None:
        config = self.config
        self._peers = tuple(m for m in config.members if m != self.member)
        if self._tracker is not None:
            self._tracker.set_peers(self._peers, self.log.last_index + 1, self._now)
        self._event("configuration", config.describe())

    def _leaving(self) -> bool:
        """Asked lately to remove ourselves: handing over. It lapses, so a change asked
        for and then given up does not hold admission for good."""
        return self._now - self._leave_asked_at < 4 * self.timing.election_ticks

    def _config_news(self, index: int, to: str) -> Configuration | None:
        """The configuration at ``index`` to tell peer ``to``, once the membership ever
        changed: before, every member has the same one from its startup file, and a
        peer of the previous release reads the message only without one.

        A peer outside our configuration is told it even then: it is a member being
        added (so of this release), started with a startup file that lists it. Told
        nothing, it would take that file's group for the group's, and could lead a
        configuration never committed, with votes of members that do not count it."""
        never_changed = self._config_base[0] == 0 and not self._configs
        if never_changed and to in self.config.members:
            return None
        return self._config_at(index)

    def _is_voter(self) -> bool:
        return self.config.is_voter(self.member)

    def _quorum(self) -> int:
        """A majority of the voters in force: every count of votes, acknowledgements and
        stored copies takes this one."""
        return self.config.quorum

    # ------------------------------------------------------------------ plumbing

    def _send(self, peer: str, message: Message) -> None:
        self._ready.messages.append(Outbound(peer, message))

    def _event(self, kind: str, detail: str) -> None:
        self._ready.events.append(NodeEvent(kind, self.term, detail))

    if TYPE_CHECKING:
        # Steps one part of the node takes that another part defines (the class that puts
        # the parts together, ``OrderingNode``, has them all).

        def _become_follower(self, term: int, leader: str | None, why: str) -> None: ...
        def _transferring(self) -> bool: ...
        def _handover_sent_lately(self) -> bool: ...
        def _maybe_hand_over(self) -> None: ...  # all in kdsync.ordering.elections
        def _append_local(self, batch: OriginBatch | None) -> None: ...
        def _mark_persist(self, index: int) -> None: ...
        def _track_uncommitted(self, entry: Entry) -> None: ...  # all in .replication
        def _flush_outbox(self) -> None: ...  # in kdsync.ordering.admission
