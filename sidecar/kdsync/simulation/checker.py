"""The correctness properties of kdsync, checked over what members durably delivered."""

from __future__ import annotations

from dataclasses import dataclass

from kdsync.ordering import DeliveredEvent, SourceEvent

EventId = tuple[str, str, int, int]  # origin, topic, partition, offset


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str  # agreement, duplicate, origin-order, sequence, fidelity, loss, progress
    member: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} at {self.member}: {self.detail}"


def _identity(d: DeliveredEvent) -> EventId:
    return (d.origin, d.topic, d.partition, d.event.offset)


def check_properties(
    globals_by_member: dict[str, dict[str, list[DeliveredEvent]]],
    sources: dict[EventId, SourceEvent],
    require_complete: bool,
    partial: frozenset[str] = frozenset(),
) -> list[Violation]:
    """Agreement, exactly-once, origin order, gapless sequence and fidelity always;
    completeness (no loss) only when ``require_complete`` (after the group has healed),
    and not of the members in ``partial`` (removed from the group: a prefix is theirs)."""
    violations: list[Violation] = []
    topics = {t for per_member in globals_by_member.values() for t in per_member}
    for topic in sorted(topics):
        streams = {m: g.get(topic, []) for m, g in globals_by_member.items()}
        longest_member = max(streams, key=lambda m: len(streams[m]))
        longest = streams[longest_member]
        for member, stream in streams.items():
            violations.extend(_check_stream(member, topic, stream, sources))
            for position, delivered in enumerate(stream):
                other = longest[position]
                if _identity(delivered) != _identity(other):
                    violations.append(
                        Violation(
                            "agreement",
                            member,
                            f"{topic}[{position}] is {_identity(delivered)} here but "
                            f"{_identity(other)} at {longest_member}",
                        )
                    )
                    break
        if require_complete:
            expected = sum(1 for (_, t, _, _) in sources if t == topic)
            for member, stream in streams.items():
                if len(stream) != expected and member not in partial:
                    violations.append(
                        Violation("loss", member, f"{topic} holds {len(stream)} of {expected}")
                    )
    if require_complete:
        for member, per_member in globals_by_member.items():
            if member in partial:
                continue
            for topic in {t for (_, t, _, _) in sources} - set(per_member):
                violations.append(Violation("loss", member, f"{topic} has nothing delivered"))
    return violations


def _check_stream(
    member: str, topic: str, stream: list[DeliveredEvent], sources: dict[EventId, SourceEvent]
) -> list[Violation]:
    violations: list[Violation] = []
    seen: set[EventId] = set()
    last_offset: dict[tuple[str, int], int] = {}
    for position, delivered in enumerate(stream):
        identity = _identity(delivered)
        if delivered.seq != position:
            violations.append(
                Violation("sequence", member, f"{topic}[{position}] has seq {delivered.seq}")
            )
        if identity in seen:
            violations.append(Violation("duplicate", member, f"{identity} at {topic}[{position}]"))
        seen.add(identity)
        where = (delivered.origin, delivered.partition)
        if last_offset.get(where, -1) >= delivered.event.offset:
            violations.append(
                Violation(
                    "origin-order",
                    member,
                    f"{identity} after offset {last_offset[where]} at {topic}[{position}]",
                )
            )
        last_offset[where] = delivered.event.offset
        if sources.get(identity) != delivered.event:
            violations.append(Violation("fidelity", member, f"{identity} differs from its source"))
        if len(violations) > 20:
            break
    return violations
