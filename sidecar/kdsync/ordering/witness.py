"""How a witness, which keeps nothing durable, gets its state back after every start.

A (re)started witness asks every other member for its term and log (``RecoverRequest``)
and neither votes nor acknowledges until *all* of them have answered. It then adopts:

- the highest term any of them reported, withholding its vote in that term (it may have
  voted in it before it lost its memory);
- the most up-to-date of their logs (above that member's commit index) as its own.

"Every other member" is every voter of every configuration the answers show, from the
newest one they show committed up (each answer says its sender's configuration at its
commit index, and its log may hold later ones), asked again until no new member turns
up: a member added lately may be the candidate the witness voted for before it lost its
memory.

An answer is bounded in bytes like every peer message; a longer log comes in parts
(``WitnessRecovery``). Each request carries its own nonce, which the answer echoes: the
witness keeps one request out per member and takes one answer to it, so a re-ask or a
frame delivered twice never starts a second chain of parts.

Every member answers, recovering witnesses too (with their empty state): a candidate the
witness voted for before losing its memory is either alive and knows its term, or it
restarted, and its old candidacy can no longer collect votes (incarnations).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kdsync.ordering.configuration import Configuration
from kdsync.ordering.log import Entry, ReplicatedLog
from kdsync.ordering.messages import RecoverReply, RecoverRequest


@dataclass(frozen=True, slots=True)
class RecoveredWitness:
    term: int  # adopt, with the vote in it withheld
    commit_index: int
    commit_term: int
    entries: tuple[Entry, ...]  # the log after commit_index
    config: Configuration | None  # in force at commit_index (None: the seed's)


def recover_reply(
    term: int,
    log: ReplicatedLog,
    commit_index: int,
    request: RecoverRequest,
    max_bytes: int,
    config: Configuration | None,
) -> RecoverReply:
    """Any member's answer to a recovering witness: its term and its log after its
    commit index, or after the request's ``after_index`` when our log still holds that
    entry with ``after_term`` (by Raft's log matching, everything before it then matches
    what the witness holds too). At most ``max_bytes`` of batches (at least one entry).
    ``config`` is the sender's configuration in force at its commit index."""
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
        term,
        request.nonce,
        commit_index,
        commit_term,
        entries,
        prev_index,
        prev_term,
        end < last,
        config,
    )


