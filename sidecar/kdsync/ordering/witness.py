"""How a witness, which keeps nothing durable, gets its state back after every start.

A (re)started witness asks every other member for its term and log (``RecoverRequest``)
and neither votes nor acknowledges until *all* of them have answered. It then adopts:

- the highest term any of them reported, withholding its vote in that term (it may have
  voted in it before it lost its memory);
- the most up-to-date of their logs (above that member's commit index) as its own.

Every member answers, recovering witnesses too (with their empty state): a candidate the
witness voted for before losing its memory is either alive and knows its term, or it
restarted, and its old candidacy can no longer collect votes (incarnations).
"""

from __future__ import annotations

from dataclasses import dataclass

from kdsync.ordering.log import Entry, ReplicatedLog
from kdsync.ordering.messages import RecoverReply, RecoverRequest


@dataclass(frozen=True, slots=True)
class RecoveredWitness:
    term: int  # adopt, with the vote in it withheld
    commit_index: int
    commit_term: int
    entries: tuple[Entry, ...]  # the log after commit_index


def recover_reply(
    term: int, log: ReplicatedLog, commit_index: int, request: RecoverRequest
) -> RecoverReply:
    """Any member's answer to a recovering witness: its term and log after its commit."""
    commit_term = log.term_at(commit_index)
    assert commit_term is not None
    entries = tuple(log.slice(commit_index + 1, log.last_index))
    return RecoverReply(term, request.nonce, commit_index, commit_term, entries)


class WitnessRecovery:
    """One recovery: asks everyone, and concludes once everyone has answered."""

    def __init__(self, peers: tuple[str, ...], nonce: int) -> None:
        self._peers = peers
        self._nonce = nonce
        self._replies: dict[str, RecoverReply] = {}

    def requests(self, term: int) -> list[tuple[str, RecoverRequest]]:
        """(Re)send to everyone; earlier answers are forgotten (they may be stale)."""
        self._replies.clear()
        return [(peer, RecoverRequest(term, self._nonce)) for peer in self._peers]

    def reply(self, sender: str, reply: RecoverReply) -> RecoveredWitness | None:
        if reply.nonce != self._nonce:
            return None
        self._replies[sender] = reply
        if any(m not in self._replies for m in self._peers):
            return None
        replies = list(self._replies.values())

        def freshness(r: RecoverReply) -> tuple[int, int]:
            last = r.entries[-1] if r.entries else None
            return (last.term, last.index) if last else (r.commit_term, r.commit_index)

        best = max(replies, key=freshness)
        return RecoveredWitness(
            max(r.term for r in replies), best.commit_index, best.commit_term, best.entries
        )
