"""Desired child objects of a KdsyncGroup: pure functions from the spec to manifests.

For group ``g`` in namespace ``ns`` with members ``m1..mn``:

| object | name | applied |
|---|---|---|
| Secret (group CA) | ``g-ca`` | always (created once, then kept) |
| Secret (member peer certificate) | ``g-<m>-tls`` | always (issued once per member) |
| Secret (sidecar config ``config.yaml``) | ``g-<m>-config`` | with its member's rollout step |
| StatefulSet (one replica) | ``g-<m>`` | with its member's rollout step |
| headless Service | ``g-peers`` | always |
| NetworkPolicy | ``g-peers`` | always |
| ServiceAccount | ``g-sidecar`` | always |
| audit RBAC, config, report ConfigMap, Spark app | ``g-audit...`` | if checks enabled |

The config is a Secret, not a ConfigMap, because Kafka properties may be resolved from
the user's Secrets (``kafka.propertiesSecretRef``). Every object carries an owner reference
to the group, so deleting the group deletes them (through the garbage collector).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import yaml

from kdsync.config import ConfigError, parse_config
from kdsync_operator.spec import (
    ADMIN_PORT,
    API_GROUP,
    API_VERSION,
    HTTP_PORT,
    KIND,
    PEER_PORT,
    Group,
    MemberSpec,
    SpecProblem,
)

Obj = dict[str, Any]
# Decoded data of the user's Secrets the spec refers to: {secret name: {key: value}}.
SecretData = Mapping[str, Mapping[str, str]]

CONFIG_DIR = "/etc/kdsync"
CONFIG_PATH = f"{CONFIG_DIR}/config.yaml"
TLS_DIR = f"{CONFIG_DIR}/tls"
KAFKA_CA_DIR = f"{CONFIG_DIR}/kafka"
AUDIT_MAIN = "local:///opt/kdsync/audit/spark_main.py"
CONFIG_HASH_ANNOTATION = f"{API_GROUP}/config-hash"
# A hash of what every member must share (group_agreement): see rollout.py for why.
AGREEMENT_HASH_ANNOTATION = f"{API_GROUP}/agreement-hash"
# A hash of the topics settings alone: the part of the agreement a restart must change
# on every member at once (members change at runtime, one at a time: membership.py).
TOPICS_HASH_ANNOTATION = f"{API_GROUP}/topics-hash"
# A hash of the member set (names and roles, in no order): a member whose StatefulSet
# carries another one runs a list the group may not have committed yet (membership.py).
MEMBERS_HASH_ANNOTATION = f"{API_GROUP}/members-hash"
MULTUS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
MANAGED_BY = "kdsync-operator"
GROUP_LABEL = f"{API_GROUP}/group"
MEMBER_LABEL = f"{API_GROUP}/member"
COMPONENT_LABEL = "app.kubernetes.io/component"
SIDECAR_UID = 10001


# --- names ---------------------------------------------------------------------------


def statefulset_name(group: str, member: str) -> str:
    return f"{group}-{member}"


def peers_service_name(group: str) -> str:
    return f"{group}-peers"


def config_secret_name(group: str, member: str) -> str:
    return f"{group}-{member}-config"


def tls_secret_name(group: str, member: str) -> str:
    return f"{group}-{member}-tls"


def ca_secret_name(group: str) -> str:
    return f"{group}-ca"


def sidecar_service_account(group: str) -> str:
    return f"{group}-sidecar"


def audit_name(group: str) -> str:
    return f"{group}-audit"


def audit_report_configmap(group: str) -> str:
    return f"{group}-audit-report"


def pod_host(group: Group, member: str) -> str:
    """The stable DNS name of a member's pod behind the headless Service."""
    return (
        f"{statefulset_name(group.name, member)}-0.{peers_service_name(group.name)}."
        f"{group.namespace}.svc"
    )


def peer_address(group: Group, member: str) -> str:
    """Where the other members dial ``member``."""
    return f"{pod_host(group, member)}:{PEER_PORT}"


def admin_address(group: Group, member: str) -> str:
    """Where the operator reaches ``member``'s admin listener (mutual TLS)."""
    return f"{pod_host(group, member)}:{ADMIN_PORT}"


# --- metadata ------------------------------------------------------------------------


def labels(group: Group, component: str, member: str | None = None) -> dict[str, str]:
    result = {
        "app.kubernetes.io/name": "kdsync",
        "app.kubernetes.io/instance": group.name,
        COMPONENT_LABEL: component,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        GROUP_LABEL: group.name,
    }
    if member is not None:
        result[MEMBER_LABEL] = member
    return result


