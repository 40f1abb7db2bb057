"""Sidecar groups against the session's Kafka fleet.

Every test gets fresh topic names and a fresh group name (so nothing it leaves in the
shared clusters, internal topics and consumer groups included, is seen by another test);
its sidecars run in the test's tmp dir and are stopped after it. When a test fails, the
tail of every sidecar's log is attached to the report.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from kdsync.local_group import LocalSidecarGroup
from kdsync.localkafka import LocalKafkaFleet
from tests.integration.sidecar.harness import PARTITIONS
from tests.support.plain_kafka import create_topic

pytestmark = pytest.mark.kafka

# Data members and the fleet's clusters they own.
MEMBER_CLUSTERS = {"m1": "kafka-1", "m2": "kafka-2", "m3": "kafka-3"}

_GROUPS_ATTR = "_kdsync_sidecar_groups"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when == "call" and report.failed:
        for group in getattr(item, _GROUPS_ATTR, []):
            for name in group.members:
                report.sections.append(
                    (f"sidecar {group.group}/{name} log tail", group.log_tail(name, 60))
                )


def group_name(tag: str) -> str:
    """A fresh group name: lower-case, short (kdsync/naming.py allows 40 characters)."""
    return f"it-{tag[:20]}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def bootstrap(kafka_fleet: LocalKafkaFleet) -> dict[str, str]:
    """Data member -> bootstrap servers of its cluster."""
    servers = kafka_fleet.bootstrap_servers()
    return {member: servers[cluster] for member, cluster in MEMBER_CLUSTERS.items()}


@pytest.fixture
def source_topic(fresh_topic: Callable[[str], str], bootstrap: dict[str, str]) -> str:
    """A fresh ``T`` with several partitions in every cluster."""
    topic = fresh_topic("src")[:120]
    for servers in bootstrap.values():
        create_topic(servers, topic, PARTITIONS)
    return topic


@pytest.fixture
def sidecar_group(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., LocalSidecarGroup]]:
    """Factory of LocalSidecarGroups for this test; all stopped afterwards."""
    groups: list[LocalSidecarGroup] = []
    setattr(request.node, _GROUPS_ATTR, groups)

    def make(
        tag: str,
        clusters: Mapping[str, str],
        topic: str,
        *,
        witnesses: Sequence[str] = (),
        global_partitions: int = 1,
        ordering: Mapping[str, Any] | None = None,
        topics: Mapping[str, Any] | None = None,
        group_offset_sync: Mapping[str, Any] | None = None,
    ) -> LocalSidecarGroup:
        """``topics`` replaces the topics section (``topic`` is then ignored)."""
        name = group_name(tag)
        group = LocalSidecarGroup(
            name,
            clusters,
            tmp_path / name,
            witnesses=witnesses,
            topics=dict(topics or {"names": [topic], "globalPartitions": global_partitions}),
            ordering=dict(ordering or {"tickMs": 20}),
            group_offset_sync=group_offset_sync,
        )
        groups.append(group)
        return group

    yield make
    for group in groups:
        group.close()
