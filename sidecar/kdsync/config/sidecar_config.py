"""``SidecarConfig``: everything one sidecar needs, and what the runtime derives from it."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from kdsync import naming
from kdsync.config.group_rules import group_problems
from kdsync.config.problems import Invalid, invalid
from kdsync.config.sections import (
    AdminConfig,
    ConfigModel,
    GroupOffsetSyncConfig,
    MemberConfig,
    OrderingConfig,
    TlsConfig,
    TopicsConfig,
    check_address,
)
from kdsync.config.transport_section import TransportConfig
from kdsync.ordering import GroupSpec, GroupSpecError, Timing
from kdsync.transport.address import parse_address
from kdsync.transport.rdma_config import RdmaSettings
from kdsync.transport.tcp_config import TcpTransportConfig


class SidecarConfig(ConfigModel):
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
    transport: TransportConfig = Field(
        default_factory=TransportConfig, description="peer links over tcp or rdma"
    )
    listen: str | None = Field(
        default=None, description='peer address to bind, default "0.0.0.0:<own peer port>"'
    )
    http: str = Field(
        default="0.0.0.0:8080", description="address of /healthz, /readyz and /metrics"
    )
    allow_membership_changes: bool = Field(
        default=False,
        description="take membership changes (POST /membership): on `http` from this host "
        "only, on the admin listener from the operator's certificate only",
    )
    admin: AdminConfig | None = Field(
        default=None,
        description="an admin listener over mutual TLS for the operator (needs tls)",
    )
    ordering: OrderingConfig = Field(
        default_factory=OrderingConfig, description="ordering core timing"
    )
    group_offset_sync: GroupOffsetSyncConfig = Field(
        default_factory=GroupOffsetSyncConfig,
        description="consumer groups of T-global kept in step from the other members",
    )

    @field_validator("group")
    @classmethod
    def _group(cls, value: str) -> str:
        problem = naming.name_problem(value, "group", naming.MAX_GROUP_NAME_LENGTH)
        if problem:
            raise invalid(problem, "use a short lower-case name such as orders")
        return value

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        return None if value is None else check_address(value, "listen address")

    @field_validator("http")
    @classmethod
    def _http(cls, value: str) -> str:
        return check_address(value, "http address")

    @model_validator(mode="after")
    def _cross_field(self) -> SidecarConfig:
        problems = group_problems(
            self.member,
            [(m.name, m.peer, m.witness) for m in self.members],
            insecure=self.insecure,
            has_tls=self.tls is not None,
            has_admin=self.admin is not None,
        )
        if not problems:
            try:
                self.group_spec()
            except GroupSpecError as exc:  # a rule the checks above do not cover yet
                problems.append((("members",), str(exc), "fix the members list"))
        if problems:
            raise Invalid(*problems)
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
            agreement=self.agreement(),
        )

    def rdma_settings(self) -> RdmaSettings | None:
        """The RDMA device settings when peer links should use RDMA, else None."""
        return self.transport.rdma.settings() if self.transport.type == "rdma" else None

    def agreement(self) -> dict[str, Any]:
        """The settings every member of the group must share, as JSON values: checked in
        the peer handshake, so a member configured differently is refused when it connects
        (peer addresses are left out: they may differ, e.g. behind proxies or NAT)."""
        return {
            "members": [[m.name, m.witness] for m in self.members],
            "topics": self.topics.model_dump(mode="json", by_alias=True),
        }
