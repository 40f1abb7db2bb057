"""The external probe: one read_committed consumer per destination cluster.

Run as ``python -m kdsync.benchmark.probe SPEC.json RESULT.json``. It positions every
consumer at the current end of the destination topics, writes the spec's ``ready_file``,
and then, for each event of its phase that a destination makes visible, notes whether it
was already seen there (exactly once) and how long after its origin timestamp it became
visible (latency). It finishes when every destination holds every event of every *other*
origin, or at the deadline, and writes per-destination counts, completion times and
latency percentiles.

kdsync also writes each member's own events into its own ``T-global``; those local copies
are counted separately and are not deliveries: for both systems a delivery is an event
that reached a cluster other than its origin.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from kdsync.benchmark import payload
from kdsync.kafka.partition_reader import read_available

PERCENTILES = (50.0, 99.0, 99.9)


@dataclass(frozen=True)
class Destination:
    name: str
    bootstrap: str
    topics: tuple[str, ...]
    # The index of this cluster's own origin: its events here are not deliveries (kdsync
    # writes them into the local T-global too; they are counted as local copies).
    local_origin: int | None


@dataclass(frozen=True)
class ProbeSpec:
    destinations: tuple[Destination, ...]
    origins: tuple[int, ...]
    phase: int
    events_per_origin: int
    deadline_seconds: float
    ready_file: str
    # After the last expected event, keep reading this long to catch late duplicates.
    grace_seconds: float = 0.3

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbeSpec:
        destinations = tuple(
            Destination(d["name"], d["bootstrap"], tuple(d["topics"]), d["local_origin"])
            for d in data["destinations"]
        )
        return cls(
            destinations,
            tuple(int(o) for o in data["origins"]),
            int(data["phase"]),
            int(data["events_per_origin"]),
            float(data["deadline_seconds"]),
            str(data["ready_file"]),
            float(data.get("grace_seconds", 0.3)),
        )


@dataclass
class LatencySummary:
    count: int = 0
    mean_ms: float | None = None
    percentiles_ms: dict[str, float] = field(default_factory=dict)
    max_ms: float | None = None

    @classmethod
    def of(cls, samples: Sequence[float]) -> LatencySummary:
        if not samples:
            return cls()
        ordered = sorted(samples)
        return cls(
            count=len(ordered),
            mean_ms=sum(ordered) / len(ordered),
            percentiles_ms={_label(p): percentile(ordered, p) for p in PERCENTILES},
            max_ms=ordered[-1],
        )


def _label(p: float) -> str:
    return f"p{p:g}"


def percentile(ordered: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of sorted samples."""
    rank = max(1, -(-len(ordered) * p // 100))  # ceil(n * p / 100)
    return ordered[int(rank) - 1]


@dataclass
class DestinationResult:
    name: str
    expected: int
    delivered: int = 0  # distinct remote events seen
    duplicates: int = 0
    local_copies: int = 0
    first_at: float | None = None
    complete_at: float | None = None
    missing_by_origin: dict[str, int] = field(default_factory=dict)
    latency: LatencySummary = field(default_factory=LatencySummary)


@dataclass
class ProbeResult:
    destinations: list[DestinationResult]
    latency: LatencySummary  # every remote delivery of every destination
    complete: bool
    error: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbeResult:
        def summary(d: dict[str, Any]) -> LatencySummary:
            return LatencySummary(**d)

        destinations = [
            DestinationResult(**{**d, "latency": summary(d["latency"])})
            for d in data["destinations"]
        ]
        return cls(destinations, summary(data["latency"]), data["complete"], data["error"])


class _Follower:
    """Reads one destination cluster and keeps its tallies (touched by one thread only)."""

    def __init__(
        self,
        destination: Destination,
        spec: ProbeSpec,
        consumer: Consumer | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``consumer`` and ``clock`` are for tests: a scripted consumer and its clock."""
        self.destination = destination
        self.spec = spec
        self.remote = [o for o in spec.origins if o != destination.local_origin]
        self.seen = {o: bytearray(spec.events_per_origin) for o in self.remote}
        self.result = DestinationResult(
            destination.name, expected=len(self.remote) * spec.events_per_origin
        )
        self.latencies: list[float] = []
        self.error: str | None = None
        self.pending: list[str] = []  # destination topics that do not exist yet
        self._clock = clock
        self.consumer = consumer or Consumer(
            {
                "bootstrap.servers": destination.bootstrap,
                "group.id": f"kdsync-bench-probe-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 20,
                "enable.partition.eof": False,
            }
        )

    def _partitions(self, topic: str) -> list[int] | None:
        metadata = self.consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            return None
        return sorted(metadata.partitions)

    def position_at_end(self) -> None:
        """Assign every partition of the destination topics at its current end.

        A topic that does not exist yet (kdsync creates ``T-global`` on first delivery,
        MirrorMaker its remote topics when its flows start) is assigned from its beginning
        once it appears: everything in it is then newer than the probe.
        """
        assignment: list[TopicPartition] = []
        for topic in self.destination.topics:
            partitions = self._partitions(topic)
            if partitions is None:
                self.pending.append(topic)
                continue
            for partition in partitions:
                tp = TopicPartition(topic, partition)
                _, high = self.consumer.get_watermark_offsets(tp, timeout=10, cached=False)
                assignment.append(TopicPartition(topic, partition, high))
        self.consumer.incremental_assign(assignment)

    def _assign_new_topics(self) -> None:
        for topic in list(self.pending):
            partitions = self._partitions(topic)
            if partitions is not None:
                self.consumer.incremental_assign(
                    [TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions]
                )
                self.pending.remove(topic)

    def run(self, stop: threading.Event, deadline: float) -> None:
        try:
            self._run(stop, deadline)
        except Exception as exc:  # reported in the result, not lost in a thread
            self.error = f"{self.destination.name}: {exc!r}"
        finally:
            self.consumer.close()

    def _run(self, stop: threading.Event, deadline: float) -> None:
        clock = self._clock
        phase = self.spec.phase
        local = self.destination.local_origin
        result = self.result
        done_until: float | None = None
        next_topic_check = 0.0
        while not stop.is_set() and clock() < deadline:
            if done_until is not None and clock() >= done_until:
                return
            if self.pending and time.monotonic() >= next_topic_check:
                self._assign_new_topics()
                next_topic_check = time.monotonic() + 0.2
            # Timed when readable: a batch consume with a timeout would wait it out and
            # add up to 100 ms to every latency measured, for every system.
            batch = read_available(self.consumer, wait_seconds=0.1, max_records=10_000)
            if not batch:
                continue
            now_ms = clock() * 1000.0
            for message in batch:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"reading {message.topic()}: {error}")
                tag = payload.decode(message.value())
                if tag is None or tag.phase != phase:
                    continue
                if tag.origin == local:
                    result.local_copies += 1
                    continue
                seen = self.seen.get(tag.origin)
                if seen is None or tag.seq >= len(seen):
                    raise RuntimeError(f"unexpected event {tag} in {self.destination.name}")
                if seen[tag.seq]:
                    result.duplicates += 1
                    continue
                seen[tag.seq] = 1
                result.delivered += 1
                self.latencies.append(now_ms - message.timestamp()[1])
            if result.first_at is None and result.delivered:
                result.first_at = now_ms / 1000.0
            if result.complete_at is None and result.delivered >= result.expected:
                result.complete_at = now_ms / 1000.0
            # kdsync also writes a member's own events into its T-global, in the global
            # order: some may still follow the last remote one (more so on a loaded
            # machine), and they are counted too. A system that writes none stops at once.
            local_done = not result.local_copies or (
                result.local_copies >= self.spec.events_per_origin
            )
            if result.complete_at is not None and done_until is None and local_done:
                done_until = clock() + self.spec.grace_seconds

    def finish(self) -> DestinationResult:
        result = self.result
        result.missing_by_origin = {
            str(o): len(s) - sum(s) for o, s in self.seen.items() if sum(s) < len(s)
        }
        result.latency = LatencySummary.of(self.latencies)
        return result


def run(spec: ProbeSpec) -> ProbeResult:
    followers = [_Follower(d, spec) for d in spec.destinations]
    for follower in followers:
        follower.position_at_end()  # explicit offsets: fixed before anything is produced
    Path(spec.ready_file).write_text("ready\n")
    stop = threading.Event()
    deadline = time.time() + spec.deadline_seconds
    threads = [
        threading.Thread(target=f.run, args=(stop, deadline), name=f"probe-{f.destination.name}")
        for f in followers
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results = [f.finish() for f in followers]
    errors = [f.error for f in followers if f.error]
    everything = [x for f in followers for x in f.latencies]
    return ProbeResult(
        destinations=results,
        latency=LatencySummary.of(everything),
        complete=all(r.delivered >= r.expected for r in results) and not errors,
        error="; ".join(errors) or None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m kdsync.benchmark.probe SPEC.json RESULT.json", file=sys.stderr)
        return 2
    spec = ProbeSpec.from_json(json.loads(Path(args[0]).read_text()))
    result = run(spec)
    Path(args[1]).write_text(json.dumps(asdict(result)))
    return 0 if result.complete else 1


if __name__ == "__main__":
    sys.exit(main())
