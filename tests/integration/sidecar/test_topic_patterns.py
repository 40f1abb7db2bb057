"""Topic patterns against real brokers (#15): a topic created while the group runs that
matches an ``include`` pattern is replicated without a restart, exactly once; a
``-global`` topic that the pattern also matches is never picked up as a source."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient

from kdsync import naming
from kdsync.local_group import LocalSidecarGroup
from tests.integration.sidecar.harness import PARTITIONS, Traffic, verify_group
from tests.support.plain_kafka import create_topic

pytestmark = pytest.mark.kafka


def topics_in(servers: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": servers}).list_topics(timeout=30).topics)


def test_a_topic_created_later_is_replicated_and_global_topics_never_are(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    fresh_topic: Callable[[str], str],
) -> None:
    prefix = fresh_topic("pat")[:100]
    first, later = f"{prefix}.first", f"{prefix}.later"
    for servers in bootstrap.values():
        create_topic(servers, first, PARTITIONS)
    group = sidecar_group(
        "patterns", bootstrap, first, topics={"include": [re.escape(prefix) + r"\..*"]}
    )
    group.start()
    group.wait_ready(timeout=90)
    pids = {name: member.process.pid for name, member in group.members.items() if member.process}

    produced = Traffic(bootstrap, first, count_per_origin=100).start().join()
    verify_group(group, bootstrap, first, naming.global_topic(first), produced)

    # Created while the group runs; `first-global` (matched by the pattern too) exists.
    for servers in bootstrap.values():
        create_topic(servers, later, PARTITIONS)
    produced = Traffic(bootstrap, later, count_per_origin=100).start().join()
    verify_group(group, bootstrap, later, naming.global_topic(later), produced)

    assert {n: m.process.pid for n, m in group.members.items() if m.process} == pids, (
        "a sidecar restarted"
    )
    for member, servers in bootstrap.items():
        looped = {t for t in topics_in(servers) if t.endswith("-global-global")}
        assert not looped, f"{member}: a T-global was replicated as a source: {looped}"
