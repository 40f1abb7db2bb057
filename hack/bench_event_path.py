"""CPU per event on the sidecar's hot path, without Kafka or a network (hack/bench-event-path).

One process plays every step a replicated event goes through in a member, with the
production code for each:

  read      source records become ``SourceEvent``s (the source reader's
            ``events_by_partition``, fed ready-made records instead of a consumer's)
  encode    the batch is encoded for the peers and the log topic (``wire_format``)
  decode    a peer decodes it from the received ``Append``
  apply     the delivery ledger assigns sequence numbers (``ordering.ledger``)
  observe   the sidecar's metrics for the delivered events (``runtime.observer``)
  produce   ``GlobalWriter.write`` builds each T-global record and calls librdkafka's
            ``produce`` (a real client, non-transactional, with no broker: records queue
            in librdkafka and are purged between rounds, so only the client's call counts)

It prints microseconds of CPU per event for each step and their sum. Compare two trees
side by side (ratios, the machine is noisy) with e.g.
``farm-bench`` running ``hack/bench-event-path`` in each checkout.

  hack/bench-event-path [--events 200000] [--batch 500] [--value-bytes 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from kdsync.kafka.global_writer import GlobalWriter
from kdsync.kafka.source_reader import events_by_partition
from kdsync.ordering import DeliveryLedger, Entry, OriginBatch
from kdsync.runtime.latency_window import LatencyWindow
from kdsync.runtime.metrics import SidecarMetrics
from kdsync.runtime.mirror_metrics import MirrorMetrics
from kdsync.runtime.observer import SidecarObserver
from kdsync.wire_format.batches import put_batch, take_batch


class _Record:
    """What the source reader gets from confluent-kafka, reduced to the calls it makes."""

    __slots__ = ("_headers", "_key", "_offset", "_value")

    def __init__(self, offset: int, key: bytes | None, value: bytes, headers: list[Any]) -> None:
        self._offset, self._key, self._value, self._headers = offset, key, value, headers

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[Any]:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)


class _NoBrokerProducer:
    """A real librdkafka producer whose transaction calls do nothing (there is no broker)."""

    def __init__(self) -> None:
        self._producer = Producer(
            {
                "bootstrap.servers": "127.0.0.1:9",
                "queue.buffering.max.messages": 10_000_000,
                "queue.buffering.max.kbytes": 2_000_000,
                "log_level": 0,
            }
        )
        self.produce: Callable[..., None] = self._producer.produce

    def begin_transaction(self) -> None:
        pass

    def commit_transaction(self, _timeout: float) -> None:
        self._producer.purge()

    def poll(self, timeout: float) -> int:
        return int(self._producer.poll(timeout))


def _records(count: int, value_bytes: int, seed: int) -> list[_Record]:
    rng = random.Random(seed)
    value = bytes(rng.getrandbits(8) for _ in range(value_bytes))
    return [
        _Record(offset, f"k{offset % 97}".encode(), value, [("trace", b"t%d" % offset)])
        for offset in range(count)
    ]


def _read(records: list[_Record], batch_size: int, origin: str) -> list[OriginBatch]:
    batches = []
    for first in range(0, len(records), batch_size):
        chunk: list[Any] = records[first : first + batch_size]
        by_partition, _ = events_by_partition(chunk)
        events = by_partition[("orders", 0)]
        end = events[-1].offset + 1
        batches.append(OriginBatch(origin, "orders", 0, first, end, first == 0, tuple(events)))
    return batches


def run_round(args: argparse.Namespace, seed: int) -> dict[str, float]:
    records = _records(args.events, args.value_bytes, seed)
    cpu = time.process_time
    seconds: dict[str, float] = {}

    started = cpu()
    batches = _read(records, args.batch, "us-east")
    seconds["read"] = cpu() - started

    started = cpu()
    encoded = []
    for batch in batches:
        parts: list[bytes] = []
        put_batch(parts, batch)
        encoded.append(b"".join(parts))
    seconds["encode"] = cpu() - started

    started = cpu()
    decoded = [take_batch(data, 0)[0] for data in encoded]
    seconds["decode"] = cpu() - started

    started = cpu()
    ledger = DeliveryLedger()
    deliveries = [ledger.apply(Entry(i + 1, 1, b)) for i, b in enumerate(decoded)]
    seconds["apply"] = cpu() - started

    metrics = SidecarMetrics()
    mirror = MirrorMetrics(metrics.registry, "eu-west", "kdsync-bench.heartbeats")
    observer = SidecarObserver(metrics, LatencyWindow(), mirror, "eu-west")
    state = ledger.snapshot()
    started = cpu()
    step = 20  # deliveries per transaction, as the driver groups them
    for first in range(0, len(deliveries), step):
        observer.delivered(deliveries[first : first + step], state)
    seconds["observe"] = cpu() - started

    writer = GlobalWriter.__new__(GlobalWriter)
    writer._producer = _NoBrokerProducer()  # type: ignore[assignment]
    writer._errors = []
    writer._ledger_topic = "kdsync-bench.ledger.internal"
    writer._global_topic = lambda topic: f"{topic}-global"
    writer._global_partitions = lambda _topic: 1
    writer._timeout = 10.0
    # The T-global history check runs every few seconds, not per event; with no broker
    # it would only time out.
    writer._check_history = lambda *_args: None  # type: ignore[method-assign]
    started = cpu()
    for first in range(0, len(deliveries), step):
        writer.write(deliveries[first : first + step], state)
    seconds["produce"] = cpu() - started
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=500, help="events per origin batch")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3, help="the best round is reported")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    best: dict[str, float] = {}
    for round_ in range(args.rounds):
        for step, spent in run_round(args, round_).items():
            best[step] = min(best.get(step, spent), spent)
    per_event = {step: spent / args.events * 1e6 for step, spent in best.items()}
    per_event["total"] = sum(per_event.values())
    if args.json:
        print(json.dumps(per_event))
    else:
        print(f"{args.events:,} events, {args.batch} per batch, {args.value_bytes}-byte values")
        for step, micros in per_event.items():
            print(f"  {step:8s} {micros:6.2f} us of CPU per event")
    return 0


if __name__ == "__main__":
    sys.exit(main())
