"""The brokers' own ceiling: Kafka's ProducerPerformance and ConsumerPerformance.

One ProducerPerformance per cluster, all at once, writes fixed-size records as fast as the
broker takes them (acks=all, the Java producer's defaults otherwise); then one
ConsumerPerformance per cluster, all at once, reads them back. The aggregate rate over the
clusters is what the brokers on this machine can absorb or serve while replication costs
nothing: every cross-cluster delivery is at least one record read from one broker and one
record written to another, so deliveries/s can never exceed the smaller of the two.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kdsync.benchmark.children import Child, Finished
from kdsync.benchmark.systems import create_topic, delete_topics
from kdsync.localkafka.distribution import KafkaDistribution

PRODUCER_MAIN = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER_MAIN = "org.apache.kafka.tools.ConsumerPerformance"
# The perf tools' JVM: Kafka's kafka-run-class.sh defaults.
TOOL_JVM_OPTIONS = (
    "-Xmx512M",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)
# "300000 records sent, 31459.7 records/sec (3.00 MB/sec), 605.60 ms avg latency, ..."
_PRODUCER_SUMMARY = re.compile(
    r"^(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency"
    r".*?(\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99\.9th",
    re.MULTILINE,
)

_CONSUMER_ROW = re.compile(
    r"^\d{4}-\d\d-\d\d [\d:]+, \d{4}-\d\d-\d\d [\d:]+(?:, [\d.]+){8}$", re.MULTILINE
)


@dataclass(frozen=True)
class ToolRun:
    cluster: str
    records: int
    records_per_s: float
    cpu_seconds: float
    peak_rss_bytes: int

    @property
    def seconds(self) -> float:
        return self.records / self.records_per_s if self.records_per_s else 0.0


@dataclass(frozen=True)
class CeilingResult:
    event_bytes: int
    clusters: int
    produce: list[ToolRun]
    consume: list[ToolRun]

    @staticmethod
    def _aggregate(runs: list[ToolRun]) -> float:
        # Conservative: all records over the slowest run (the runs overlap, not exactly).
        slowest = max((r.seconds for r in runs), default=0.0)
        return sum(r.records for r in runs) / slowest if slowest else 0.0

    @property
    def produce_per_s(self) -> float:
        return self._aggregate(self.produce)

    @property
    def consume_per_s(self) -> float:
        return self._aggregate(self.consume)

    @property
    def ceiling_per_s(self) -> float:
        return min(self.produce_per_s, self.consume_per_s)


class CeilingError(RuntimeError):
    pass


def _log_text(finished: Finished) -> str:
    return finished.log.read_text(errors="replace")


def _producer_run(cluster: str, finished: Finished) -> ToolRun:
    text = _log_text(finished)
    found = _PRODUCER_SUMMARY.findall(text)
    if finished.returncode != 0 or not found:
        raise CeilingError(f"ProducerPerformance into {cluster} failed; see {finished.log}")
    records, rate = int(found[-1][0]), float(found[-1][1])
    return ToolRun(cluster, records, rate, finished.cpu_seconds, finished.peak_rss_bytes)


def _consumer_run(cluster: str, finished: Finished, expected: int) -> ToolRun:
    # The summary row (after a header line; log lines may come in between):
    # start.time, end.time, MB, MB.sec, nMsg, nMsg.sec, rebalance.ms, fetch.ms, fetch.MB.sec,
    # fetch.nMsg.sec
    rows = _CONSUMER_ROW.findall(_log_text(finished))
    if not rows:
        raise CeilingError(
            f"ConsumerPerformance from {cluster} printed no summary; see {finished.log}"
        )
    fields = [f.strip() for f in rows[-1].split(",")]
    records, fetch_rate = int(fields[4]), float(fields[9])
    if finished.returncode != 0 or records < expected:
        raise CeilingError(
            f"ConsumerPerformance from {cluster} read {records} of {expected}; see {finished.log}"
        )
    # fetch.nMsg.sec: records over the time spent fetching (without the group join).
    return ToolRun(cluster, records, fetch_rate, finished.cpu_seconds, finished.peak_rss_bytes)


def run_ceiling(
    clusters: Mapping[str, str],
    distribution: KafkaDistribution,
    event_bytes: int,
    records_per_cluster: int,
    partitions: int,
    run_dir: Path,
    timeout: float = 600.0,
) -> CeilingResult:
    run_dir.mkdir(parents=True, exist_ok=True)
    topic = f"bench-ceiling-{event_bytes}-{secrets.token_hex(3)}"
    for bootstrap in clusters.values():
        create_topic(bootstrap, topic, partitions)

    producers = {
        name: Child(
            distribution.java_command(
                PRODUCER_MAIN,
                [
                    "--topic", topic,
                    "--num-records", str(records_per_cluster),
                    "--record-size", str(event_bytes),
                    "--throughput", "-1",
                    "--bootstrap-server", bootstrap,
                    "--command-property", "acks=all",
                ],
                jvm_options=TOOL_JVM_OPTIONS,
            ),
            run_dir / f"producer-perf-{event_bytes}-{name}.log",
            run_dir,
        )
        for name, bootstrap in clusters.items()
    }  # fmt: skip
    produce = [_producer_run(n, c.wait(timeout)) for n, c in producers.items()]

    consumers = {
        name: Child(
            distribution.java_command(
                CONSUMER_MAIN,
                [
                    "--bootstrap-server", bootstrap,
                    "--topic", topic,
                    "--num-records", str(records_per_cluster),
                    "--timeout", "60000",
                ],
                jvm_options=TOOL_JVM_OPTIONS,
            ),
            run_dir / f"consumer-perf-{event_bytes}-{name}.log",
            run_dir,
        )
        for name, bootstrap in clusters.items()
    }  # fmt: skip
    consume = [_consumer_run(n, c.wait(timeout), records_per_cluster) for n, c in consumers.items()]

    for bootstrap in clusters.values():
        delete_topics(bootstrap, [topic])
    return CeilingResult(event_bytes, len(clusters), produce, consume)
