"""Real Kafka for integration tests: one fleet of three clusters per test session.

Brokers come from ``kdsync.localkafka`` (jars provisioned by ``hack/fetch-kafka``). Their
folders live under ``<repo>/.kdsync-run/kafka/`` (git-ignored); set ``KDSYNC_KEEP_KAFKA=1``
to keep the broker logs after the session (the next session deletes them).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kdsync.localkafka import (
    KafkaDistribution,
    KafkaNotProvisioned,
    LocalKafkaFleet,
    find_distribution,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_RUN_ROOT = REPO_ROOT / ".kdsync-run" / "kafka"
FLEET_CLUSTERS = ("kafka-1", "kafka-2", "kafka-3")


def keep_kafka_logs() -> bool:
    return os.environ.get("KDSYNC_KEEP_KAFKA", "") not in ("", "0", "false")


@pytest.fixture(scope="session")
def kafka_distribution() -> KafkaDistribution:
    """The provisioned Kafka classpath; fails the test with the fix if it is missing."""
    try:
        return find_distribution()
    except KafkaNotProvisioned as error:
        problem = str(error)
    # Outside the except block, so the report shows the hint once, without a traceback.
    pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session")
def kafka_run_root() -> Path:
    """Where fleets keep their folders; tests starting extra fleets should use it too."""
    return KAFKA_RUN_ROOT


@pytest.fixture(scope="session")
def kafka_fleet(kafka_distribution: KafkaDistribution) -> Iterator[LocalKafkaFleet]:
    """Three independent single-node clusters, started once per session, always torn down.

    Tests share it: create topics with :func:`fresh_topic` names and do not change broker
    configuration. A broker a test leaves stopped is restarted after that test. Each
    cluster also holds a small ``kdsync-localkafka-probe`` topic (the readiness check).
    """
    fleet = LocalKafkaFleet(
        FLEET_CLUSTERS,
        run_root=KAFKA_RUN_ROOT,
        distribution=kafka_distribution,
        keep_run_dir=keep_kafka_logs(),
    )
    with fleet:
        yield fleet


@pytest.fixture(autouse=True)
def _restart_stopped_fleet_brokers(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used the shared fleet, bring back any broker it left stopped, so
    one test's crash scenario cannot break the next test."""
    yield
    if "kafka_fleet" not in request.fixturenames:
        return
    fleet: LocalKafkaFleet = request.getfixturevalue("kafka_fleet")
    for broker in fleet:
        if not broker.is_running:
            broker.restart()


@pytest.fixture
def fresh_topic(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """A factory of topic names unique to this test: ``fresh_topic("orders")``."""
    test_part = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name)[:60].strip("-")

    def make(prefix: str = "t") -> str:
        return f"{prefix}-{test_part}-{uuid.uuid4().hex[:8]}"

    return make