def owner_reference(group: Group) -> Obj:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": group.name,
        "uid": group.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(group: Group, name: str, component: str, member: str | None = None) -> Obj:
    return {
        "name": name,
        "namespace": group.namespace,
        "labels": labels(group, component, member),
        "ownerReferences": [owner_reference(group)],
    }


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode("ascii")


def digest(value: object) -> str:
    """A short stable hash of JSON-able data."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# --- sidecar config ------------------------------------------------------------------


def kafka_ca_path(member: str) -> str:
    return f"{KAFKA_CA_DIR}/{member}/ca.crt"


def _kafka_section(
    member: MemberSpec, secrets: SecretData, problems: list[SpecProblem], index: int
) -> Obj | None:
    if member.witness or member.kafka is None:
        return None
    kafka = member.kafka
    properties = dict(kafka.properties)
    if kafka.properties_secret_ref is not None:
        ref = kafka.properties_secret_ref.name
        if ref not in secrets:
            problems.append(
                SpecProblem(
                    f"spec.members[{index}].kafka.propertiesSecretRef.name",
                    f"Secret {ref!r} does not exist (or the operator cannot read it)",
                    "create the Secret in the group's namespace, one librdkafka property "
                    "per key (e.g. sasl.password)",
                )
            )
        else:
            properties.update(secrets[ref])
    if kafka.ca_secret_ref is not None:
        properties.setdefault("ssl.ca.location", kafka_ca_path(member.name))
    return {"bootstrapServers": kafka.bootstrap_servers, "properties": properties}


def sidecar_config(
    group: Group, member: str, secrets: SecretData | None = None
) -> tuple[Obj, list[SpecProblem]]:
    """The config file (as data) for ``member``'s sidecar, and problems resolving it.

    Every member's config is the same except ``member`` and ``transport`` (a member may
    override the group's transport, e.g. a node pool without RDMA NICs).
    """
    problems: list[SpecProblem] = []
    spec = group.spec
    members: list[Obj] = []
    for index, item in enumerate(spec.members):
        entry: Obj = {"name": item.name, "peer": peer_address(group, item.name)}
        if item.witness:
            entry["witness"] = True
        kafka = _kafka_section(item, secrets or {}, problems, index)
        if kafka is not None:
            entry["kafka"] = kafka
        members.append(entry)
    config: Obj = {
        "group": group.name,
        "member": member,
        "members": members,
        "topics": _topics_section(group),
        "tls": {
            "ca": f"{TLS_DIR}/ca.crt",
            "cert": f"{TLS_DIR}/tls.crt",
            "key": f"{TLS_DIR}/tls.key",
        },
        "listen": f"0.0.0.0:{PEER_PORT}",
        "http": f"0.0.0.0:{HTTP_PORT}",
        # The operator changes the group's members through this listener, authenticated
        # by its certificate from the group CA (membership.py). allowMembershipChanges
        # stays off: it would open the plain port's loopback path too, which a mesh proxy
        # in the pod would make reachable from anywhere.
        "admin": {"listen": f"0.0.0.0:{ADMIN_PORT}"},
    }
    if spec.transport_of(spec.member(member)).type == "rdma":
        config["transport"] = {"type": "rdma"}
    ordering = spec.ordering.as_config()
    if ordering:
        config["ordering"] = ordering
    group_offset_sync = spec.group_offset_sync.as_config()
    if group_offset_sync:
        config["groupOffsetSync"] = group_offset_sync
    return config, problems


def _topics_section(group: Group) -> Obj:
    topics = group.spec.topics
    section: Obj = {
        "globalSuffix": topics.global_suffix,
        "globalPartitions": topics.global_partitions,
    }
    for key, values in (
        ("names", topics.names),
        ("include", topics.include),
        ("exclude", topics.exclude),
    ):
        if values:
            section[key] = list(values)
    return section


def group_agreement(group: Group) -> Obj:
    """What every member's sidecar must share, as its config renders it: the member list
    (names and roles, in order) and the topics settings. The sidecars compare exactly
    this in their peer handshake (``SidecarConfig.agreement``) and refuse a peer whose
    settings differ."""
    return {
        "members": [[m.name, m.witness] for m in group.spec.members],
        "topics": _topics_section(group),
    }


def member_set(group: Group) -> Obj:
    """The members as a set (names and roles): what a runtime change changes."""
    return {"members": sorted([m.name, m.witness] for m in group.spec.members)}


def topics_agreement(group: Group) -> Obj:
    """The part of ``group_agreement`` no rolling restart can change: the members change
    at runtime (membership.py), so only the topics settings force a restart together."""
    return {"topics": _topics_section(group)}


def config_problems(group: Group, secrets: SecretData | None = None) -> list[SpecProblem]:
    """Renders every member's config and validates it as the sidecar will.

    With ``secrets=None`` (admission time) Secret references are not resolved.
    """
    problems: list[SpecProblem] = []
    seen: set[str] = set()
    for member in group.spec.members:
        config, resolve = sidecar_config(group, member.name, secrets)
        if secrets is not None:
            problems += [p for p in resolve if str(p) not in seen]
            seen.update(str(p) for p in resolve)
        try:
            parse_config(config, f"config of member {member.name}", check_files=False)
        except ConfigError as error:
            for item in error.problems:
                where = _config_path_to_spec(item.path, group)
                text = f"{where}: {item.problem}"
                if text not in seen:
                    seen.add(text)
                    problems.append(SpecProblem(where, item.problem, item.fix))
    return problems


def _config_path_to_spec(path: str, group: Group) -> str:
    """Maps a sidecar config path (``members[1].kafka.properties``) to the spec field."""
    if path.startswith(("members", "topics", "ordering", "groupOffsetSync")):
        return f"spec.{path}"
    if path == "group":
        return "metadata.name"
    return f"spec (rendered sidecar config field {path})"


def render_config(config: Obj) -> str:
    return yaml.safe_dump(config, sort_keys=False)


# --- the StatefulSet and its pod -----------------------------------------------------


def _container(group: Group, member: MemberSpec) -> Obj:
    spec = group.spec
    transport = spec.transport_of(member)
    resources: Obj = json.loads(json.dumps(spec.sidecar.resources))
    capabilities: Obj = {"drop": ["ALL"]}
    if transport.type == "rdma" and transport.rdma is not None:
        count = str(transport.rdma.resource_count)
        for section in ("requests", "limits"):
            resources.setdefault(section, {})[transport.rdma.resource_name] = count
        capabilities["add"] = ["IPC_LOCK"]
    mounts: list[Obj] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "peer-tls", "mountPath": TLS_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},  # the root filesystem is read-only
    ]
    mounts += [
        {"name": f"kafka-ca-{m.name}", "mountPath": f"{KAFKA_CA_DIR}/{m.name}", "readOnly": True}
        for m in spec.members
        if m.kafka is not None and m.kafka.ca_secret_ref is not None
    ]
    container: Obj = {
        "name": "kdsync",
        "image": spec.sidecar.image,
        "imagePullPolicy": spec.sidecar.image_pull_policy,
        "command": ["kdsync", "run", "--config", CONFIG_PATH],
        "env": [
            {"name": "KDSYNC_MEMBER", "value": member.name},
            {"name": "KDSYNC_TRANSPORT", "value": transport.type},
        ],
        "ports": [
            {"name": "peer", "containerPort": PEER_PORT, "protocol": "TCP"},
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP"},
        ],
        # Every second: a rollout step and a membership edit wait for the member to be
        # Ready, and a 5 s period added up to 5 s to each. 15 failures: unready after
        # 15 s, as with 3 x 5 s before.
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "http"},
            "periodSeconds": 1,
            "failureThreshold": 15,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": capabilities,
        },
        "volumeMounts": mounts,
    }
    if resources:
        container["resources"] = resources
    return container


def _kafka_ca_volumes(group: Group) -> list[Obj]:
    volumes: list[Obj] = []
    for member in group.spec.members:
        if member.kafka is None or member.kafka.ca_secret_ref is None:
            continue
        ref = member.kafka.ca_secret_ref
        volumes.append(
            {
                "name": f"kafka-ca-{member.name}",
                "secret": {"secretName": ref.name, "items": [{"key": ref.key, "path": "ca.crt"}]},
            }
        )
    return volumes


def statefulset(group: Group, member: MemberSpec, config_text: str, tls_digest: str) -> Obj:
    """The one-replica StatefulSet of ``member``; its pod template carries a hash of
    everything that should restart the sidecar (template, config, certificate)."""
    spec = group.spec
    transport = spec.transport_of(member)
    selector = {GROUP_LABEL: group.name, MEMBER_LABEL: member.name}
    pod_labels = {**spec.sidecar.pod_labels, **labels(group, "sidecar", member.name)}
    annotations = dict(spec.sidecar.pod_annotations)
    if transport.type == "rdma" and transport.rdma is not None:
        annotations[MULTUS_ANNOTATION] = transport.rdma.network_attachment
    annotations[AGREEMENT_HASH_ANNOTATION] = digest(group_agreement(group))
    annotations[TOPICS_HASH_ANNOTATION] = digest(topics_agreement(group))
    annotations[MEMBERS_HASH_ANNOTATION] = digest(member_set(group))
    pod_spec: Obj = {
        "serviceAccountName": sidecar_service_account(group.name),
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SIDECAR_UID,
            "runAsGroup": SIDECAR_UID,
            "fsGroup": SIDECAR_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(group, member)],
        "volumes": [
            {
                "name": "config",
                "secret": {
                    "secretName": config_secret_name(group.name, member.name),
                    "items": [{"key": "config.yaml", "path": "config.yaml"}],
                },
            },
            {
                "name": "peer-tls",
                "secret": {"secretName": tls_secret_name(group.name, member.name)},
            },
            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
            *_kafka_ca_volumes(group),
        ],
    }
    if spec.sidecar.node_selector:
        pod_spec["nodeSelector"] = dict(spec.sidecar.node_selector)
    if spec.sidecar.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.sidecar.tolerations]
    if spec.sidecar.affinity:
        pod_spec["affinity"] = dict(spec.sidecar.affinity)
    if spec.sidecar.priority_class_name:
        pod_spec["priorityClassName"] = spec.sidecar.priority_class_name
    annotations[CONFIG_HASH_ANNOTATION] = digest(
        {"pod": pod_spec, "labels": pod_labels, "annotations": annotations,
         "config": config_text, "tls": tls_digest}
    )  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(group, statefulset_name(group.name, member.name), "sidecar", member.name),
        "spec": {
            "replicas": 1,
            "serviceName": peers_service_name(group.name),
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }


def _template_annotation(sts: Mapping[str, Any], name: str) -> str | None:
    template = sts.get("spec", {}).get("template", {})
    value = template.get("metadata", {}).get("annotations", {}).get(name)
    return value if isinstance(value, str) else None


def config_hash(sts: Mapping[str, Any]) -> str | None:
    """The config hash on an observed StatefulSet's pod template."""
    return _template_annotation(sts, CONFIG_HASH_ANNOTATION)


