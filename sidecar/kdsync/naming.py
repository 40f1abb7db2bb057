"""Names of everything kdsync derives from its configuration, in one place.

For a group ``G`` with member ``M`` replicating topic ``T``:

| what | name |
|---|---|
| the replicated topic | ``T`` + suffix (``T-global`` by default) |
| the core's Raft log and hard state | ``kdsync-G.log.internal`` |
| the delivery ledger snapshot (compacted) | ``kdsync-G.ledger.internal`` |
| M's heartbeats, replicated like a source topic | ``kdsync-G.heartbeats`` (-> ``...-global``) |
| the source consumer group | ``kdsync-G`` |
| the transactional id of M's ``T-global`` producer | ``kdsync-G.M`` |

Every member of a group uses the same names in its own Kafka cluster.
"""

from __future__ import annotations

import re

DEFAULT_GLOBAL_SUFFIX = "-global"
INTERNAL_PREFIX = "kdsync-"
LOG_TOPIC_SUFFIX = ".log.internal"
LEDGER_TOPIC_SUFFIX = ".ledger.internal"
HEARTBEAT_TOPIC_SUFFIX = ".heartbeats"

MAX_TOPIC_NAME_LENGTH = 249
TOPIC_NAME_PATTERN = re.compile(r"[a-zA-Z0-9._-]+")

# Group and member names end up in topic names, consumer groups, transactional ids,
# certificate URIs and Kubernetes object names: DNS-label-like and short.
MAX_GROUP_NAME_LENGTH = 40
MAX_MEMBER_NAME_LENGTH = 40
NAME_PATTERN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def topic_name_problem(name: str) -> str | None:
    """Why ``name`` is not a legal Kafka topic name, or None if it is."""
    if not name:
        return "a topic name must not be empty"
    if name in {".", ".."}:
        return f"{name!r} is not allowed as a topic name"
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return (
            f"topic name is {len(name)} characters long; Kafka allows at most "
            f"{MAX_TOPIC_NAME_LENGTH}"
        )
    if not TOPIC_NAME_PATTERN.fullmatch(name):
        bad = sorted({c for c in name if not TOPIC_NAME_PATTERN.fullmatch(c)})
        return f"topic name {name!r} contains {''.join(bad)!r}; Kafka allows only [a-zA-Z0-9._-]"
    return None


def name_problem(name: str, what: str, max_length: int) -> str | None:
    """Why ``name`` is not a usable group/member name, or None if it is."""
    if len(name) > max_length:
        return f"{what} name {name!r} is {len(name)} characters long; at most {max_length}"
    if not NAME_PATTERN.fullmatch(name):
        return (
            f"{what} name {name!r} is not DNS-label-like: use lower-case letters, digits "
            "and '-', starting and ending with a letter or digit"
        )
    return None


def _check(problem: str | None) -> None:
    if problem is not None:
        raise ValueError(problem)


def global_topic(topic: str, suffix: str = DEFAULT_GLOBAL_SUFFIX) -> str:
    """The name of the replicated topic for source topic ``topic`` (``T`` -> ``T-global``)."""
    _check(topic_name_problem(topic))
    if not suffix:
        raise ValueError("the global suffix must not be empty")
    if topic.endswith(suffix):
        raise ValueError(f"source topic {topic!r} already ends with {suffix!r}")
    name = topic + suffix
    _check(topic_name_problem(name))
    return name


def _group(group: str) -> str:
    _check(name_problem(group, "group", MAX_GROUP_NAME_LENGTH))
    return group


def log_topic(group: str) -> str:
    """Internal topic holding the core's Raft log entries and hard state."""
    return f"{INTERNAL_PREFIX}{_group(group)}{LOG_TOPIC_SUFFIX}"


def ledger_topic(group: str) -> str:
    """Internal compacted topic holding the delivery ledger snapshot."""
    return f"{INTERNAL_PREFIX}{_group(group)}{LEDGER_TOPIC_SUFFIX}"


def heartbeat_topic(group: str) -> str:
    """Each member's own heartbeat topic: its sidecar writes one record a second and
    replicates it through the group like a source topic (into ``<this>-global``), so
    replication latency per origin shows without traffic."""
    return f"{INTERNAL_PREFIX}{_group(group)}{HEARTBEAT_TOPIC_SUFFIX}"


def is_heartbeat_topic(name: str) -> bool:
    """True for any group's heartbeat topic: never a user-selected source."""
    return name.startswith(INTERNAL_PREFIX) and name.endswith(HEARTBEAT_TOPIC_SUFFIX)


def consumer_group(group: str) -> str:
    """Consumer group id of the source consumer (its offsets move with deliveries)."""
    return f"{INTERNAL_PREFIX}{_group(group)}"


def transactional_id(group: str, member: str) -> str:
    """Transactional id of a member's ``T-global`` producer (fences zombie sidecars)."""
    _check(name_problem(member, "member", MAX_MEMBER_NAME_LENGTH))
    return f"{INTERNAL_PREFIX}{_group(group)}.{member}"


def is_kafka_internal_topic(name: str) -> bool:
    """True for Kafka's own topics (``__consumer_offsets``, ``__transaction_state``, ...):
    the double underscore is Kafka's reserved prefix. Never a source topic."""
    return name.startswith("__")


def is_internal_topic(name: str) -> bool:
    """True for kdsync's own internal topics (never a source topic)."""
    return name.startswith(INTERNAL_PREFIX) and (
        name.endswith(LOG_TOPIC_SUFFIX) or name.endswith(LEDGER_TOPIC_SUFFIX)
    )
