"""Fixtures of the audit's integration tests: one local Spark per session, and empty
replicated groups on the session's Kafka fleet (see ``replicated_group``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from kdsync import naming
from kdsync.audit.session import audit_session
from kdsync.localkafka import LocalKafkaFleet
from tests.integration.audit.replicated_group import MEMBERS, ReplicatedGroup, write_config
from tests.support.plain_kafka import create_topic


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """Local Spark with the cached Kafka connector, started once for every audit test."""
    session = audit_session("local[2]", {"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


@pytest.fixture
def make_group(
    kafka_fleet: LocalKafkaFleet, fresh_topic: Callable[[str], str], tmp_path: Path
) -> Callable[[], ReplicatedGroup]:
    """A factory of empty groups: fresh T and T-global in every member, a config file."""

    def make() -> ReplicatedGroup:
        clusters = kafka_fleet.bootstrap_servers()
        bootstrap = dict(zip(MEMBERS, clusters.values(), strict=True))
        topic = fresh_topic("audit")
        group = f"g{uuid.uuid4().hex[:10]}"
        for address in bootstrap.values():
            create_topic(address, topic)
            create_topic(address, naming.global_topic(topic))
        path = write_config(tmp_path / f"{group}.yaml", group, topic, bootstrap, MEMBERS)
        return ReplicatedGroup(group, topic, bootstrap, path)

    return make
