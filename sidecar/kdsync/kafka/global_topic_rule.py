"""The rule every member's ``T-global`` configuration follows (pure: no Kafka, no clock).

Every member's ``T-global`` must hold the same events in the same order, and consumers
fail over between them at exact positions. Each sidecar holds its own cluster's
``T-global`` topics to one rule, and the same rule everywhere keeps the members alike:

- ``cleanup.policy``: exactly ``delete``. Put back: compaction would remove records and
  leave holes in ``kdsync.seq``.
- ``retention.ms``: at least 7 days (1 day for the heartbeat topic), or ``-1`` (forever).
  A shorter one is reported, never changed: retention removes the oldest records only
  (no holes), an operator may have shortened it to save disk, and a consumer failing over
  to this member past its retention is told so by ``kdsync failover``.
- ``retention.bytes``: ``-1`` (no size limit). Put back: a size limit drops records by
  each cluster's own volume, so the members would differ.
- ``max.message.bytes``: at least 8 MiB. A smaller limit is reported, never changed: it
  loses nothing (a record over it halts delivery to this member with the reason, until
  someone raises the limit), and an operator may have set it on purpose.
- partitions: exactly ``topics.globalPartitions``. Reported only: Kafka cannot shrink a
  topic, and adding partitions would change where records go.

A topic kdsync creates gets the rule's values (``CREATE_CONFIG``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

CLEANUP_POLICY = "cleanup.policy"
RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
MAX_MESSAGE_BYTES = "max.message.bytes"
PARTITIONS = "partitions"  # not a topic config: the partition count, judged alike

# Kafka's own default retention (log.retention.hours=168): what a T-global had before
# kdsync set it, so the floor changes nothing on a cluster with default settings.
MIN_RETENTION_MS = 7 * 24 * 3600 * 1000
# Records carry kdsync's headers on top of the user's, hence more than Kafka's 1 MiB.
MIN_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
UNLIMITED = -1

# The topic configs the rule reads (what a check asks the brokers for).
CONFIGS = (CLEANUP_POLICY, RETENTION_MS, RETENTION_BYTES, MAX_MESSAGE_BYTES)

CREATE_CONFIG: dict[str, str] = {
    CLEANUP_POLICY: "delete",
    RETENTION_MS: str(MIN_RETENTION_MS),
    RETENTION_BYTES: str(UNLIMITED),
    MAX_MESSAGE_BYTES: str(MIN_MAX_MESSAGE_BYTES),
}


class Action(StrEnum):
    OK = "ok"  # follows the rule
    FIX = "fix"  # breaks it; setting ``set_to`` puts it back
    REPORT = "report-only"  # breaks it; left as it is (``why`` says why)


@dataclass(frozen=True, slots=True)
class Finding:
    topic: str
    config: str
    wanted: str  # the rule, for people: "delete", ">= 604800000 or -1"
    found: str | None  # None: the brokers did not report it
    action: Action
    set_to: str | None = None  # the value that puts it back (Action.FIX only)
    why: str = ""  # why it matters, or why it is not put back (not for Action.OK)


def _number(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _judge(name: str, found: str, min_retention_ms: int) -> tuple[str, Action, str | None, str]:
    """(wanted, action, set_to, why) for one topic config."""
    number = _number(found)
    if name == CLEANUP_POLICY:
        if found.strip() == "delete":
            return "delete", Action.OK, None, ""
        return "delete", Action.FIX, "delete", "compaction would delete records: holes in seqs"
    if name == RETENTION_MS:
        wanted = f">= {min_retention_ms} or {UNLIMITED}"
        if number is not None and (number >= min_retention_ms or number == UNLIMITED):
            return wanted, Action.OK, None, ""
        return (
            wanted,
            Action.REPORT,
            None,
            "left as set: records leave this member before the others, so a consumer "
            "failing over to it may find its position deleted",
        )
    if name == RETENTION_BYTES:
        if number == UNLIMITED:
            return str(UNLIMITED), Action.OK, None, ""
        return (
            str(UNLIMITED),
            Action.FIX,
            str(UNLIMITED),
            "a size limit drops records by this cluster's own volume",
        )
    if name == MAX_MESSAGE_BYTES:
        wanted = f">= {MIN_MAX_MESSAGE_BYTES}"
        if number is not None and number >= MIN_MAX_MESSAGE_BYTES:
            return wanted, Action.OK, None, ""
        return (
            wanted,
            Action.REPORT,
            None,
            "left as set: a larger record halts delivery here until the limit is raised",
        )
    raise ValueError(f"no rule for {name}")


def judge_topic(
    topic: str,
    configs: Mapping[str, str],
    partitions: int,
    wanted_partitions: int,
    min_retention_ms: int = MIN_RETENTION_MS,
) -> list[Finding]:
    """One finding per config the rule covers, in ``CONFIGS`` order, then partitions."""
    findings = []
    for name in CONFIGS:
        found = configs.get(name)
        if found is None:  # nothing to judge; never guessed
            wanted = _judge(name, "", min_retention_ms)[0]
            findings.append(Finding(topic, name, wanted, None, Action.OK))
            continue
        wanted, action, set_to, why = _judge(name, found, min_retention_ms)
        findings.append(Finding(topic, name, wanted, found, action, set_to, why))
    same = partitions == wanted_partitions
    findings.append(
        Finding(
            topic,
            PARTITIONS,
            str(wanted_partitions),
            str(partitions),
            Action.OK if same else Action.REPORT,
            None,
            ""
            if same
            else "Kafka cannot remove partitions, and adding them moves records: "
            "fix by hand (docs/operations.md)",
        )
    )
    return findings


def global_topics(names: Iterable[str], suffix: str, is_source: Callable[[str], bool]) -> list[str]:
    """The ``T-global`` topics among a cluster's topics: the suffix on a selected source."""
    return sorted(
        name
        for name in names
        if name.endswith(suffix) and len(name) > len(suffix) and is_source(name[: -len(suffix)])
    )
