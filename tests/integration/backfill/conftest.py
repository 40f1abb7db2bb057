"""Fixtures of the backfill's integration tests: one local Spark per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from kdsync.audit.session import audit_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """Local Spark with the cached Kafka connector, started once for every backfill test."""
    session = audit_session("local[2]", {"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()