def agreement_hash(sts: Mapping[str, Any]) -> str | None:
    """The agreement hash on an observed StatefulSet's pod template (None: made by an
    operator version that did not set it)."""
    return _template_annotation(sts, AGREEMENT_HASH_ANNOTATION)


def members_hash(sts: Mapping[str, Any]) -> str | None:
    """The member-set hash on an observed StatefulSet's pod template (None: older)."""
    return _template_annotation(sts, MEMBERS_HASH_ANNOTATION)


def topics_hash(sts: Mapping[str, Any]) -> str | None:
    """The topics hash on an observed StatefulSet's pod template (None: an older operator
    made it, which set only the agreement hash)."""
    return _template_annotation(sts, TOPICS_HASH_ANNOTATION)


# --- shared objects ------------------------------------------------------------------


def peers_service(group: Group) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(group, peers_service_name(group.name), "peers"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {GROUP_LABEL: group.name, COMPONENT_LABEL: "sidecar"},
            "ports": [
                {"name": "peer", "port": PEER_PORT, "targetPort": "peer", "protocol": "TCP"},
                {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "admin", "port": ADMIN_PORT, "targetPort": "admin", "protocol": "TCP"},
            ],
        },
    }


def network_policy(group: Group) -> Obj:
    """Peer port: only from this group's sidecars. HTTP (probes, /metrics) and the admin
    listener (mutual TLS: only the operator's certificate may change members): from
    anywhere, since the operator's namespace and labels are the chart's to choose."""
    own = {"matchLabels": {GROUP_LABEL: group.name, COMPONENT_LABEL: "sidecar"}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(group, peers_service_name(group.name), "network-policy"),
        "spec": {
            "podSelector": own,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": own}], "ports": [{"protocol": "TCP", "port": PEER_PORT}]},
                {"ports": [{"protocol": "TCP", "port": HTTP_PORT}]},
                {"ports": [{"protocol": "TCP", "port": ADMIN_PORT}]},
            ],
        },
    }


def sidecar_service_account_object(group: Group) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(group, sidecar_service_account(group.name), "sidecar"),
        "automountServiceAccountToken": False,
    }


def config_secret(group: Group, member: str, config_text: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(group, config_secret_name(group.name, member), "config", member),
        "type": "Opaque",
        "data": {"config.yaml": _b64(config_text)},
    }
