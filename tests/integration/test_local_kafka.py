"""The local Kafka launcher gives real, independent, transactional Kafka 4.x clusters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient

from kdsync.localkafka import (
    ClusterSpec,
    KafkaDistribution,
    LocalKafkaFleet,
    ProcessIdentity,
    reap_stale_runs,
)
from tests.support.plain_kafka import (
    CommittedRecord,
    ProduceFailed,
    Record,
    create_topic,
    produce_transactionally,
    read_committed,
)

pytestmark = pytest.mark.kafka

# CreateTime values in the past (brokers reject timestamps more than an hour ahead).
BASE_TIMESTAMP_MS = 1_700_000_000_000


def sample_records(tag: str) -> list[Record]:
    """Records covering what kdsync must carry unchanged: null key, null value (tombstone),
    binary data, repeated and null-valued headers, explicit timestamps, two partitions."""
    return [
        Record(key=f"{tag}-k0".encode(), value=b"v0", timestamp=BASE_TIMESTAMP_MS, partition=0),
        Record(key=None, value=b"no key", timestamp=BASE_TIMESTAMP_MS + 1, partition=1),
        Record(
            key=f"{tag}-tombstone".encode(),
            value=None,
            timestamp=BASE_TIMESTAMP_MS + 2,
            partition=0,
        ),
        Record(
            key=b"\x00\xff binary",
            value=bytes(range(256)),
            headers=(("dup", b"1"), ("dup", b"2"), ("null-header", None), ("empty", b"")),
            timestamp=BASE_TIMESTAMP_MS + 3,
            partition=1,
        ),
        Record(key=None, value=None, timestamp=BASE_TIMESTAMP_MS + 4, partition=0),
    ]


def as_sent(records: list[CommittedRecord]) -> list[Record]:
    return [
        Record(r.key, r.value, r.headers, r.timestamp, r.partition)
        for r in sorted(records, key=lambda r: (r.partition, r.offset))
    ]


def in_partition_order(records: list[Record]) -> list[Record]:
    # Within a partition the log keeps production order; sort is stable.
    return sorted(records, key=lambda r: r.partition or 0)


def cluster_id(bootstrap: str) -> str:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    return str(metadata.cluster_id)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def test_fleet_runs_three_independent_kafka_clusters(kafka_fleet: LocalKafkaFleet) -> None:
    bootstraps = kafka_fleet.bootstrap_servers()
    assert list(bootstraps) == ["kafka-1", "kafka-2", "kafka-3"]
    assert len(set(bootstraps.values())) == 3
    # Independent clusters: each serves the data folder formatted with its own cluster id.
    ids = {broker.name: cluster_id(broker.bootstrap_servers) for broker in kafka_fleet}
    assert len(set(ids.values())) == 3
    for broker in kafka_fleet:
        assert ids[broker.name] == (broker.work_dir / "cluster.id").read_text().strip()
    for broker in kafka_fleet:
        identity = broker.process_identity
        assert identity is not None and identity.is_alive()


def test_transactional_records_read_back_identical_on_each_cluster(
    kafka_fleet: LocalKafkaFleet, fresh_topic: Callable[[str], str]
) -> None:
    for broker in kafka_fleet:
        topic = fresh_topic(broker.name)
        create_topic(broker.bootstrap_servers, topic, partitions=2)
        sent = sample_records(broker.name)

        produce_transactionally(broker.bootstrap_servers, topic, sent, f"writer-{topic}")

        committed = read_committed(broker.bootstrap_servers, topic)
        assert as_sent(committed) == in_partition_order(sent), broker.name


def test_aborted_transaction_is_not_visible_to_read_committed(
    kafka_fleet: LocalKafkaFleet, fresh_topic: Callable[[str], str]
) -> None:
    bootstrap = kafka_fleet["kafka-1"].bootstrap_servers
    topic = fresh_topic("abort")
    create_topic(bootstrap, topic)
    before = [Record(key=b"before", value=b"committed", timestamp=BASE_TIMESTAMP_MS)]
    aborted = [Record(key=b"aborted", value=b"never visible", timestamp=BASE_TIMESTAMP_MS + 1)]
    after = [Record(key=b"after", value=b"committed", timestamp=BASE_TIMESTAMP_MS + 2)]

    produce_transactionally(bootstrap, topic, before, f"writer-{topic}")
    produce_transactionally(bootstrap, topic, aborted, f"writer-{topic}", abort=True)
    produce_transactionally(bootstrap, topic, after, f"writer-{topic}")

    committed = read_committed(bootstrap, topic)
    assert [(r.key, r.value) for r in committed] == [
        (b"before", b"committed"),
        (b"after", b"committed"),
    ]
    # The aborted records are in the log (offsets were used), just not visible.
    assert committed[1].offset > committed[0].offset + 1


def test_killed_broker_restarts_with_its_committed_data(
    kafka_fleet: LocalKafkaFleet, fresh_topic: Callable[[str], str]
) -> None:
    broker = kafka_fleet["kafka-2"]
    topic = fresh_topic("crash")
    create_topic(broker.bootstrap_servers, topic, partitions=2)
    first = sample_records("before-crash")
    produce_transactionally(broker.bootstrap_servers, topic, first, f"writer-{topic}")
    committed_before = read_committed(broker.bootstrap_servers, topic)
    old_process = broker.process_identity
    old_ports = broker.ports
    assert old_process is not None

    broker.kill()
    assert not old_process.is_alive()
    assert not broker.is_running

    broker.restart(timeout=90)

    assert broker.ports == old_ports, "clients keep the same bootstrap address"
    assert broker.process_identity not in (None, old_process)
    assert read_committed(broker.bootstrap_servers, topic) == committed_before
    # The same transactional id works again (the new epoch fences the old producer).
    second = [Record(key=b"after-crash", value=b"v", timestamp=BASE_TIMESTAMP_MS, partition=1)]
    produce_transactionally(broker.bootstrap_servers, topic, second, f"writer-{topic}")
    committed_after = read_committed(broker.bootstrap_servers, topic)
    assert as_sent(committed_after) == in_partition_order(first + second)


def test_extra_fleet_with_override_limits_only_itself_and_closes_cleanly(
    kafka_fleet: LocalKafkaFleet,
    kafka_distribution: KafkaDistribution,
    kafka_run_root: Path,
    fresh_topic: Callable[[str], str],
) -> None:
    big = Record(key=b"big", value=b"x" * 16_384, timestamp=BASE_TIMESTAMP_MS)
    small_limit = ClusterSpec("small-messages", {"message.max.bytes": 4096})
    limited = LocalKafkaFleet(
        [small_limit], run_root=kafka_run_root, distribution=kafka_distribution
    )
    with limited:
        limited_bootstrap = limited["small-messages"].bootstrap_servers
        processes = limited.process_identities()
        run_dir = limited.run_dir
        topic = fresh_topic("limit")
        create_topic(limited_bootstrap, topic)

        with pytest.raises(ProduceFailed) as rejected:
            produce_transactionally(limited_bootstrap, topic, [big], f"writer-{topic}")
        assert KafkaError.MSG_SIZE_TOO_LARGE in rejected.value.codes
        assert read_committed(limited_bootstrap, topic) == []

    # Leaving the block stopped the fleet: no broker process, no folder left behind.
    assert processes and not any(p.is_alive() for p in processes.values())
    assert limited.pids() == {}
    assert not run_dir.exists()

    # The same record is fine on a cluster with default settings.
    default_bootstrap = kafka_fleet["kafka-1"].bootstrap_servers
    create_topic(default_bootstrap, topic)
    produce_transactionally(default_bootstrap, topic, [big], f"writer-{topic}")
    assert [r.value for r in read_committed(default_bootstrap, topic)] == [big.value]


CHILD_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from kdsync.localkafka import LocalKafkaFleet
    fleet = LocalKafkaFleet(["orphan"], run_root=Path(sys.argv[1])).start()
    print(json.dumps({
        "pid": fleet["orphan"].pid,
        "start_ticks": fleet["orphan"].process_identity.start_ticks,
        "run_dir": str(fleet.run_dir),
    }), flush=True)
    sys.stdin.read()  # wait to be killed
    """
)


def test_brokers_die_when_their_python_process_is_killed(
    kafka_distribution: KafkaDistribution, kafka_run_root: Path
) -> None:
    env = {**os.environ, "KDSYNC_KAFKA_LIBS": str(kafka_distribution.libs_dir)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_SCRIPT, str(kafka_run_root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, "the child process failed to start a fleet"
        started = json.loads(line)
        broker = ProcessIdentity(started["pid"], started["start_ticks"])
        assert broker.is_alive()

        child.send_signal(signal.SIGKILL)  # no atexit, no finally: only the kernel helps
        child.wait(timeout=30)

        wait_until(lambda: not broker.is_alive(), 30, "the orphaned broker to die")
        # The next fleet start removes what the dead session left on disk.
        assert Path(started["run_dir"]) in reap_stale_runs(kafka_run_root)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
