"""Static description of an ordering group and the core's timing parameters."""

from __future__ import annotations

from dataclasses import dataclass, field


class GroupSpecError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """The voting members of a group. Witnesses vote but own no Kafka cluster."""

    members: tuple[str, ...]
    witnesses: frozenset[str] = frozenset()
    _data: tuple[str, ...] = field(default=(), init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_data", tuple(m for m in self.members if m not in self.witnesses))
        if len(self.members) < 2:
            raise GroupSpecError("a group needs at least 2 members")
        if len(set(self.members)) != len(self.members):
            raise GroupSpecError(f"member names must be unique: {list(self.members)}")
        unknown = self.witnesses - set(self.members)
        if unknown:
            raise GroupSpecError(f"witnesses {sorted(unknown)} are not members")
        if len(self.witnesses) >= len(self.data_members):
            # Committed entries must always reach a member that keeps them durably.
            raise GroupSpecError("a group needs more data members than witnesses")

    @property
    def data_members(self) -> tuple[str, ...]:
        return self._data

    @property
    def quorum(self) -> int:
        return len(self.members) // 2 + 1

    def is_witness(self, member: str) -> bool:
        return member in self.witnesses


@dataclass(frozen=True, slots=True)
class Timing:
    """Core parameters, in ticks, counts and bytes. The shell decides how long a tick is."""

    heartbeat_ticks: int = 1
    election_ticks: int = 10  # a follower campaigns after 1x..2x this without a leader
    witness_election_factor: int = 3  # witnesses wait longer: data members should lead
    # After each election that ends without a leader the timeout doubles, up to 2**this
    # times: elections succeed once the timeout exceeds a round trip, however slow.
    election_backoff: int = 3
    resend_ticks: int = 40  # an origin offers an unordered batch again after this long
    max_entries_per_append: int = 512
    # Also bounds an Append's payload (at least one entry is always sent), so a peer
    # frame stays far below the transport's frame limit even with large events.
    max_append_bytes: int = 1024 * 1024
    max_uncommitted: int = 4096  # a leader refuses new batches beyond this backlog
    # ... and beyond this many bytes of it (at least one batch is admitted): uncommitted
    # entries never leave memory, so this bounds them on the leader and, through its
    # Appends, on every member.
    max_uncommitted_bytes: int = 64 * 1024 * 1024
    max_outbox: int = 1024  # batches an origin keeps until they are committed in order
    max_outbox_bytes: int = 64 * 1024 * 1024
    max_forward: int = 16  # batches an origin has on their way to the leader at once
    # Bounds a Forward's payload (at least one batch is always sent), as max_append_bytes
    # does an Append's: a peer frame holds 64 MiB, a batch up to 16 MiB or one 32 MiB event.
    max_forward_bytes: int = 16 * 1024 * 1024
    # Bounds each part of the answer to a recovering witness (at least one entry is sent);
    # the witness asks for the rest part by part.
    max_recover_bytes: int = 16 * 1024 * 1024
    # A leader admits new batches only while the faster half of the data members has
    # applied all but this many committed entries.
    max_unapplied: int = 1024
    max_apply_bytes: int = 64 * 1024 * 1024  # delivered, not yet written to T-global
    retained_applied: int = 1024  # applied entries kept in memory for lagging peers
    # A data member keeps at most this much of its log in memory beyond the entries not
    # yet committed or not yet in its own ordering log: the rest is read back from there
    # when applied or sent, so one that cannot write its T-global keeps ordering in
    # bounded memory.
    max_log_bytes: int = 64 * 1024 * 1024
    # One read-back from the ordering log stops after this much (at least one entry).
    max_load_bytes: int = 16 * 1024 * 1024
    # A witness keeps entries some data member has not stored yet, up to this much.
    witness_retained_bytes: int = 256 * 1024 * 1024
    check_quorum: bool = True  # a leader that hears no majority steps down
