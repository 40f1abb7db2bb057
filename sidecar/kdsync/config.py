"""The sidecar's configuration: a YAML file, validated into frozen pydantic models.

``load_config(path)`` reads and checks a file and raises ``ConfigError`` listing every
problem found, each as the field's path in YAML form (``members[1].kafka.bootstrapServers``),
what is wrong and how to fix it. Keys are camelCase in YAML; the models also accept the
snake_case field names when built from Python.

Problems are reported together: field checks, and the rules that relate several fields
(member names unique, ``member`` is one of ``members``, TLS unless insecure, ...), which
also run on the raw data when some field is invalid. A section's own cross-field rule
(e.g. ``electionTicks`` against ``heartbeatTicks``) runs once that section's fields are
valid, so fixing one problem may reveal another there.

TLS files are checked for existence and readability while validating. Code that builds a
model for files that live elsewhere (e.g. an operator rendering a config for a pod) passes
``check_files=False`` to ``parse_config`` or ``context={"check_files": False}`` to
``SidecarConfig.model_validate``.
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from kdsync import naming
from kdsync.ordering import GroupSpec, GroupSpecError, Timing
from kdsync.transport.tcp import TcpTransportConfig, parse_address
from kdsync.transport.tls import MemberTlsFiles

Loc = tuple[str | int, ...]

# librdkafka properties kdsync sets itself, and why a user must not.
OWNED_KAFKA_PROPERTIES: Mapping[str, str] = {
    "bootstrap.servers": "set it with `bootstrapServers` next to `properties`",
    "transactional.id": (
        "kdsync derives it from the group and member (kdsync-<group>-<member>) so that a "
        "restarted sidecar fences its zombie predecessor"
    ),
    "enable.idempotence": "kdsync's transactional producer needs idempotence and turns it on",
    "isolation.level": (
        "kdsync reads with read_committed so that aborted records are never replicated"
    ),
    "group.id": "kdsync uses the consumer group kdsync-<group>; its offsets move with deliveries",
    "enable.auto.commit": (
        "kdsync commits source offsets inside its delivery transaction; auto-commit would "
        "lose or duplicate events"
    ),
}


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    """One thing wrong with a config: where (YAML path), what, and how to fix it."""

    path: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}\n    fix: {self.fix}"


class ConfigError(Exception):
    """A config that cannot be used; ``str()`` lists every problem, one per paragraph."""

    def __init__(self, problems: Sequence[ConfigProblem], source: str = "config") -> None:
        self.problems = tuple(problems)
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        count = len(self.problems)
        noun = "problem" if count == 1 else "problems"
        lines = [f"{self.source}: {count} {noun}"]
        lines.extend(f"  {problem}" for problem in self.problems)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self._render()


class _Invalid(ValueError):
    """Raised inside validators: one or more problems, at paths relative to the validator."""

    def __init__(self, *items: tuple[Loc, str, str]) -> None:
        self.items = items
        super().__init__("; ".join(f"{problem} ({fix})" for _, problem, fix in items))


def _invalid(problem: str, fix: str, at: Loc = ()) -> _Invalid:
    return _Invalid((at, problem, fix))


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


def _check_address(text: str, what: str) -> str:
    problem = _address_problem(text, what)
    if problem:
        raise _invalid(problem, 'write it as "host:port", e.g. "10.0.0.1:7400" or "[::1]:7400"')
    return text


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
    )


class KafkaConfig(_Model):
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
            raise _invalid(
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
            raise _Invalid(*problems)
        return result

    def client_properties(self) -> dict[str, str]:
        """librdkafka properties common to every client of this member (before kdsync's)."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.properties}


class MemberConfig(_Model):
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
            raise _invalid(problem, "rename the member, e.g. us-east or witness-1")
        return value

    @field_validator("peer")
    @classmethod
    def _peer(cls, value: str) -> str:
        return _check_address(value, "peer address")

    @model_validator(mode="after")
    def _kafka_iff_data(self) -> MemberConfig:
        if self.witness and self.kafka is not None:
            raise _invalid(
                f"member {self.name!r} is a witness, and a witness owns no Kafka cluster",
                "remove the kafka section, or remove `witness: true` to make it a data member",
                ("kafka",),
            )
        if not self.witness and self.kafka is None:
            raise _invalid(
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
        raise _Invalid(*problems)
    return patterns


class TopicsConfig(_Model):
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
            raise _Invalid(*problems)
        return value

    @field_validator("include", "exclude")
    @classmethod
    def _patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _compile_patterns(value)

    @field_validator("global_suffix")
    @classmethod
    def _suffix(cls, value: str) -> str:
        if not value or not naming.TOPIC_NAME_PATTERN.fullmatch(value):
            raise _invalid(
                f"suffix {value!r} must be non-empty and use only [a-zA-Z0-9._-]",
                'use a suffix such as "-global"',
            )
        return value

    @model_validator(mode="after")
    def _selection(self) -> TopicsConfig:
        if not self.names and not self.include:
            raise _invalid(
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
            raise _Invalid(*problems)
        return self

    def selects(self, topic: str) -> bool:
        """Whether source topic ``topic`` is replicated.

        Selected: listed in ``names`` or fully matching an ``include`` pattern, and not
        fully matching an ``exclude`` pattern. Replicated topics (ending with the suffix)
        and kdsync's internal topics are never selected.
        """
        if topic.endswith(self.global_suffix) or naming.is_internal_topic(topic):
            return False
        if topic not in self.names and not any(re.fullmatch(p, topic) for p in self.include):
            return False
        return not any(re.fullmatch(p, topic) for p in self.exclude)

    def global_topic(self, topic: str) -> str:
        return naming.global_topic(topic, self.global_suffix)


def _check_file(value: Path, info: ValidationInfo) -> Path:
    context = info.context if isinstance(info.context, Mapping) else {}
    if not context.get("check_files", True):
        return value
    if not value.exists():
        raise _invalid(
            f"file {str(value)!r} does not exist",
            "point it at the PEM file (an absolute path; kdsync pki writes these)",
        )
    if not value.is_file():
        raise _invalid(f"{str(value)!r} is not a regular file", "point it at the PEM file")
    if not os.access(value, os.R_OK):
        raise _invalid(
            f"file {str(value)!r} is not readable by this process",
            "fix the file's permissions or the user the sidecar runs as",
        )
    return value


class TlsConfig(_Model):
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


_TIMING_DEFAULTS = Timing()


class OrderingConfig(_Model):
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
    max_batch_bytes: int = Field(default=1024 * 1024, ge=1, description="bytes per origin batch")
    max_entries_per_append: int = Field(
        default=_TIMING_DEFAULTS.max_entries_per_append,
        ge=1,
        description="log entries per replication message",
    )
    max_append_bytes: int = Field(
        default=_TIMING_DEFAULTS.max_append_bytes,
        ge=1024,
        description="payload bytes per replication message (one entry is always sent)",
    )
    max_uncommitted: int = Field(
        default=_TIMING_DEFAULTS.max_uncommitted, ge=1, description="leader backlog bound"
    )
    max_outbox: int = Field(
        default=_TIMING_DEFAULTS.max_outbox, ge=1, description="batches an origin keeps in flight"
    )
    retained_applied: int = Field(
        default=_TIMING_DEFAULTS.retained_applied,
        ge=1,
        description="applied entries kept in memory for lagging peers",
    )

    @model_validator(mode="after")
    def _election(self) -> OrderingConfig:
        if self.election_ticks <= 2 * self.heartbeat_ticks:
            raise _invalid(
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
            max_outbox=self.max_outbox,
            retained_applied=self.retained_applied,
        )


MemberFacts = tuple[str | None, str | None, bool]  # name, peer, witness


def _group_problems(
    member: str | None, members: Sequence[MemberFacts], *, insecure: bool, has_tls: bool
) -> list[tuple[Loc, str, str]]:
    """Rules that relate several fields. Unknown (None) names and peers are skipped, so
    this also runs on raw data whose fields are not all valid yet."""
    problems: list[tuple[Loc, str, str]] = []
    if len(members) < 2:
        problems.append(
            (
                ("members",),
                f"a group needs at least 2 members, this one has {len(members)}",
                "list every member of the group, including this one",
            )
        )
    first_name: dict[str, int] = {}
    first_peer: dict[str, int] = {}
    for index, (name, peer, _) in enumerate(members):
        if name is not None and name in first_name:
            problems.append(
                (
                    ("members", index, "name"),
                    f"member name {name!r} is already used by members[{first_name[name]}]",
                    "give every member a unique name",
                )
            )
        elif name is not None:
            first_name[name] = index
        if peer is not None and peer in first_peer:
            problems.append(
                (
                    ("members", index, "peer"),
                    f"peer address {peer!r} is already used by members[{first_peer[peer]}]",
                    "give every member its own host:port",
                )
            )
        elif peer is not None:
            first_peer[peer] = index
    witnesses = sum(1 for _, _, witness in members if witness)
    data = len(members) - witnesses
    if witnesses and witnesses >= data:
        problems.append(
            (
                ("members",),
                f"{data} data member(s) and {witnesses} witness(es): a group needs more "
                "data members than witnesses, so that every majority includes a member "
                "that stores the log durably",
                "add a data member or remove a witness",
            )
        )
    if member is not None and member not in first_name:
        problems.append(
            (
                ("member",),
                f"{member!r} is not one of the members {list(first_name)}",
                "set `member` to this sidecar's entry in `members`",
            )
        )
    if insecure and has_tls:
        problems.append(
            (
                ("insecure",),
                "both `insecure: true` and a tls section are set",
                "remove `insecure: true` to use mutual TLS, or remove the tls section",
            )
        )
    elif not insecure and not has_tls:
        problems.append(
            (
                ("tls",),
                "peer links need mutual TLS: the tls section is missing",
                "add `tls: {ca: ..., cert: ..., key: ...}` (kdsync.pki makes a group CA and "
                "member certificates), or set `insecure: true` for a local test",
            )
        )
    return problems


def _raw_group_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str, str]]:
    """``_group_problems`` on unvalidated data, as far as its shape allows."""
    raw_members = data.get("members")
    if not isinstance(raw_members, list):
        return []
    facts: list[MemberFacts] = []
    for item in raw_members:
        entry = item if isinstance(item, dict) else {}
        name, peer = entry.get("name"), entry.get("peer")
        facts.append(
            (
                name if isinstance(name, str) else None,
                peer if isinstance(peer, str) else None,
                entry.get("witness") is True,
            )
        )
    member = data.get("member")
    return _group_problems(
        member if isinstance(member, str) else None,
        facts,
        insecure=data.get("insecure") is True,
        has_tls=data.get("tls") is not None,
    )


class SidecarConfig(_Model):
    """Everything one sidecar (``kdsync run --config FILE``) needs."""

    group: str = Field(description="the group's name, the same in every member, e.g. orders")
    member: str = Field(description="which of `members` this sidecar is")
    members: tuple[MemberConfig, ...] = Field(
        description="every voting member of the group (the same list in every member)"
    )
    topics: TopicsConfig = Field(description="which topics to replicate")
    tls: TlsConfig | None = Field(
        default=None, description="mutual TLS files for peer links (ca, cert, key)"
    )
    insecure: bool = Field(
        default=False, description="plaintext, unauthenticated peer links (local tests only)"
    )
    listen: str | None = Field(
        default=None, description='peer address to bind, default "0.0.0.0:<own peer port>"'
    )
    http: str = Field(
        default="0.0.0.0:8080", description="address of /healthz, /readyz and /metrics"
    )
    ordering: OrderingConfig = Field(
        default_factory=OrderingConfig, description="ordering core timing"
    )

    @field_validator("group")
    @classmethod
    def _group(cls, value: str) -> str:
        problem = naming.name_problem(value, "group", naming.MAX_GROUP_NAME_LENGTH)
        if problem:
            raise _invalid(problem, "use a short lower-case name such as orders")
        return value

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        return None if value is None else _check_address(value, "listen address")

    @field_validator("http")
    @classmethod
    def _http(cls, value: str) -> str:
        return _check_address(value, "http address")

    @model_validator(mode="after")
    def _cross_field(self) -> SidecarConfig:
        problems = _group_problems(
            self.member,
            [(m.name, m.peer, m.witness) for m in self.members],
            insecure=self.insecure,
            has_tls=self.tls is not None,
        )
        if not problems:
            try:
                self.group_spec()
            except GroupSpecError as exc:  # a rule the checks above do not cover yet
                problems.append((("members",), str(exc), "fix the members list"))
        if problems:
            raise _Invalid(*problems)
        return self

    # -- helpers -----------------------------------------------------------------------

    @property
    def own_member(self) -> MemberConfig:
        for member in self.members:
            if member.name == self.member:
                return member
        raise LookupError(self.member)  # unreachable after validation

    @property
    def data_members(self) -> tuple[MemberConfig, ...]:
        return tuple(m for m in self.members if not m.witness)

    @property
    def witnesses(self) -> tuple[MemberConfig, ...]:
        return tuple(m for m in self.members if m.witness)

    @property
    def is_witness(self) -> bool:
        return self.own_member.witness

    @property
    def listen_address(self) -> str:
        """Where the peer listener binds: ``listen``, else all IPv4 at the own peer port."""
        if self.listen is not None:
            return self.listen
        _, port = parse_address(self.own_member.peer)
        return f"0.0.0.0:{port}"

    def group_spec(self) -> GroupSpec:
        return GroupSpec(
            members=tuple(m.name for m in self.members),
            witnesses=frozenset(m.name for m in self.members if m.witness),
        )

    def timing(self) -> Timing:
        return self.ordering.timing()

    def transport_config(self) -> TcpTransportConfig:
        return TcpTransportConfig(
            group=self.group,
            member=self.member,
            listen=self.listen_address,
            peers={m.name: m.peer for m in self.members},
            tls=None if self.tls is None else self.tls.files(),
            insecure=self.insecure,
        )


# -- turning pydantic errors into ConfigProblems ---------------------------------------


def format_path(loc: Iterable[str | int]) -> str:
    """``("members", 1, "kafka", "bootstrapServers")`` -> ``members[1].kafka.bootstrapServers``."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", part):
            text += f".{part}" if text else part
        else:
            text += f'["{part}"]'
    return text or "(top level)"


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The model class whose keys live at ``loc`` (walking fields by YAML key), if any."""
    current: Any = SidecarConfig
    for part in loc:
        if isinstance(part, int):
            args = typing.get_args(current)
            if typing.get_origin(current) is not tuple or not args:
                return None
            current = _unwrap_optional(args[0])
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        info = _field_by_key(current, part)
        if info is None:
            return None
        current = _unwrap_optional(info[1].annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return current
    return None


def _field_by_key(model: type[BaseModel], key: str) -> tuple[str, Any] | None:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return name, info
    return None


def _keys_of(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _description(loc: Loc) -> str | None:
    if not loc or not isinstance(loc[-1], str):
        return None
    parent = _model_at(loc[:-1])
    if parent is None:
        return None
    info = _field_by_key(parent, loc[-1])
    return None if info is None else info[1].description


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_TYPE_WORDS = {
    "string_type": "a string",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "tuple_type": "a list",
    "list_type": "a list",
    "model_type": "a mapping (key: value lines)",
    "model_attributes_type": "a mapping (key: value lines)",
    "dict_type": "a mapping (key: value lines)",
    "path_type": "a file path",
}


def _yaml_kind(value: object) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the string {_shown(value)}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _problems_from_error(error: Mapping[str, Any]) -> list[ConfigProblem]:
    loc: Loc = tuple(error["loc"])
    kind: str = error["type"]
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, _Invalid):
        return [
            ConfigProblem(format_path(loc + suffix), problem, fix)
            for suffix, problem, fix in cause.items
        ]
    key = loc[-1] if loc else ""
    description = _description(loc)
    about = f" ({description})" if description else ""
    if kind == "missing":
        return [
            ConfigProblem(format_path(loc), "required but missing", f"add `{key}:`{about}".rstrip())
        ]
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        allowed = _keys_of(parent) if parent is not None else []
        close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
        hint = f"did you mean `{close[0]}`? " if close else ""
        valid = f"valid keys here: {', '.join(allowed)}" if allowed else "remove it"
        return [ConfigProblem(format_path(loc), f"unknown key {key!r}", f"{hint}{valid}")]
    if kind in _TYPE_WORDS:
        expected = _TYPE_WORDS[kind]
        fix = f"write {expected}{about}"
        if kind == "string_type" and error.get("input") is not None:
            fix = 'quote the value so YAML reads it as a string, e.g. key: "value"'
        return [
            ConfigProblem(
                format_path(loc),
                f"expected {expected}, got {_yaml_kind(error.get('input'))}",
                fix,
            )
        ]
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        ctx = error.get("ctx", {})
        bound = next(iter(ctx.values()), "?")
        symbol = {
            "greater_than_equal": ">=",
            "greater_than": ">",
            "less_than_equal": "<=",
            "less_than": "<",
        }[kind]
        return [
            ConfigProblem(
                format_path(loc),
                f"{_shown(error.get('input'))} is out of range",
                f"use a value {symbol} {bound}{about}",
            )
        ]
    message = str(error.get("msg", "invalid value"))
    return [ConfigProblem(format_path(loc), message, f"check the value{about}".rstrip())]


def problems_from_validation_error(exc: ValidationError) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    for error in exc.errors():
        problems.extend(_problems_from_error(error))
    return problems


def _non_string_keys(value: object, loc: Loc = ()) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                problems.extend(_non_string_keys(item, (*loc, key)))
            else:
                problems.append(
                    ConfigProblem(
                        format_path((*loc, str(key))),
                        f"the key {key!r} is not a string (YAML reads unquoted yes/no/on/off "
                        "as booleans and digits as numbers)",
                        "quote the key",
                    )
                )
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problems.extend(_non_string_keys(item, (*loc, index)))
    return problems


def parse_config(
    data: object, source: str = "config", *, check_files: bool = True
) -> SidecarConfig:
    """Validate already-parsed YAML data; raise ``ConfigError`` listing every problem."""
    if data is None:
        raise ConfigError(
            [ConfigProblem("(top level)", "the config is empty", "write the sidecar's config")],
            source,
        )
    if not isinstance(data, dict):
        raise ConfigError(
            [
                ConfigProblem(
                    "(top level)",
                    f"the top level must be a mapping (key: value lines), got {_yaml_kind(data)}",
                    "start the file with `group: <name>` and the other keys at column 1",
                )
            ],
            source,
        )
    key_problems = _non_string_keys(data)
    if key_problems:
        raise ConfigError(key_problems, source)
    try:
        return SidecarConfig.model_validate(data, context={"check_files": check_files})
    except ValidationError as exc:
        problems = problems_from_validation_error(exc)
    # Field problems stop pydantic before the cross-field rules; run those on the raw
    # data too, so one run reports as much as possible.
    seen = {(p.path, p.problem) for p in problems}
    for loc, problem, fix in _raw_group_problems(data):
        if (format_path(loc), problem) not in seen:
            problems.append(ConfigProblem(format_path(loc), problem, fix))
    raise ConfigError(problems, source)


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that rejects a key repeated in one mapping (a typo PyYAML ignores)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            marker = (key_node.tag, key_node.value)
            if marker in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key_node.value!r}",
                    key_node.start_mark,
                )
            seen.add(marker)
        return super().construct_mapping(node, deep=deep)


