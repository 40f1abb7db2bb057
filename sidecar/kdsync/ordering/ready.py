"""What an ``OrderingNode`` hands its shell and gets back: the Ready contract.

The node accumulates a ``Ready`` (state to persist, messages, deliveries, reads, events);
the shell makes the persisted part durable, sends, writes, and reports back with
``persisted``, ``applied`` and ``entries_loaded``. Kept apart from the node so shells
and the wire format depend on the contract, not on the protocol's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from kdsync.ordering.ledger import Delivery, LedgerState
from kdsync.ordering.log import Entry
from kdsync.ordering.messages import (
    Append,
    AppendReply,
    Forward,
    Message,
    Outbound,
    PreVoteReply,
    PreVoteRequest,
    RecoverRequest,
    TimeoutNow,
)


class Role(Enum):
    RECOVERING = "recovering"
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
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
    # The log topic was trimmed: it holds no entry below this index (0: never trimmed).
    # A new member's backfill point must not be below it (``kdsync.backfill_point``).
    trimmed_below: int = 0


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """Something an operator wants in the log: role and term changes, with the reason."""

    kind: str  # pre-vote, campaign, leader, follower, step-down, vote-refused
    term: int
    detail: str


@dataclass(slots=True)
class Ready:
    hard_state: HardState | None = None
    persist_from: int | None = None  # persist ``entries``, truncating the log at this index
    entries: list[Entry] = field(default_factory=list)
    messages: list[Outbound] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    ledger: LedgerState | None = None  # the ledger after ``deliveries``
    loads: list[tuple[int, int]] = field(default_factory=list)  # entries to read back
    events: list[NodeEvent] = field(default_factory=list)
    number: int = 0  # for ``persisted`` once the shell has written this Ready's state

    def is_empty(self) -> bool:
        return not (
            self.hard_state
            or self.persist_from is not None
            or self.messages
            or self.deliveries
            or self.loads
            or self.events
        )


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


# Messages that state nothing about what their sender stored: they may leave before the
# write of their Ready completes (as long as that Ready changes no term or vote).
_STATE_FREE = (
    Append,
    AppendReply,
    Forward,
    PreVoteRequest,
    PreVoteReply,
    TimeoutNow,
    RecoverRequest,
)


def may_precede_persist(message: Message) -> bool:
    """A leader's Appends (it counts its own copy only once written), acknowledgements
    (they claim only what is written), forwarded batches, pre-votes, handovers and
    recovery requests do not depend on the sender's unwritten state. Votes and recovery
    replies do, and so does everything in a Ready that changes the term or vote."""
    return isinstance(message, _STATE_FREE)
