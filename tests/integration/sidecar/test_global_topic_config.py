"""T-global config drift made on purpose (#15 item 4): reported, and fixed where the rule
allows (docs/sidecar.md, "T-global configs").

On one member's T-global: compaction, a size limit and a 3-day retention are set by hand,
and a partition is added. The sidecar puts compaction and the size limit back and reports
them fixed; the shorter retention (an operator's choice that leaves no holes) and the
partition count are reported as drift and never altered; replication goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

# Where the classes are defined: confluent_kafka.admin re-exports them without __all__.
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewPartitions
from prometheus_client.parser import text_string_to_metric_families

from kdsync import naming
from kdsync.local_group import LocalSidecarGroup
from tests.integration.sidecar.harness import (
    Traffic,
    brief_status,
    http_get,
    start_with_traffic,
    verify_group,
    wait_for,
)

pytestmark = pytest.mark.kafka

_THREE_DAYS_MS = str(3 * 24 * 3600 * 1000)


def _configs(admin: AdminClient, topic: str) -> dict[str, str]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=30)
    return {name: entry.value for name, entry in entries.items()}


def _drift_on_purpose(admin: AdminClient, topic: str) -> None:
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in (
                ("cleanup.policy", "compact"),
                ("retention.bytes", "1073741824"),
                ("retention.ms", _THREE_DAYS_MS),
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    admin.create_partitions([NewPartitions(topic, 2)])[topic].result(timeout=30)


def _section(group: LocalSidecarGroup, member: str) -> dict[str, Any]:
    return dict((group.status(member) or {}).get("globalTopicConfig") or {})


def test_config_drift_is_reported_and_fixed_where_the_rule_allows(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    global_topic = naming.global_topic(source_topic)
    group = sidecar_group("topicconfig", bootstrap, source_topic)
    before = start_with_traffic(group, bootstrap, source_topic, 100)
    # Every member has checked its T-global and found it as the rule wants.
    wait_for(
        "every member to check its T-global configs",
        lambda: all(global_topic in _section(group, m).get("topics", {}) for m in bootstrap),
        timeout=90,
        describe=lambda: brief_status(group),
    )
    for member in bootstrap:
        assert _section(group, member)["drift"] == [], _section(group, member)

    admin = AdminClient({"bootstrap.servers": bootstrap["m2"]})
    _drift_on_purpose(admin, global_topic)

    def reported() -> bool:
        section = _section(group, "m2")
        fixes = section.get("fixes", {}).get(global_topic, {})
        drift = section.get("drift", [])
        return (
            {"cleanup.policy", "retention.bytes"} <= set(fixes)
            and f"{global_topic} partitions=2 (report-only)" in drift
            and f"{global_topic} retention.ms={_THREE_DAYS_MS} (report-only)" in drift
        )

    # One check every 30 s: the drift is seen and fixed within two.
    wait_for(
        "m2 to fix its configs and report the partition count",
        reported,
        timeout=90,
        describe=lambda: str(_section(group, "m2")),
    )
    configs = _configs(admin, global_topic)
    assert configs["cleanup.policy"] == "delete"
    assert configs["retention.bytes"] == "-1"
    assert configs["retention.ms"] == _THREE_DAYS_MS  # the operator's choice stands
    metadata = admin.list_topics(global_topic, timeout=30)
    assert len(metadata.topics[global_topic].partitions) == 2  # never altered by kdsync

    _, metrics = http_get(group.members["m2"].http, "/metrics")
    samples = {
        (sample.name, sample.labels.get("topic"), sample.labels.get("config")): sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if "global_topic_config" in sample.name
    }
    drift = "kdsync_global_topic_config_drift"
    assert samples.get((drift, global_topic, "partitions")) == 1.0, samples
    assert samples.get((drift, global_topic, "retention.ms")) == 1.0, samples
    assert samples.get((drift, global_topic, "cleanup.policy")) == 0.0, samples
    fixes = "kdsync_global_topic_config_fixes_total"
    assert (samples.get((fixes, global_topic, "cleanup.policy")) or 0) >= 1, samples
    assert (samples.get((fixes, global_topic, "retention.bytes")) or 0) >= 1, samples
    warnings = [line for line in group.log_tail("m2", 400).splitlines() if "WARNING" in line]
    assert any("cleanup.policy" in w and "compact" in w for w in warnings), warnings
    assert any("partitions" in w and global_topic in w for w in warnings), warnings
    for member in ("m1", "m3"):  # the others' T-global were not touched
        assert _section(group, member)["drift"] == []

    # Replication goes on: the running sidecar keeps writing the partition it wrote.
    after = Traffic(bootstrap, source_topic, count_per_origin=100).start().join()
    produced = {m: before[m] + after[m] for m in before}
    verify_group(group, bootstrap, source_topic, global_topic, produced)
