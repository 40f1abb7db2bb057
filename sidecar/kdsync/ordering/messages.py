"""Messages between members of an ordering group (Raft, plus witness recovery).

Every message carries the sender's term. Replies echo the incarnation of the request's
sender so that a member that restarted ignores answers meant for its previous life.
"""

from __future__ import annotations

from dataclasses import dataclass

from kdsync.ordering.configuration import Configuration
from kdsync.ordering.events import OriginBatch
from kdsync.ordering.log import Entry


@dataclass(frozen=True, slots=True)
class VoteRequest:
    term: int
    last_index: int
    last_term: int
    incarnation: int
    # A campaign the leader asked for (TimeoutNow): members that still hear that leader
    # must not ignore it, unlike an ordinary campaign (see OrderingNode.receive).
    transfer: bool = False


@dataclass(frozen=True, slots=True)
class PreVoteRequest:
    """Would you vote for me in ``term``? Asked before a real campaign (Raft thesis 9.6):
    nobody changes term or vote for it, so a member that cannot win (its log is behind,
    or it is cut off) never disturbs a group that can."""

    term: int  # the term the sender would campaign in (its current term + 1)
    last_index: int
    last_term: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class PreVoteReply:
    term: int  # the replier's current term
    granted: bool
    incarnation: int  # the pre-candidate's, echoed


@dataclass(frozen=True, slots=True)
class VoteReply:
    term: int
    granted: bool
    incarnation: int  # the candidate's, echoed


@dataclass(frozen=True, slots=True)
class Append:
    term: int
    prev_index: int
    prev_term: int
    entries: tuple[Entry, ...]
    commit: int
    incarnation: int
    all_durable: int  # every data member has stored the log up to here (for compaction)
    # To a witness only: the configuration in force at prev_index. A witness may take a
    # leader's committed prefix as its own without its entries, membership changes among
    # them; this tells it who is in the group from there.
    config: Configuration | None = None


@dataclass(frozen=True, slots=True)
class AppendReply:
    term: int
    success: bool
    match_index: int  # on success: the follower's log matches the leader's up to here
    hint_index: int  # on failure: the leader should retry from hint_index + 1
    rejected_index: int  # on failure: the prev_index that did not match
    incarnation: int  # the leader's, echoed
    peer_incarnation: int  # the replier's own
    # The replier's entries up to here are durably in its T-global (0 for a witness):
    # a leader admits new batches only while the group's applying keeps up.
    applied_index: int = 0


@dataclass(frozen=True, slots=True)
class Forward:
    """Batches an origin wants ordered, sent to the member it believes leads."""

    term: int
    batches: tuple[OriginBatch, ...]


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    """A witness leader hands leadership to an up-to-date data member."""

    term: int


@dataclass(frozen=True, slots=True)
class RecoverRequest:
    """A member that lost its state (a witness: it keeps nothing durable) asks for it.

    ``after_index``/``after_term`` (0: from the start) continue an answer that came in
    parts: the entries after that one, if the sender's log still holds it."""

    term: int
    nonce: int
    after_index: int = 0
    after_term: int = 0


@dataclass(frozen=True, slots=True)
class RecoverReply:
    """The sender's term, commit point and log after ``prev_index``, which is its commit
    index or, for a later part, the request's ``after_index``. Its entries are bounded in
    bytes (``Timing.max_recover_bytes``; at least one is sent); ``more`` says the log goes
    on after them."""

    term: int
    nonce: int
    commit_index: int
    commit_term: int
    entries: tuple[Entry, ...]
    prev_index: int
    prev_term: int
    more: bool = False
    # The sender's configuration in force: a recovering witness also waits for the
    # members it names (a member added lately may hold the witness's vote).
    config: Configuration | None = None


Message = (
    PreVoteRequest
    | PreVoteReply
    | VoteRequest
    | VoteReply
    | Append
    | AppendReply
    | Forward
    | TimeoutNow
    | RecoverRequest
    | RecoverReply
)


@dataclass(frozen=True, slots=True)
class Outbound:
    to: str
    message: Message
