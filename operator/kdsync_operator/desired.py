"""All desired children of a group in one bundle, split by when they may be applied."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kdsync_operator import audit, children
from kdsync_operator.children import Obj, SecretData
from kdsync_operator.spec import Group, SpecProblem


@dataclass
class Children:
    """Everything the group should own, split by when it may be applied."""

    shared: list[Obj] = field(default_factory=list)
    members: dict[str, list[Obj]] = field(default_factory=dict)  # config Secret + StatefulSet
    hashes: dict[str, str] = field(default_factory=dict)  # member -> desired config hash
    agreement: str = ""  # hash of what every member must share (children.group_agreement)
    topics: str = ""  # hash of the part a restart must change together (topics_agreement)
    member_set: str = ""  # hash of the member set (children.member_set)
    audit: list[Obj] = field(default_factory=list)
    problems: list[SpecProblem] = field(default_factory=list)


def build_children(
    group: Group,
    pki_secrets: Mapping[str, Obj],
    secrets: SecretData,
    audit_driver_role: str = audit.DEFAULT_DRIVER_CLUSTER_ROLE,
) -> Children:
    """All desired children. ``pki_secrets`` are the CA/member TLS Secrets (from
    ``pki.desired_pki_secrets``), keyed by name; ``secrets`` the user's referenced Secrets;
    ``audit_driver_role`` the ClusterRole the audit's Spark driver is bound to."""
    result = Children()
    result.problems = children.config_problems(group, secrets)
    result.agreement = children.digest(children.group_agreement(group))
    result.topics = children.digest(children.topics_agreement(group))
    result.member_set = children.digest(children.member_set(group))
    result.shared += [
        children.sidecar_service_account_object(group),
        children.peers_service(group),
        children.network_policy(group),
        *pki_secrets.values(),
    ]
    for member in group.spec.members:
        config, _ = children.sidecar_config(group, member.name, secrets)
        text = children.render_config(config)
        tls = pki_secrets.get(children.tls_secret_name(group.name, member.name), {})
        sts = children.statefulset(group, member, text, children.digest(tls.get("data", {})))
        result.members[member.name] = [children.config_secret(group, member.name, text), sts]
        hashed = children.config_hash(sts)
        assert hashed is not None
        result.hashes[member.name] = hashed
    if group.spec.checks.enabled:
        result.audit = audit.audit_objects(group, secrets, audit_driver_role)
    return result
