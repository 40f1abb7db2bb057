"""The traffic generator: one producer per origin cluster, in a child process of its own.

Run as ``python -m kdsync.benchmark.load SPEC.json RESULT.json``. Either as fast as the
producers accept (``rate`` 0: a throughput phase) or paced at ``rate`` events/s per origin
(a latency phase). Producers are librdkafka's defaults with ``acks=all`` in both cases;
how long the origin broker took to acknowledge each event is reported next to the
latency. Each record's timestamp is set by librdkafka when ``produce()`` is called, which
is the origin timestamp the probe measures latency from.

A process of its own, so that producing does not share a GIL with the probe and its CPU is
accounted separately from the systems under test.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Message, Producer

from kdsync.benchmark import payload
from kdsync.benchmark.probe import LatencySummary

# A paced producer releases events in slices of this many seconds.
_PACE_SLICE = 0.002


@dataclass(frozen=True)
class Origin:
    index: int
    bootstrap: str
    topic: str


@dataclass(frozen=True)
class LoadSpec:
    origins: tuple[Origin, ...]
    phase: int
    events_per_origin: int
    event_bytes: int
    rate_per_origin: float  # 0: as fast as possible

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoadSpec:
        origins = tuple(Origin(**o) for o in data["origins"])
        return cls(
            origins,
            int(data["phase"]),
            int(data["events_per_origin"]),
            int(data["event_bytes"]),
            float(data["rate_per_origin"]),
        )


@dataclass(frozen=True)
class LoadResult:
    started_at: float  # wall clock just before the first produce()
    produced_at: float  # after the last produce()
    flushed_at: float  # every record acknowledged (acks=all)
    produced: int
    failed: int
    # From produce() to the origin broker's acknowledgement (acks=all): the part of the
    # end-to-end latency spent getting into the origin topic, before any replication.
    origin_ack: LatencySummary

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoadResult:
        return cls(**{**data, "origin_ack": LatencySummary(**data["origin_ack"])})


def _producer(bootstrap: str, failures: list[int], acks: list[float]) -> Producer:
    def on_delivery(error: object, message: Message) -> None:
        if error is not None:
            failures[0] += 1
        else:
            acks.append(time.time() * 1000.0 - message.timestamp()[1])

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,  # librdkafka's default: the same producer for every phase
            "queue.buffering.max.messages": 500_000,
            "queue.buffering.max.kbytes": 512 * 1024,
            "on_delivery": on_delivery,
        }
    )


def _produce(producer: Producer, topic: str, value: bytes) -> None:
    while True:
        try:
            producer.produce(topic, value)
            return
        except BufferError:
            producer.poll(0.01)  # the local queue is full: let deliveries drain it


def run(spec: LoadSpec) -> LoadResult:
    paced = spec.rate_per_origin > 0
    failures = [0]
    acks: list[float] = []
    producers = [_producer(o.bootstrap, failures, acks) for o in spec.origins]
    for producer in producers:
        producer.list_topics(timeout=30)  # connected before the clock starts
    pad = payload.padding(spec.event_bytes)
    pairs = list(zip(spec.origins, producers, strict=True))
    started = time.time()
    produced = 0
    if not paced:
        for seq in range(spec.events_per_origin):
            for origin, producer in pairs:
                _produce(producer, origin.topic, payload.encode(spec.phase, origin.index, seq, pad))
            if seq % 2000 == 0:
                for producer in producers:
                    producer.poll(0)
        produced = spec.events_per_origin
    else:
        while produced < spec.events_per_origin:
            due = min(
                spec.events_per_origin, int((time.time() - started) * spec.rate_per_origin) + 1
            )
            for seq in range(produced, due):
                for origin, producer in pairs:
                    value = payload.encode(spec.phase, origin.index, seq, pad)
                    _produce(producer, origin.topic, value)
            produced = due
            for producer in producers:
                producer.poll(0)
            time.sleep(_PACE_SLICE)  # pacing the offered load, not synchronisation
    produced_at = time.time()
    unflushed = sum(producer.flush(120) for producer in producers)
    return LoadResult(
        started,
        produced_at,
        time.time(),
        produced * len(pairs),
        failures[0] + unflushed,
        LatencySummary.of(acks),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m kdsync.benchmark.load SPEC.json RESULT.json", file=sys.stderr)
        return 2
    spec = LoadSpec.from_json(json.loads(Path(args[0]).read_text()))
    result = run(spec)
    Path(args[1]).write_text(json.dumps(asdict(result)))
    return 0 if result.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
