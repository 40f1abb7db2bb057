"""Reading a partition back while the event loop is busy (hack/bench-readback).

A sidecar reads its ordering log back (a lagging peer's entries, its own applying), its
ledger and its T-global on a worker thread, while its event loop keeps the GIL busy.
Each call into librdkafka gives up the GIL and must win it back; paid per record, that
wait made a read-back over 100 times slower than on an idle process.

One run, side by side on one local broker (or ``--bootstrap``): the product's
``read_to_end`` (records taken a batch at a time) against a one-``poll``-per-record loop
(how it read before), each with the main thread idle and busy with pure Python work.
Prints records/s and the busy/idle ratio of each, and writes JSON with ``--json``.

  hack/bench-readback [--records 50000] [--value-bytes 300] [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kdsync.kafka.partition_reader import read_to_end, reading_consumer
from kdsync.localkafka import LocalKafkaFleet, find_distribution

Reader = Callable[[Consumer, str, int], int]


def _product(consumer: Consumer, topic: str, end: int) -> int:
    return sum(1 for _ in read_to_end(consumer, topic, 0))


def _per_record(consumer: Consumer, topic: str, end: int) -> int:
    """The reference: one poll per record, as read_to_end did before."""
    consumer.assign([TopicPartition(topic, 0, 0)])
    count = 0
    while count < end:
        message = consumer.poll(1.0)
        if message is None:
            continue
        error = message.error()
        if error is not None and error.code() == KafkaError._PARTITION_EOF:
            break
        count += 1
    consumer.unassign()
    return count


READERS: dict[str, Reader] = {"read_to_end (batches)": _product, "poll per record": _per_record}


def _fill(bootstrap: str, records: int, value_bytes: int) -> str:
    topic = f"bench-readback-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the answer
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    value = b"v" * value_bytes
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=0)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(60):
        sys.exit(f"could not write {records} records to {topic} on {bootstrap}")
    return topic


def _timed(bootstrap: str, topic: str, records: int, reader: Reader, busy: bool) -> float:
    """Seconds to read every record on a worker thread; the main thread spins meanwhile
    when ``busy`` (pure Python work, as an event loop handling frames does)."""
    consumer = reading_consumer({"bootstrap.servers": bootstrap}, "bench", committed_only=False)
    took: list[float] = []
    failed: list[str] = []

    def work() -> None:
        began = time.monotonic()
        try:
            read = reader(consumer, topic, records)
        except Exception as exc:  # reported below, from the main thread
            failed.append(f"{type(exc).__name__}: {exc}")
            return
        if read != records:
            failed.append(f"read {read} of {records} records")
            return
        took.append(time.monotonic() - began)

    try:
        worker = threading.Thread(target=work)
        worker.start()
        while busy and worker.is_alive():
            sum(range(2_000))
        worker.join()
    finally:
        consumer.close()
    if failed or not took:
        sys.exit(f"{reader.__name__} (busy={busy}) failed: {failed}")
    return took[0]


@contextlib.contextmanager
def _broker(bootstrap: str | None) -> Iterator[str]:
    if bootstrap is not None:
        yield bootstrap
        return
    print("starting a local broker ...", file=sys.stderr, flush=True)
    with LocalKafkaFleet(["bench-readback"], distribution=find_distribution()) as fleet:
        yield fleet["bench-readback"].bootstrap_servers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--value-bytes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bootstrap", help="an existing broker (default: start one)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.records < 1 or args.rounds < 1:
        parser.error("--records and --rounds must be at least 1")
    result: dict[str, dict[str, float]] = {}
    with _broker(args.bootstrap) as bootstrap:
        topic = _fill(bootstrap, args.records, args.value_bytes)
        for name, reader in READERS.items():
            for busy in (False, True):
                # Rounds interleaved with nothing else: medians, as the machine is noisy.
                seconds = statistics.median(
                    _timed(bootstrap, topic, args.records, reader, busy) for _ in range(args.rounds)
                )
                result.setdefault(name, {})["busy" if busy else "idle"] = args.records / seconds
    print(f"{args.records} records of {args.value_bytes} B, medians of {args.rounds} rounds")
    print(f"{'reader':<24}{'idle: records/s':>18}{'busy: records/s':>18}{'busy/idle':>11}")
    for name, rates in result.items():
        ratio = rates["busy"] / rates["idle"]
        print(f"{name:<24}{rates['idle']:>18,.0f}{rates['busy']:>18,.0f}{ratio:>10.2f}x")
    batches, single = (result[name]["busy"] for name in READERS)
    print(
        f"with a busy main thread, read_to_end reads {batches / single:.1f}x as fast as "
        "one poll per record"
    )
    if args.json is not None:
        args.json.write_text(json.dumps({"records": args.records, "records_per_s": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
