"""Failover as a library call: translate a consumer group's offsets, and apply them.

``translate_group(config, group, source, target)`` reads the group's committed offsets
on every ``T-global`` topic in member ``source``'s cluster and maps each onto member
``target``'s cluster (see ``kdsync.failover.translation``). ``Failover(config, source,
target).apply(group)`` translates and writes them to the group in ``target``: all of them
or none, and only while the group has no active members there (Kafka would reject the
write, and a running consumer would keep its own position anyway). While ``target`` has
not yet delivered what the group read, both wait up to ``wait`` seconds, then report how
far behind it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kdsync.config import SidecarConfig, TopicsConfig
from kdsync.failover.kafka_io import ClusterClients
from kdsync.failover.translation import (
    GroupTranslation,
    Outcome,
    PartitionTranslation,
    source_position,
    translate_partition,
)

# How often a translation waiting for the target to catch up looks again.
_WAIT_INTERVAL = 0.5


class FailoverRefused(Exception):
    """Nothing was written; the message says why and what to do."""


@dataclass(frozen=True)
class Applied:
    translation: GroupTranslation
    written: dict[tuple[str, int], int]
    seconds: float


def is_global_topic(topics: TopicsConfig, name: str) -> bool:
    """Whether ``name`` is the ``T-global`` of a topic this config replicates."""
    suffix = topics.global_suffix
    return name.endswith(suffix) and topics.selects(name[: -len(suffix)])


def _clients(config: SidecarConfig, member: str, timeout: float) -> ClusterClients:
    for candidate in config.members:
        if candidate.name != member:
            continue
        if candidate.kafka is None:
            raise FailoverRefused(
                f"member {member!r} is a witness and owns no Kafka cluster; name a data member"
            )
        return ClusterClients(member, candidate.kafka.client_properties(), timeout)
    names = ", ".join(m.name for m in config.data_members)
    raise FailoverRefused(f"member {member!r} is not in the config; data members: {names}")


def translate_group(
    topics: TopicsConfig,
    group: str,
    source: ClusterClients,
    target: ClusterClients,
    committed: Mapping[tuple[str, int], int] | None = None,
) -> GroupTranslation:
    """Translate ``group``'s committed offsets on every ``T-global`` from ``source`` onto
    ``target`` (``committed``: the group's offsets in ``source``, if already read)."""
    if committed is None:
        committed = source.committed_offsets(group)
    names = sorted({topic for topic, _ in committed})
    chosen = [t for t in names if is_global_topic(topics, t)]
    partitions: list[PartitionTranslation] = []
    for topic in chosen:
        count = source.partition_count(topic) or 0
        target_count = target.partition_count(topic)
        if target_count is None:
            raise FailoverRefused(
                f"{topic} does not exist in {target.name}; is its sidecar running?"
            )
        if target_count != count:
            raise FailoverRefused(
                f"{topic} has {count} partition(s) in {source.name} and "
                f"{target_count} in {target.name}; they must be equal "
                "(topics.globalPartitions)"
            )
        for partition in range(count):
            offset = committed.get((topic, partition))
            position = (
                None
                if offset is None
                else source_position(source.partition_log(topic, partition), offset)
            )
            partitions.append(
                translate_partition(
                    topic, partition, position, target.partition_log(topic, partition)
                )
            )
    return GroupTranslation(
        group,
        source.name,
        target.name,
        tuple(partitions),
        tuple(t for t in names if t not in chosen),
    )


class Failover:
    """Translation from one member's cluster to another's (clients open until close)."""

    def __init__(
        self, config: SidecarConfig, source: str, target: str, *, timeout: float = 30.0
    ) -> None:
        if source == target:
            raise FailoverRefused(f"--from and --to are both {source!r}; name two members")
        self._config = config
        self.source_name = source
        self.target_name = target
        self.source = _clients(config, source, timeout)
        try:
            self.target = _clients(config, target, timeout)
        except BaseException:
            self.source.close()
            raise

    def close(self) -> None:
        self.source.close()
        self.target.close()

    def __enter__(self) -> Failover:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def translate_once(self, group: str) -> GroupTranslation:
        return translate_group(self._config.topics, group, self.source, self.target)

    def translate(
        self,
        group: str,
        wait: float = 0.0,
        on_wait: Callable[[GroupTranslation], None] | None = None,
    ) -> GroupTranslation:
        """Translate; while the target is behind, look again for up to ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            translation = self.translate_once(group)
            if not translation.behind() or time.monotonic() >= deadline:
                return translation
            if on_wait is not None:
                on_wait(translation)
            time.sleep(_WAIT_INTERVAL)  # the target's sidecar is catching up

    def _refuse_if_active(self, group: str) -> None:
        members = self.target.active_members(group)
        if members:
            raise FailoverRefused(
                f"consumer group {group} has {len(members)} active member(s) in "
                f"{self.target_name} ({', '.join(members[:5])}); nothing was written. Fix: "
                f"stop the group's consumers in {self.target_name} (or wait until their "
                "session times out), then run kdsync failover apply again"
            )

    def apply(
        self,
        group: str,
        wait: float = 0.0,
        accept_earliest: bool = False,
        on_wait: Callable[[GroupTranslation], None] | None = None,
    ) -> Applied:
        """Translate and write the group's offsets in the target, or raise FailoverRefused."""
        started = time.monotonic()
        self._refuse_if_active(group)
        translation = self.translate(group, wait, on_wait)
        blocking = translation.blocking(accept_earliest)
        if blocking:
            raise FailoverRefused(_blocking_message(translation, blocking, wait))
        offsets = translation.offsets(accept_earliest)
        if not offsets:
            raise FailoverRefused(
                f"consumer group {group} has no committed offsets on any T-global topic in "
                f"{self.source_name}; nothing to apply"
            )
        self._refuse_if_active(group)  # a consumer may have joined meanwhile
        self.target.write_offsets(group, offsets)
        return Applied(translation, offsets, time.monotonic() - started)


def _blocking_message(
    translation: GroupTranslation, blocking: tuple[PartitionTranslation, ...], wait: float
) -> str:
    lines = [f"nothing was written for consumer group {translation.group}:"]
    for p in blocking:
        lines.append(f"  {p.topic}[{p.partition}]: {p.outcome.value}: {p.detail}")
    outcomes = {p.outcome for p in blocking}
    if Outcome.BEHIND in outcomes:
        worst = max(p.seqs_behind or 0 for p in blocking if p.outcome is Outcome.BEHIND)
        lines.append(
            f"{translation.target} is behind {translation.source} by up to {worst} seq(s) "
            f"after waiting {wait:.0f}s. Fix: run again with a longer --wait once its sidecar "
            f"delivers (kdsync status), or fail over to another member"
        )
    if outcomes & {Outcome.DELETED_IN_TARGET, Outcome.DELETED_IN_SOURCE}:
        lines.append(
            "retention deleted records the group has not read. Fix: run again with "
            "--earliest-if-deleted to start those partitions at the earliest record kept "
            "(the deleted records are skipped), or restore them first"
        )
    if Outcome.MISMATCH in outcomes:
        lines.append("the members disagree; run kdsync audit before failing over")
    return "\n".join(lines)
