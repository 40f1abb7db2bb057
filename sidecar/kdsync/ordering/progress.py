"""What a leader knows about each follower, in the manner of etcd raft's tracker.

A peer is *probing* while its position is unknown (one ``Append`` in flight, resent each
heartbeat until it answers) and *replicating* once confirmed (optimistic pipeline within
a window). A replicating peer that stops making progress goes back to probing. Replies
from an earlier incarnation of the peer, or answering an earlier probe, are recognised
and ignored.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

NEVER = -(10**18)
# Appends a replicating peer may have unanswered at once; with their bytes bounded too
# (Timing.max_append_bytes each), a slow peer's queue stays short, so heartbeats reach it.
MAX_INFLIGHT_APPENDS = 4


class ProgressState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"


@dataclass(slots=True)
class Progress:
    """A leader's view of one peer, for the current term."""

    next: int  # the next index to send
    match: int = 0  # the peer's log is known to match ours up to here
    # The peer holds entries matching ours up to here, written or not: what it answered
    # receiving. Slow log writes keep ``match`` behind it; a lost Append does not.
    received: int = 0
    state: ProgressState = ProgressState.PROBE
    probe_sent: bool = False  # a probe is in flight (answered or resent on heartbeat)
    unanswered_probes: int = 0  # resent probes carry no entries: a slow peer gets less
    progress_at: int = NEVER  # tick of the last growth of ``match``
    acked_at: int = NEVER  # tick of the last reply in this term
    sent_commit: int = 0  # the commit index last told to the peer
    incarnation: int | None = None  # the peer's, from its replies
    applied: int = 0  # the peer's entries up to here are in its T-global
    # Appends sent and not yet acknowledged: (last index, bytes, tick sent), oldest first.
    inflight: deque[tuple[int, int, int]] = field(default_factory=deque)
    inflight_bytes: int = 0

    def become_probe(self, floor: int = 0) -> None:
        """Probe from just after what the peer is known to hold: its match, or ``floor``
        (what every data member has stored, which a data member keeps across restarts:
        probing below it could need entries every log has already trimmed)."""
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.unanswered_probes = 0
        self.next = max(self.match, floor) + 1
        self._forget_inflight()

    def become_replicate(self, floor: int = 0) -> None:
        """Send from just after the peer's match, or ``floor`` as in ``become_probe``: a
        late answer may confirm less than every data member has stored by now."""
        self.state = ProgressState.REPLICATE
        self.next = max(self.match, floor) + 1

    def update_match(self, match: int, received: int, now: int) -> bool:
        """A reply: the peer wrote up to ``match`` and holds up to ``received``; True when
        its ``match`` grew."""
        self.received = max(self.received, received, match)
        if match <= self.match:
            return False  # heartbeats are answered while lost entries still need resending
        self.match = match
        self.progress_at = now
        self.next = max(self.next, match + 1)
        while self.inflight and self.inflight[0][0] <= match:
            self.inflight_bytes -= self.inflight.popleft()[1]
        return True

    def sent(self, last_index: int, size: int, now: int) -> None:
        self.inflight.append((last_index, size, now))
        self.inflight_bytes += size

    def stalled(self, now: int, patience: int) -> bool:
        """An Append sent ``patience`` ticks ago or more is not answered as received: it,
        or its answer, was lost. Unwritten entries the peer answered receiving are not:
        it writes slowly, and resending them would only repeat what it holds (read back
        again from storage, for a peer far behind). With nothing in flight, no growth
        of ``match`` for four times ``patience``: a read-back for it may take that long
        on a busy broker, but a peer we cannot send to from where it stands (a witness
        leader holds no history) must be probed from elsewhere."""
        for last_index, _, sent_at in self.inflight:
            if last_index > self.received:
                return now - sent_at >= patience
        return not self.inflight and now - self.progress_at >= 4 * patience

    def window_open(self, max_bytes: int) -> bool:
        return len(self.inflight) < MAX_INFLIGHT_APPENDS and self.inflight_bytes < max_bytes

    def _forget_inflight(self) -> None:
        self.inflight.clear()
        self.inflight_bytes = 0

    def restarted(self, last_index: int) -> None:
        """The peer came back with a new incarnation: what it acknowledged may be gone
        (a witness keeps nothing), so probe again from our end."""
        self.match = self.received = 0
        self.become_probe()
        self.next = last_index + 1


class ProgressTracker:
    """Every peer's ``Progress`` while this member leads."""

    def __init__(self, peers: tuple[str, ...], next_index: int, now: int) -> None:
        self.peers = {p: Progress(next_index, progress_at=now) for p in peers}

    def set_peers(self, peers: tuple[str, ...], next_index: int, now: int) -> None:
        """The configuration changed: track new peers (probed from our end, like every
        peer of a new leader), forget those that left."""
        self.peers = {p: self.peers.get(p) or Progress(next_index, progress_at=now) for p in peers}

    def __getitem__(self, peer: str) -> Progress:
        return self.peers[peer]

    def matches(self) -> dict[str, int]:
        return {p: pr.match for p, pr in self.peers.items()}

    def quorum_match(self, own_last: int, voters: tuple[str, ...], me: str, quorum: int) -> int:
        """The highest index stored by ``quorum`` of ``voters`` (ourselves included)."""
        stored = sorted(
            (own_last if m == me else self.peers[m].match for m in voters), reverse=True
        )
        return stored[quorum - 1] if quorum <= len(stored) else 0

    def acked_since(self, tick: int, voters: tuple[str, ...]) -> int:
        """Voting peers that answered this term at or after ``tick``."""
        peers = self.peers
        return sum(1 for m in voters if m in peers and peers[m].acked_at >= tick)

    def durable_floor(self, data_members: tuple[str, ...], me: str, own_last: int) -> int:
        """Every data member has stored the log up to here."""
        return min(own_last if m == me else self.peers[m].match for m in data_members)

    def applied_by_half(
        self, data_members: tuple[str, ...], me: str, own_applied: int, since: int
    ) -> int:
        """The applied index reached by the faster half of the data members that answered
        at or after ``since`` (and ourselves, if a data member): admission waits for it, so
        a burst slows the sources to what the group can write, while a slow or halted
        destination, or a member that is away, does not hold the others back."""
        applied = sorted(
            (
                own_applied if m == me else self.peers[m].applied
                for m in data_members
                if m == me or self.peers[m].acked_at >= since
            ),
            reverse=True,
        )
        return applied[(len(applied) - 1) // 2] if applied else own_applied
