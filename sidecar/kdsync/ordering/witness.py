"""How a witness, which keeps nothing durable, gets its state back after every start.

A (re)started witness asks every other member for its term and log (``RecoverRequest``)
and neither votes nor acknowledges until *all* of them have answered. It then adopts:

- the highest term any of them reported, withholding its vote in that term (it may have
  voted in it before it lost its memory);
- the most up-to-date of their logs (above that member's commit index) as its own.

An answer is bounded in bytes like every peer message; a longer log comes in parts
(``WitnessRecovery``).

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
    term: int, log: ReplicatedLog, commit_index: int, request: RecoverRequest, max_bytes: int
) -> RecoverReply:
    """Any member's answer to a recovering witness: its term and its log after its
    commit index, or after the request's ``after_index`` when our log still holds that
    entry with ``after_term`` (by Raft's log matching, everything before it then matches
    what the witness holds too). At most ``max_bytes`` of batches (at least one entry)."""
    commit_term = log.term_at(commit_index)
    assert commit_term is not None
    prev_index, prev_term = commit_index, commit_term
    after = request.after_index
    if after > 0 and log.term_at(after) == request.after_term:
        prev_index, prev_term = after, request.after_term
    last = log.last_index
    end = max(log.index_after_bytes(prev_index + 1, max_bytes), min(prev_index + 1, last))
    entries = tuple(log.slice(prev_index + 1, end))
    return RecoverReply(
        term, request.nonce, commit_index, commit_term, entries, prev_index, prev_term, end < last
    )


@dataclass(slots=True)
class _Answer:
    term: int
    commit_index: int
    commit_term: int
    entries: list[Entry]
    parts: int = 1

    def last(self) -> tuple[int, int]:
        """(index, term) of the last entry received, or of the commit point."""
        if self.entries:
            return self.entries[-1].index, self.entries[-1].term
        return self.commit_index, self.commit_term

    def freshness(self) -> tuple[int, int]:
        """Raft's "up to date": the last entry's term first, then its index."""
        index, term = self.last()
        return term, index


class WitnessRecovery:
    """One recovery: asks everyone, and concludes once everyone has answered in full.

    An answer too large for one message comes in parts, each asked for after the last
    entry received. A part that no longer continues what we hold (the sender's log was
    overwritten meanwhile) starts that sender's answer afresh from its commit index.
    On a re-ask (every election timeout until all have answered), answers that came in
    one message are forgotten and asked for again, fresher; answers that took several
    parts, and parts received so far, are kept, or a large answer might never complete
    within one re-ask period. Keeping one is safe: it was given after this witness
    started, which is all the recovery needs (logs and terms only move forward).
    """

    def __init__(self, peers: tuple[str, ...], nonce: int) -> None:
        self._peers = peers
        self._nonce = nonce
        self._complete: dict[str, _Answer] = {}
        self._partial: dict[str, _Answer] = {}

    def requests(self, term: int) -> list[tuple[str, RecoverRequest]]:
        """(Re)ask everyone whose answer is not complete: from the start, or after what
        came so far (a message may have been lost)."""
        for peer in [p for p, answer in self._complete.items() if answer.parts == 1]:
            del self._complete[peer]
        return [
            (peer, self._request(term, peer)) for peer in self._peers if peer not in self._complete
        ]

    def _request(self, term: int, peer: str) -> RecoverRequest:
        partial = self._partial.get(peer)
        if partial is None:
            return RecoverRequest(term, self._nonce)
        index, entry_term = partial.last()
        return RecoverRequest(term, self._nonce, index, entry_term)

    def reply(
        self, sender: str, reply: RecoverReply, term: int
    ) -> RecoveredWitness | RecoverRequest | None:
        """The recovered state once every answer is complete; the request for the next
        part when this one says there is more; else None."""
        if reply.nonce != self._nonce or sender in self._complete:
            return None
        partial = self._partial.get(sender)
        if partial is not None and (reply.prev_index, reply.prev_term) == partial.last():
            partial.entries.extend(reply.entries)
            partial.term = max(partial.term, reply.term)
            partial.parts += 1
        elif reply.prev_index == reply.commit_index:
            partial = _Answer(
                reply.term, reply.commit_index, reply.commit_term, list(reply.entries)
            )
        else:
            return None  # a part continuing something we no longer hold
        if reply.more:
            self._partial[sender] = partial
            return self._request(term, sender)
        self._partial.pop(sender, None)
        self._complete[sender] = partial
        if any(m not in self._complete for m in self._peers):
            return None
        answers = list(self._complete.values())
        best = max(answers, key=_Answer.freshness)
        return RecoveredWitness(
            max(a.term for a in answers), best.commit_index, best.commit_term, tuple(best.entries)
        )