@dataclass(slots=True)
class _Answer:
    term: int
    commit_index: int
    commit_term: int
    entries: list[Entry]
    config: Configuration | None
    parts: int = 1

    def configs(self) -> list[tuple[int, Configuration]]:
        """(index, configuration) this answer shows: the sender's at its commit index,
        then the membership changes in its log after it."""
        found = [(self.commit_index, self.config)] if self.config is not None else []
        found.extend((e.index, e.config) for e in self.entries if e.config is not None)
        return found

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
    started, which is all the recovery needs (logs and terms only move forward). A kept
    answer is asked for afresh too, and replaced once the fresh one is complete: the
    members it names may have left the group since.

    One request is out to each member at a time, and only one answer to it counts. A
    re-ask repeats the request still out (same nonce, same point), so whichever copy is
    answered first counts and the other answer is dropped; so is an answer delivered
    twice. Without that, every copy of an answer that starts afresh (which cannot be told
    from another) started a chain of its own, and while the group committed faster than
    parts arrived the chains multiplied (simulator seed 6017355). A whole answer (one
    message from the commit index) to any request of this start counts too: it starts no
    chain, and a one-message answer is asked for again at every re-ask, so on a link
    slower than the re-ask period only the earlier requests' answers would ever arrive.
    """

    def __init__(self, peers: tuple[str, ...], incarnation: int, me: str) -> None:
        self._seed = peers  # from the startup file, until an answer says who is in
        self._me = me
        self._start = _start_tag(incarnation)  # the high bits of this start's nonces
        self._sent = 0  # requests made: the low bits of their nonces
        self._out: dict[str, int] = {}  # member -> nonce of the one request out to it
        self._complete: dict[str, _Answer] = {}
        self._partial: dict[str, _Answer] = {}
        self._asked: set[str] = set()
        self._named_before: set[str] = set()
        self._refreshing: set[str] = set()  # complete answers asked for afresh
        # Every configuration the complete answers showed, in the order first seen: the
        # shell must reach their members (one added at runtime is not in the startup
        # file) before this witness asks them. A new tuple whenever one is added.
        self.heard: tuple[Configuration, ...] = ()

    def requests(self, term: int) -> list[tuple[str, RecoverRequest]]:
        """(Re)ask everyone whose answer is not complete: from the start, or after what
        came so far (a message may have been lost)."""
        # Who the answers dropped here named stays asked until the fresh answers are in:
        # a member named only by a stale answer drops out after one more re-ask.
        self._named_before = self._named()
        for peer in [p for p, answer in self._complete.items() if answer.parts == 1]:
            del self._complete[peer]
        # Answers that took parts are kept, but asked for afresh too and replaced once
        # the fresh one is complete: a kept one may name members that have left since.
        self._refreshing = set(self._complete)
        asking = [
            peer
            for peer in self._waiting_on()
            if peer not in self._complete or peer in self._refreshing
        ]
        self._asked.update(asking)
        return [(peer, self._request(term, peer)) for peer in asking]

    def new_requests(self, term: int) -> list[tuple[str, RecoverRequest]]:
        """Ask at once the members an answer named for the first time."""
        asking = [peer for peer in self._waiting_on() if peer not in self._asked]
        self._asked.update(asking)
        return [(peer, self._request(term, peer)) for peer in asking]

    def _named(self) -> set[str]:
        """The voters of every configuration the complete answers show from the newest
        one known committed up: any of them, committed or not, may have been in force
        when this witness voted. Members only of older configurations left the group: a
        member removed and stopped must not keep the witness waiting, named by an
        answer it gave before (kept answers are refreshed, so old ones go)."""
        answers = list(self._complete.values())
        committed = [(a.commit_index, a.config) for a in answers if a.config is not None]
        floor = max((index for index, _ in committed), default=0)
        shown = [c for a in answers for c in a.configs() if c[0] >= floor]
        return {m for _, config in shown for m in config.voters}

    def _waiting_on(self) -> list[str]:
        """Every voter ``_named`` (the startup file's members until an answer shows a
        configuration), in a stable order."""
        named = self._named() | self._named_before
        if not named:
            named = set(self._seed)
        return sorted(named - {self._me})

    def _request(self, term: int, peer: str) -> RecoverRequest:
        """The request out to ``peer`` again, or a new one after what came so far. The
        one out always continues the current partial answer: that changes only when an
        answer to it is taken, which ends it."""
        nonce = self._out.get(peer)
        if nonce is None:
            self._sent += 1
            nonce = self._start | (self._sent & _REQUEST_MASK)
            self._out[peer] = nonce
        partial = self._partial.get(peer)
        if partial is None:
            return RecoverRequest(term, nonce)
        index, entry_term = partial.last()
        return RecoverRequest(term, nonce, index, entry_term)

    def reply(
        self, sender: str, reply: RecoverReply, term: int
    ) -> RecoveredWitness | RecoverRequest | None:
        """The recovered state once every answer is complete; the request for the next
        part when this one says there is more; else None."""
        whole = not reply.more and reply.prev_index == reply.commit_index
        if reply.nonce == self._out.get(sender):
            del self._out[sender]
        elif whole and reply.nonce & ~_REQUEST_MASK == self._start:
            if sender in self._complete and sender not in self._refreshing:
                return None  # answered already, and not asked again since
            # An earlier request's answer, late: it ends the one out, and any chain.
            self._out.pop(sender, None)
            self._partial.pop(sender, None)
        else:
            return None  # a copy, a part of an earlier chain, or from before a restart
        partial = self._partial.get(sender)
        if partial is not None and (reply.prev_index, reply.prev_term) == partial.last():
            partial.entries.extend(reply.entries)
            partial.term = max(partial.term, reply.term)
            partial.parts += 1
        elif reply.prev_index == reply.commit_index:
            partial = _Answer(
                reply.term,
                reply.commit_index,
                reply.commit_term,
                list(reply.entries),
                reply.config,
            )
        else:
            return None  # continues nothing we hold (not what we asked): the re-ask asks
        if reply.more:
            self._partial[sender] = partial
            return self._request(term, sender)
        self._partial.pop(sender, None)
        self._complete[sender] = partial
        self._refreshing.discard(sender)
        fresh = [c for _, c in partial.configs() if c not in self.heard]
        if fresh:
            self.heard = (*self.heard, *dict.fromkeys(fresh))
        if any(m not in self._complete for m in self._waiting_on()):
            return None
        answers = list(self._complete.values())
        best = max(answers, key=_Answer.freshness)
        return RecoveredWitness(
            max(a.term for a in answers),
            best.commit_index,
            best.commit_term,
            tuple(best.entries),
            best.config,
        )


# A nonce is 63 bits (the wire's signed 64): the start's tag above, the request's number
# (modulo 2**20) below. A reply to a request a million requests back would be taken for
# the one out: a recovery makes a few per member and re-ask, not a million.
_REQUEST_MASK = (1 << 20) - 1


def _start_tag(incarnation: int) -> int:
    """The nonces' high bits, unique to this start of the witness (an answer sent to an
    earlier start does not match) and deterministic for the simulator."""
    digest = hashlib.blake2b(incarnation.to_bytes(8, "big"), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 1) & ~_REQUEST_MASK