def load_config(path: Path, *, check_files: bool = True) -> SidecarConfig:
    """Read and validate a sidecar config file; raise ``ConfigError`` on any problem."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            [
                ConfigProblem(
                    "(file)",
                    f"{source} does not exist",
                    "pass the path of the sidecar's YAML config: kdsync run --config FILE",
                )
            ],
            source,
        ) from None
    except IsADirectoryError:
        raise ConfigError(
            [ConfigProblem("(file)", f"{source} is a directory", "pass the config file")],
            source,
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [
                ConfigProblem(
                    "(file)",
                    f"not UTF-8 text (byte {exc.start})",
                    "save the config as UTF-8",
                )
            ],
            source,
        ) from None
    except OSError as exc:
        raise ConfigError(
            [
                ConfigProblem(
                    "(file)",
                    f"cannot read {source}: {exc.strerror or exc}",
                    "check the path and its permissions",
                )
            ],
            source,
        ) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        what = " ".join(part for part in (exc.context, exc.problem) if part)
        raise ConfigError(
            [
                ConfigProblem(
                    where,
                    f"not valid YAML: {what}",
                    "check indentation, quoting and ':' near that line "
                    "(quote values that contain ': ' or start with special characters)",
                )
            ],
            source,
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            [ConfigProblem("(file)", f"not valid YAML: {exc}", "fix the YAML syntax")], source
        ) from None
    return parse_config(data, source, check_files=check_files)
