"""The backfill of a data member added to a running group, as a SparkApplication.

A data member joins as a learner; before its sidecar may start, its cluster needs a
peer's ``T-global`` up to a point K and the ledger at K (``kdsync.backfill``). The
operator runs that as ``<group>-backfill-<member>`` on the spark-operator, with the Spark
settings of ``spec.checks`` (image, driver, executor, packages) and the audit's service
account, and creates the member's StatefulSet only once it has COMPLETED. The job is
resumable and idempotent (a rerun on a seeded cluster ends at once), so a failed one is
retried by deleting it. Pure: builds objects, no client.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kdsync_operator import audit, children
from kdsync_operator.children import Obj, SecretData
from kdsync_operator.spec import HTTP_PORT, Group

BACKFILL_MAIN = "local:///opt/kdsync/backfill/spark_main.py"
COMPONENT = "backfill"
# The job waits this long for every data member to apply its point; a SparkApplication
# that ends without seeding fails and says why in its driver's log.
TIMEOUT_SECONDS = 3600
# Which join a backfill is for: the configuration index that made the member a learner
# and the member's config hash. A COMPLETED backfill of another join (the member removed
# and added again, its Kafka settings changed since) proves nothing about this one.
JOIN_ANNOTATION = "kdsync.io/backfill-for"


def join_stamp(config_index: int, config_hash: str) -> str:
    return f"{config_index}/{config_hash}"


def backfill_name(group: str, member: str) -> str:
    return f"{group}-backfill-{member}"


def status_url(group: Group, member: str) -> str:
    """A member's plain HTTP endpoint (``/status`` is open there, as for Prometheus)."""
    return f"http://{children.pod_host(group, member)}:{HTTP_PORT}"


def backfill_objects(
    group: Group, member: str, secrets: SecretData, driver_cluster_role: str, stamp: str
) -> list[Obj]:
    """The config Secret (the new member's own config), the driver's RBAC (the audit's)
    and the SparkApplication that seeds ``member``'s cluster, for the join ``stamp``
    (``join_stamp``)."""
    name = backfill_name(group.name, member)
    config, _ = children.sidecar_config(group, member, secrets)
    secret = children.config_secret(group, member, children.render_config(config))
    secret["metadata"] = children._meta(group, name, COMPONENT, member)
    spec: Obj = copy.deepcopy(audit.application_spec(group))
    spec["mainApplicationFile"] = BACKFILL_MAIN
    spec["arguments"] = [
        "--config",
        children.CONFIG_PATH,
        "--timeout",
        str(TIMEOUT_SECONDS),
        *(
            arg
            for other in group.spec.members
            if other.name != member
            for arg in ("--status-url", status_url(group, other.name))
        ),
    ]
    labels = children.labels(group, COMPONENT, member)
    for volume in spec["volumes"]:
        if volume["name"] == "config":
            volume["secret"]["secretName"] = name
        elif volume["name"] == "peer-tls":
            volume["secret"]["secretName"] = children.tls_secret_name(group.name, member)
    for role in ("driver", "executor"):
        spec[role]["labels"] = labels
    meta = children._meta(group, name, COMPONENT, member)
    meta["annotations"] = {JOIN_ANNOTATION: stamp}
    application = {
        "apiVersion": audit.SPARK_API,
        "kind": "SparkApplication",
        "metadata": meta,
        "spec": spec,
    }
    return [*audit.rbac_objects(group, driver_cluster_role), secret, application]


def backfill_stamp(app: Mapping[str, Any]) -> str | None:
    """The join a backfill SparkApplication was made for (``join_stamp``)."""
    value = ((app.get("metadata") or {}).get("annotations") or {}).get(JOIN_ANNOTATION)
    return value if isinstance(value, str) else None


def backfill_member(app: Mapping[str, Any]) -> str | None:
    """The member a backfill SparkApplication seeds (from its labels)."""
    labels = (app.get("metadata") or {}).get("labels") or {}
    value = labels.get(children.MEMBER_LABEL)
    return value if isinstance(value, str) else None
