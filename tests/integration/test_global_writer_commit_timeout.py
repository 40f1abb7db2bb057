"""A T-global commit that times out while the broker does not answer completes once it
answers again, and the writer goes on (a real broker, paused with SIGSTOP).

The hour-long fault campaign found the opposite: after a broker kill under load the
commit timed out, the writer aborted, librdkafka refused the abort (the commit was still
under way) and that member never committed again.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from kdsync import naming
from kdsync.kafka.global_writer import CommitResult, GlobalWriter
from kdsync.localkafka import KafkaDistribution, LocalKafkaFleet
from kdsync.ordering import LedgerState
from tests.support.plain_kafka import create_topic, read_committed

pytestmark = pytest.mark.kafka


def test_a_commit_that_times_out_completes_when_the_broker_is_back(
    kafka_distribution: KafkaDistribution,
    kafka_run_root: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="kdsync.kafka.global_writer")
    group = f"g{uuid.uuid4().hex[:8]}"
    with LocalKafkaFleet(
        ["paused"], run_root=kafka_run_root, distribution=kafka_distribution
    ) as fleet:
        bootstrap = fleet["paused"].bootstrap_servers
        create_topic(bootstrap, naming.ledger_topic(group))
        writer = GlobalWriter(
            {"bootstrap.servers": bootstrap},
            group,
            "m1",
            lambda topic: f"{topic}-global",
            lambda topic: 1,
            timeout=3.0,
        )
        try:
            writer.start()
            writer.write([], LedgerState(applied_index=1))
            pid = fleet.pids()["paused"]
            outcome: list[CommitResult | BaseException] = []

            def write() -> None:
                try:
                    outcome.append(writer.write([], LedgerState(applied_index=2)))
                except BaseException as exc:  # reported to the test thread
                    outcome.append(exc)

            os.kill(pid, signal.SIGSTOP)
            try:
                thread = threading.Thread(target=write, daemon=True)
                thread.start()
                deadline = time.monotonic() + 60
                while "is taking long" not in caplog.text and not outcome:
                    assert time.monotonic() < deadline, "the commit never timed out"
                    time.sleep(0.1)  # polling a condition with a deadline
            finally:
                os.kill(pid, signal.SIGCONT)
            thread.join(timeout=90)
            assert outcome and isinstance(outcome[0], CommitResult), outcome
            assert "is taking long" in caplog.text
            assert "aborting a transaction failed" not in caplog.text
            # The producer is not wedged: the next transaction commits as usual.
            writer.write([], LedgerState(applied_index=3))
        finally:
            writer.close()
        ledgers = read_committed(bootstrap, naming.ledger_topic(group))
        assert len(ledgers) == 3, ledgers  # each transaction committed, once
