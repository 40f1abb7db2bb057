"""What the driver needs from the world, as small ports.

The sidecar implements them with Kafka and TCP (``kdsync.runtime``); the simulator with
seeded, delayed and crashable fakes (``kdsync.simulation``). Every operation that takes
time *starts* when the driver calls the port and *completes* when the shell calls the
matching ``MemberDriver`` method later — never from inside the port call, so the driver's
state is never re-entered.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kdsync.ordering import Configuration, Delivery, Entry, HardState, LedgerState, OriginBatch

SourcePartition = tuple[str, int]  # (topic, partition) of this member's own source


class LogPort(Protocol):
    """The core's durable log (the internal log topic of the member's own cluster)."""

    def persist(
        self, hard_state: HardState | None, entries: list[Entry], truncate_from: int | None
    ) -> None:
        """Start writing; completes with ``log_persisted`` or ``log_persist_failed``."""
        ...

    def load(self, spans: list[tuple[int, int]], max_bytes: int) -> None:
        """Start reading entries back, each span in order, stopping it once more than
        ``max_bytes`` have been read from it (a prefix of the span; the core asks again
        for the rest); completes with ``entries_loaded``."""
        ...

    def trim(self, below_index: int) -> None:
        """Best effort: forget records of entries below ``below_index``. No completion."""
        ...


class DeliveryPort(Protocol):
    """Writes deliveries and the ledger after them in one transaction (``T-global``)."""

    def write(self, deliveries: Sequence[Delivery], ledger: LedgerState) -> None:
        """Start a transaction; completes with ``transaction_committed`` or
        ``transaction_failed``."""
        ...


class SourcePort(Protocol):
    """The member's own source topics."""

    def take(self) -> OriginBatch | None:
        """The next batch read, or None when none is waiting (never blocks)."""
        ...

    def commit(self, positions: Mapping[SourcePartition, int]) -> None:
        """Record positions already in ``T-global`` (for lag and audits). No completion."""
        ...


class FrameSender(Protocol):
    """The driver's way to the other members: the sending half of
    ``kdsync.transport.PeerTransport`` (never blocks, may drop), and who they are."""

    def send(self, peer: str, frame: bytes) -> bool: ...

    def follow_configuration(self, config: Configuration, index: int) -> None:
        """The configuration this member uses changed (appended, cut back, or found at
        start; ``index`` is where it was appended, 0 for the startup file's), before any
        frame is sent under it: every member of it must be reachable, and able to reach
        us, from now on (a member added at runtime is dialled at the address its entry
        carries). Dropping links to members that left waits for the removal to commit,
        which the shell sees in the status."""
        ...

    def reach_members(self, config: Configuration) -> None:
        """Members of a configuration this member heard of but does not use yet (a
        recovering witness's answers show it) must be reachable, and able to reach us:
        it asks them next. Adds links only."""
        ...


class WriteFailure(enum.Enum):
    """Why a transaction did not commit (nothing of it became visible)."""

    TOO_LARGE = "too-large"  # a record the destination refuses: halt, retry later
    GLOBAL_TOPIC_LOST = "global-topic-lost"  # T-global lost its history: halt, retry later
    UNAVAILABLE = "unavailable"  # brokers unreachable or busy: retry with backoff
    FENCED = "fenced"  # another instance of this member took over: stop for good
    # The commit may or may not have happened: writing again could duplicate, so stop (a
    # restart settles the transaction and reads the ledger back).
    OUTCOME_UNKNOWN = "outcome-unknown"


@dataclass(frozen=True, slots=True)
class DriverPorts:
    log: LogPort | None  # None for a witness: it keeps nothing durable
    delivery: DeliveryPort | None
    source: SourcePort | None
    frames: FrameSender
