"""The ``KdsyncGroup`` spec as a pydantic model, and the checks CEL cannot express.

The CRD's OpenAPI schema and CEL rules (``crds/kdsync.io_kdsyncgroups.yaml``) reject most
bad objects in the API server itself; ``spec_problems`` adds what needs real code (regular
expressions, the rendered sidecar configs as ``kdsync.config`` validates them) and is what
the admission webhook answers with. Pure: no kopf, no Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from kdsync.problems import Problem

API_GROUP = "kdsync.io"
API_VERSION = "v1alpha1"
KIND = "KdsyncGroup"
PLURAL = "kdsyncgroups"

DEFAULT_SIDECAR_IMAGE = "ghcr.io/kdsync/kdsync-sidecar:0.1.0"
PEER_PORT = 7070
HTTP_PORT = 8080
ADMIN_PORT = 8443  # the sidecar's admin listener: mutual TLS, the operator's identity
# Names derived from the group and a member must stay valid object names: the pod
# `<group>-<member>-0` is a DNS label and a StatefulSet's revision label adds 11 characters.
MAX_GROUP_PLUS_MEMBER = 51


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class SecretKeyRef(_Model):
    name: str
    key: str = "ca.crt"


class SecretRef(_Model):
    name: str


class KafkaSpec(_Model):
    bootstrap_servers: str
    properties: dict[str, str] = Field(default_factory=dict)
    properties_secret_ref: SecretRef | None = None
    ca_secret_ref: SecretKeyRef | None = None


class RdmaSpec(_Model):
    resource_name: str = ""
    network_attachment: str = ""
    resource_count: int = 1


class TransportSpec(_Model):
    type: Literal["tcp", "rdma"] = "tcp"
    rdma: RdmaSpec | None = None


class MemberSpec(_Model):
    name: str
    witness: bool = False
    kafka: KafkaSpec | None = None
    transport: TransportSpec | None = None


class TopicsSpec(_Model):
    names: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    global_suffix: str = "-global"
    global_partitions: int = 1


class OrderingSpec(_Model):
    tick_ms: int | None = None
    heartbeat_ticks: int | None = None
    election_ticks: int | None = None
    resend_ticks: int | None = None
    max_batch_events: int | None = None
    max_batch_bytes: int | None = None
    source_linger_ms: int | None = None
    transaction_interval_ms: int | None = None
    max_uncommitted_bytes: int | None = None
    max_apply_bytes: int | None = None
    max_log_bytes: int | None = None

    def as_config(self) -> dict[str, int]:
        """Only the fields the user set; the sidecar applies its defaults to the rest."""
        return {
            to_camel(name): value for name, value in self.model_dump().items() if value is not None
        }


class GroupOffsetSyncSpec(_Model):
    """Consumer groups of ``T-global`` each member keeps in step from the others."""

    groups: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    interval_seconds: float | None = None

    def as_config(self) -> dict[str, Any]:
        """The sidecar's ``groupOffsetSync`` section; empty when no group is selected."""
        if not self.groups and not self.include:
            return {}
        section: dict[str, Any] = {
            key: list(values)
            for key, values in (
                ("groups", self.groups),
                ("include", self.include),
                ("exclude", self.exclude),
            )
            if values
        }
        if self.interval_seconds is not None:
            section["intervalSeconds"] = self.interval_seconds
        return section


class SidecarSpec(_Model):
    image: str = DEFAULT_SIDECAR_IMAGE
    image_pull_policy: str = "IfNotPresent"
    resources: dict[str, Any] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    affinity: dict[str, Any] = Field(default_factory=dict)
    priority_class_name: str = ""
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    pod_labels: dict[str, str] = Field(default_factory=dict)


class SparkRoleSpec(_Model):
    cores: int = 1
    core_request: str = ""  # the pod's CPU request when smaller than cores (e.g. "250m")
    memory: str = "1g"
    instances: int = 1


class ChecksSpec(_Model):
    enabled: bool = False
    schedule: str = ""
    image: str = ""
    spark_version: str = "4.0.0"
    service_account_name: str = ""
    concurrency_policy: Literal["Allow", "Forbid", "Replace"] = "Forbid"
    driver: SparkRoleSpec = Field(default_factory=SparkRoleSpec)
    executor: SparkRoleSpec = Field(default_factory=SparkRoleSpec)
    packages: tuple[str, ...] = ()


class KdsyncGroupSpec(_Model):
    members: tuple[MemberSpec, ...]
    topics: TopicsSpec
    transport: TransportSpec = Field(default_factory=TransportSpec)
    ordering: OrderingSpec = Field(default_factory=OrderingSpec)
    group_offset_sync: GroupOffsetSyncSpec = Field(default_factory=GroupOffsetSyncSpec)
    sidecar: SidecarSpec = Field(default_factory=SidecarSpec)
    checks: ChecksSpec = Field(default_factory=ChecksSpec)
    deletion_policy: Literal["Retain"] = "Retain"

    def transport_of(self, member: MemberSpec) -> TransportSpec:
        return member.transport if member.transport is not None else self.transport

    def member(self, name: str) -> MemberSpec:
        for member in self.members:
            if member.name == name:
                return member
        raise KeyError(name)


@dataclass(frozen=True)
class Group:
    """One KdsyncGroup as the builders need it: identity plus the parsed spec."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: KdsyncGroupSpec

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Group:
        meta = obj.get("metadata", {})
        return cls(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "default")),
            uid=str(meta.get("uid", "")),
            generation=int(meta.get("generation") or 0),
            spec=KdsyncGroupSpec.model_validate(obj.get("spec") or {}),
        )


# The operator's name for kdsync's one problem type, which the sidecar's config checks
# report with too (children.config_problems carries theirs over with the spec path).
SpecProblem = Problem
