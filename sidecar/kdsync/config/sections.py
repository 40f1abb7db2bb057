"""The sections of a sidecar config, each a frozen pydantic model with its own checks.

``members[]`` (``MemberConfig`` with its ``KafkaConfig``), ``topics`` (``TopicsConfig``),
``tls`` (``TlsConfig``), ``admin`` (``AdminConfig``), ``ordering`` (``OrderingConfig``)
and ``groupOffsetSync`` (``GroupOffsetSyncConfig``). Rules that relate several
sections live in ``kdsync.config.group_rules``; the whole file is ``SidecarConfig``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.alias_generators import to_camel

from kdsync import naming
from kdsync.config.problems import Invalid, Loc, invalid
from kdsync.ordering import Timing
from kdsync.transport.address import parse_address
from kdsync.transport.identity import MemberTlsFiles

# librdkafka properties kdsync sets itself, and why a user must not.
OWNED_KAFKA_PROPERTIES: Mapping[str, str] = {
    "bootstrap.servers": "set it with `bootstrapServers` next to `properties`",
    "transactional.id": (
        "kdsync derives it from the group and member (kdsync-<group>.<member>) so that a "
        "restarted sidecar fences its zombie predecessor"
    ),
    "enable.idempotence": "kdsync's transactional producer needs idempotence and turns it on",
    "isolation.level": (
        "kdsync reads with read_committed so that aborted records are never replicated"
    ),
    "group.id": "kdsync uses the consumer group kdsync-<group>; its offsets move with deliveries",
    "enable.auto.commit": (
        "kdsync commits source offsets only once their events are in T-global (after "
        "each delivery transaction); auto-commit would move them ahead of T-global"
    ),
}


def _address_problem(text: str, what: str) -> str | None:
    try:
        host, port = parse_address(text)
    except ValueError as exc:
        return f"{what} {text!r} is not host:port ({exc})"
    if ":" in host and not text.startswith("["):
        return f"{what} {text!r}: an IPv6 address must be written in brackets"
    if port == 0:
        return f"{what} {text!r}: port 0 is not a usable port"
    if any(c.isspace() for c in host):
        return f"{what} {text!r}: the host contains white space"
    return None


def check_address(text: str, what: str) -> str:
    problem = _address_problem(text, what)
    if problem:
        raise invalid(problem, 'write it as "host:port", e.g. "10.0.0.1:7400" or "[::1]:7400"')
    return text


class ConfigModel(BaseModel):
    """Every section: unknown keys rejected, frozen, camelCase keys in YAML."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
    )


class KafkaConfig(ConfigModel):
    """How a data member's sidecar reaches its own Kafka cluster."""

    bootstrap_servers: str = Field(
        description='the member\'s Kafka bootstrap servers, e.g. "kafka-0:9092,kafka-1:9092"'
    )
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="extra librdkafka client properties (security.protocol, sasl.*, ssl.*)",
    )

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, value: str) -> str:
        servers = [part.strip() for part in value.split(",")]
        if not value.strip() or any(not s or any(c.isspace() for c in s) for s in servers):
            raise invalid(
                f"{value!r} is not a comma-separated list of host:port",
                'list the brokers as "host:port[,host:port...]", e.g. "kafka-0:9092"',
            )
        return ",".join(servers)

    @field_validator("properties", mode="before")
    @classmethod
    def _properties(cls, value: object) -> object:
        if not isinstance(value, Mapping):
            return value  # pydantic reports the type
        problems: list[tuple[Loc, str, str]] = []
        result: dict[str, str] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append(((str(key),), "property names must be strings", "quote the key"))
                continue
            if key in OWNED_KAFKA_PROPERTIES:
                problems.append(
                    (
                        (key,),
                        f"{key!r} is set by kdsync: {OWNED_KAFKA_PROPERTIES[key]}",
                        "remove it from properties",
                    )
                )
                continue
            if isinstance(item, bool):
                result[key] = "true" if item else "false"
            elif isinstance(item, str | int | float):
                result[key] = str(item)
            else:
                problems.append(
                    (
                        (key,),
                        f"the value must be a string, number or boolean, got {type(item).__name__}",
                        'write the librdkafka value as a string, e.g. "SASL_SSL"',
                    )
                )
        if problems:
            raise Invalid(*problems)
        return result

    def client_properties(self) -> dict[str, str]:
        """librdkafka properties common to every client of this member (before kdsync's)."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.properties}


class MemberConfig(ConfigModel):
    """A voting member of the group: a Kafka cluster with its sidecar, or a witness."""

    name: str = Field(description="the member's name, e.g. us-east")
    peer: str = Field(
        description='the host:port other sidecars dial to reach this member, e.g. "10.0.0.1:7400"'
    )
    witness: bool = Field(
        default=False, description="true for a witness: votes, owns no Kafka cluster"
    )
    kafka: KafkaConfig | None = Field(
        default=None, description="the member's Kafka cluster (data members only)"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        problem = naming.name_problem(value, "member", naming.MAX_MEMBER_NAME_LENGTH)
        if problem:
            raise invalid(problem, "rename the member, e.g. us-east or witness-1")
        return value

    @field_validator("peer")
    @classmethod
    def _peer(cls, value: str) -> str:
        return check_address(value, "peer address")

    @model_validator(mode="after")
    def _kafka_iff_data(self) -> MemberConfig:
        if self.witness and self.kafka is not None:
            raise invalid(
                f"member {self.name!r} is a witness, and a witness owns no Kafka cluster",
                "remove the kafka section, or remove `witness: true` to make it a data member",
                ("kafka",),
            )
        if not self.witness and self.kafka is None:
            raise invalid(
                f"data member {self.name!r} has no kafka section",
                'add `kafka: {bootstrapServers: "host:9092"}`, or set `witness: true` '
                "if this member owns no Kafka cluster",
                ("kafka",),
            )
        return self


def _compile_patterns(patterns: tuple[str, ...]) -> tuple[str, ...]:
    problems: list[tuple[Loc, str, str]] = []
    for index, pattern in enumerate(patterns):
        try:
            re.compile(pattern)
        except re.error as exc:
            problems.append(
                (
                    (index,),
                    f"pattern {pattern!r} is not a valid regular expression: {exc}",
                    "fix the Python regular expression; in YAML, single-quote it: 'orders\\..*'",
                )
            )
    if problems:
        raise Invalid(*problems)
    return patterns


class TopicsConfig(ConfigModel):
    """Which source topics ``T`` to replicate, and how their ``T-global`` look."""

    names: tuple[str, ...] = Field(default=(), description="explicit source topic names")
    include: tuple[str, ...] = Field(
        default=(), description="regular expressions; topics whose whole name matches one"
    )
    exclude: tuple[str, ...] = Field(
        default=(), description="regular expressions; topics matching one are never replicated"
    )
    global_suffix: str = Field(
        default=naming.DEFAULT_GLOBAL_SUFFIX,
        description="appended to a source topic's name to name its replicated topic",
    )
    global_partitions: int = Field(
        default=1, ge=1, description="partitions of every T-global; 1 keeps one total order"
    )

    @field_validator("names")
    @classmethod
    def _names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        problems: list[tuple[Loc, str, str]] = []
        seen: set[str] = set()
        for index, name in enumerate(value):
            problem = naming.topic_name_problem(name)
            if problem:
                problems.append(((index,), problem, "use a legal Kafka topic name"))
            elif name in seen:
                problems.append(((index,), f"topic {name!r} is listed twice", "remove one"))
            elif naming.is_internal_topic(name):
                problems.append(
                    ((index,), f"{name!r} is a kdsync internal topic", "remove it from names")
                )
            seen.add(name)
        if problems:
            raise Invalid(*problems)
        return value

    @field_validator("include", "exclude")
    @classmethod
    def _patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _compile_patterns(value)

    @field_validator("global_suffix")
    @classmethod
    def _suffix(cls, value: str) -> str:
        if not value or not naming.TOPIC_NAME_PATTERN.fullmatch(value):
            raise invalid(
                f"suffix {value!r} must be non-empty and use only [a-zA-Z0-9._-]",
                'use a suffix such as "-global"',
            )
        return value

    @model_validator(mode="after")
    def _selection(self) -> TopicsConfig:
        if not self.names and not self.include:
            raise invalid(
                "no topics selected: names and include are both empty",
                "list source topics under `names:` or regular expressions under `include:`",
            )
        problems: list[tuple[Loc, str, str]] = []
        for index, name in enumerate(self.names):
            if name.endswith(self.global_suffix):
                problems.append(
                    (
                        ("names", index),
                        f"source topic {name!r} ends with the global suffix "
                        f"{self.global_suffix!r}: replicating it would loop",
                        "list the source topic T, not T" + self.global_suffix,
                    )
                )
                continue
            if naming.is_kafka_internal_topic(name):
                problems.append(
                    (
                        ("names", index),
                        f"{name!r} is one of Kafka's own topics (the '__' prefix is "
                        "reserved): replicating it would mix clusters' internal state",
                        "list only your own topics",
                    )
                )
                continue
            problem = naming.topic_name_problem(name + self.global_suffix)
            if problem:
                problems.append(
                    (
                        ("names", index),
                        f"its replicated topic {name + self.global_suffix!r} is not valid: "
                        f"{problem}",
                        "shorten the topic name or the globalSuffix",
                    )
                )
        if problems:
            raise Invalid(*problems)
        return self

    def selects(self, topic: str) -> bool:
        """Whether source topic ``topic`` is replicated.

        Selected: listed in ``names`` or fully matching an ``include`` pattern, and not
        fully matching an ``exclude`` pattern. Replicated topics (ending with the suffix),
        kdsync's internal topics, heartbeat topics and Kafka's own topics are never
        selected (the sidecar adds its own group's heartbeat topic itself).
        """
        if (
            topic.endswith(self.global_suffix)
            or naming.is_internal_topic(topic)
            or naming.is_heartbeat_topic(topic)
            or naming.is_kafka_internal_topic(topic)
        ):
            return False
        if topic not in self.names and not any(re.fullmatch(p, topic) for p in self.include):
            return False
        return not any(re.fullmatch(p, topic) for p in self.exclude)

    def global_topic(self, topic: str) -> str:
        return naming.global_topic(topic, self.global_suffix)


class GroupOffsetSyncConfig(ConfigModel):
    """Which consumer groups of ``T-global`` this member keeps in step with the others.

    Off unless ``groups`` or ``include`` names one. Patterns never select kdsync's own
    groups (``kdsync-...``); name one in ``groups`` to sync it anyway.
    """

    groups: tuple[str, ...] = Field(default=(), description="explicit consumer group ids")
    include: tuple[str, ...] = Field(
        default=(), description="regular expressions; groups whose whole id matches one"
    )
    exclude: tuple[str, ...] = Field(
        default=(), description="regular expressions; groups matching one are never synced"
    )
    interval_seconds: float = Field(
        default=5.0,
        ge=0.1,
        le=3600.0,
        description="pause between two sync rounds (the lag bound grows with it)",
    )

    @field_validator("groups")
    @classmethod
    def _groups(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        problems: list[tuple[Loc, str, str]] = []
        seen: set[str] = set()
        for index, name in enumerate(value):
            if not name.strip():
                problems.append(((index,), "a consumer group id is empty", "remove it"))
            elif name in seen:
                problems.append(((index,), f"group {name!r} is listed twice", "remove one"))
            seen.add(name)
        if problems:
            raise Invalid(*problems)
        return value

    @field_validator("include", "exclude")
    @classmethod
    def _patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _compile_patterns(value)

    @property
    def enabled(self) -> bool:
        return bool(self.groups or self.include)

    def selects(self, group: str) -> bool:
        """Named in ``groups``, or fully matching an ``include`` pattern (kdsync's own
        groups excepted) and no ``exclude`` pattern."""
        if group in self.groups:
            return True
        if group.startswith(naming.INTERNAL_PREFIX):
            return False
        if not any(re.fullmatch(p, group) for p in self.include):
            return False
        return not any(re.fullmatch(p, group) for p in self.exclude)


def _check_file(value: Path, info: ValidationInfo) -> Path:
    context = info.context if isinstance(info.context, Mapping) else {}
    if not context.get("check_files", True):
        return value
    if not value.exists():
        raise invalid(
            f"file {str(value)!r} does not exist",
            "point it at the PEM file (an absolute path; kdsync pki writes these)",
        )
    if not value.is_file():
        raise invalid(f"{str(value)!r} is not a regular file", "point it at the PEM file")
    if not os.access(value, os.R_OK):
        raise invalid(
            f"file {str(value)!r} is not readable by this process",
            "fix the file's permissions or the user the sidecar runs as",
        )
    return value


class TlsConfig(ConfigModel):
    """Mutual TLS for peer links: the group CA and this member's certificate and key."""

    ca: Path = Field(description="PEM file with the group CA certificate")
    cert: Path = Field(description="PEM file with this member's certificate")
    key: Path = Field(description="PEM file with this member's private key")

    @field_validator("ca", "cert", "key")
    @classmethod
    def _readable(cls, value: Path, info: ValidationInfo) -> Path:
        return _check_file(value, info)

    def files(self) -> MemberTlsFiles:
        return MemberTlsFiles(ca_cert=self.ca, cert=self.cert, key=self.key)


class AdminConfig(ConfigModel):
    """The admin listener: /status, /source-backlog and POST /membership over mutual TLS,
    for the group's operator (its certificate names ``kdsync-operator://<group>``)."""

    listen: str = Field(
        description='HTTPS address, client certificate required, e.g. "0.0.0.0:8443"'
    )

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        return check_address(value, "admin listen address")


_TIMING_DEFAULTS = Timing()


class OrderingConfig(ConfigModel):
    """Timing of the ordering core (ticks) and batching of the source reader."""

    tick_ms: int = Field(default=50, ge=1, le=60_000, description="milliseconds per tick")
    heartbeat_ticks: int = Field(default=1, ge=1, description="leader heartbeat interval, ticks")
    election_ticks: int = Field(
        default=20, ge=1, description="election timeout in ticks; must exceed 2 heartbeats"
    )
    witness_election_factor: int = Field(
        default=_TIMING_DEFAULTS.witness_election_factor,
        ge=1,
        description="how many times longer witnesses wait before campaigning",
    )
    resend_ticks: int = Field(
        default=100, ge=1, description="an unordered batch is offered again after this long"
    )
    max_batch_events: int = Field(default=500, ge=1, description="events per origin batch")
    # 100 ms: fewer, fuller batches cost less CPU per event than the wait costs latency on
    # a busy machine (docs/performance.md, "Latency: where an event waits").
    source_linger_ms: int = Field(
        default=100,
        ge=0,
        le=1_000,
        description="how long the source reader waits for a fuller batch; 0 takes what has arrived",
    )
    transaction_interval_ms: int = Field(
        default=0,
        ge=0,
        le=10_000,
        description="spacing of T-global transaction starts, in whole ticks (rounded up) "
        "counted from the tick the last one started in, so a gap can be up to one tick "
        "shorter; 0 starts the next as soon as one commits",
    )
    # At most 16 MiB: a batch crosses the peer port as one frame and is stored as one
    # ordering-log record, both capped at 64 MiB (with room for one event of up to 32 MiB).
    max_batch_bytes: int = Field(
        default=1024 * 1024, ge=1, le=16 * 1024 * 1024, description="bytes per origin batch"
    )
    max_entries_per_append: int = Field(
        default=_TIMING_DEFAULTS.max_entries_per_append,
        ge=1,
        description="log entries per replication message",
    )
    max_append_bytes: int = Field(
        default=_TIMING_DEFAULTS.max_append_bytes,
        ge=1024,
        le=16 * 1024 * 1024,  # one replication message is one frame of at most 64 MiB
        description="payload bytes per replication message (one entry is always sent)",
    )
    max_uncommitted: int = Field(
        default=_TIMING_DEFAULTS.max_uncommitted, ge=1, description="leader backlog bound"
    )
    max_uncommitted_bytes: int = Field(
        default=_TIMING_DEFAULTS.max_uncommitted_bytes,
        ge=1,
        description="bytes of the leader's backlog (at least one batch is admitted)",
    )
    max_outbox: int = Field(
        default=_TIMING_DEFAULTS.max_outbox,
        ge=1,
        description="batches of its own events a member keeps until they are committed",
    )
    retained_applied: int = Field(
        default=_TIMING_DEFAULTS.retained_applied,
        ge=1,
        description="applied entries kept in memory for lagging peers",
    )
    max_apply_bytes: int = Field(
        default=_TIMING_DEFAULTS.max_apply_bytes,
        ge=1,
        description="bytes of ordered events handed to the T-global writer and not yet "
        "written (at least one entry)",
    )
    max_log_bytes: int = Field(
        default=_TIMING_DEFAULTS.max_log_bytes,
        ge=0,
        description="bytes of committed, stored log entries kept in memory; the rest is "
        "read back from the ordering log when applied or sent to a lagging peer",
    )

    @model_validator(mode="after")
    def _election(self) -> OrderingConfig:
        if self.election_ticks <= 2 * self.heartbeat_ticks:
            raise invalid(
                f"electionTicks ({self.election_ticks}) must exceed two heartbeats "
                f"(2 x heartbeatTicks = {2 * self.heartbeat_ticks}), or followers start "
                "elections while the leader is healthy",
                f"raise electionTicks to at least {2 * self.heartbeat_ticks + 1} "
                "(10 or more heartbeats is typical)",
                ("electionTicks",),
            )
        return self

    def timing(self) -> Timing:
        return Timing(
            heartbeat_ticks=self.heartbeat_ticks,
            election_ticks=self.election_ticks,
            witness_election_factor=self.witness_election_factor,
            resend_ticks=self.resend_ticks,
            max_entries_per_append=self.max_entries_per_append,
            max_append_bytes=self.max_append_bytes,
            max_uncommitted=self.max_uncommitted,
            max_uncommitted_bytes=self.max_uncommitted_bytes,
            max_outbox=self.max_outbox,
            retained_applied=self.retained_applied,
            max_apply_bytes=self.max_apply_bytes,
            max_log_bytes=self.max_log_bytes,
            # A read-back is a quarter of what the log may keep (16 MiB by default).
            max_load_bytes=min(_TIMING_DEFAULTS.max_load_bytes, max(1, self.max_log_bytes // 4)),
        )
