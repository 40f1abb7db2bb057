"""Throughput of the wire format codec (run through hack/bench-wire-format).

Encodes and decodes one ``Append`` message (by default 64 entries, each a batch of 100
events with 200-byte values) in a loop on one core, and does the same with pickle as
a reference: pickle is what a codec with no format of its own would cost, so the ratio
shows whether the hand-written format pays for itself.

  hack/bench-wire-format [--seconds 2] [--entries 64] [--events 100] [--value-bytes 200]
                         [--key-bytes 16] [--headers 0]
"""

from __future__ import annotations

import argparse
import gc
import pickle
import sys
import time
from collections.abc import Callable

from kdsync.ordering import Entry, OriginBatch, SourceEvent
from kdsync.ordering.messages import Append, Message
from kdsync.wire_format.messages import decode_message, encode_message


def sample_append(
    entries: int, events: int, value_bytes: int, key_bytes: int, headers: int
) -> Append:
    value = bytes(range(256)) * (value_bytes // 256 + 1)
    log: list[Entry] = []
    offset = 1_000_000
    for index in range(1, entries + 1):
        batch_events = tuple(
            SourceEvent(
                offset + i,
                f"key-{offset + i}".encode().ljust(key_bytes, b".")[:key_bytes],
                value[i % 256 : i % 256 + value_bytes],
                # Distinct objects per event, as read from Kafka: pickle's memo would
                # otherwise store a shared tuple once and flatter it.
                tuple((f"h{j}", b"header-value-%d" % (offset + i)) for j in range(headers)),
                1_700_000_000_000 + offset + i,
            )
            for i in range(events)
        )
        batch = OriginBatch("member-a", "orders", 3, offset, offset + events, False, batch_events)
        log.append(Entry(10_000 + index, 7, batch))
        offset += events
    return Append(7, 10_000, 7, tuple(log), 10_000 + entries, 123_456_789, 10_000)


def rate(work: Callable[[], object], seconds: float) -> float:
    """Calls of ``work`` per second, measured for about ``seconds``."""
    work()  # warm-up
    calls = 0
    gc.disable()
    try:
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            work()
            calls += 1
            now = time.perf_counter()
            if now >= deadline:
                return calls / (now - start)
    finally:
        gc.enable()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--entries", type=int, default=64)
    parser.add_argument("--events", type=int, default=100, help="events per batch")
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--key-bytes", type=int, default=16)
    parser.add_argument("--headers", type=int, default=0, help="headers per event")
    args = parser.parse_args()

    message: Message = sample_append(
        args.entries, args.events, args.value_bytes, args.key_bytes, args.headers
    )
    events = args.entries * args.events
    wire = encode_message(message)
    assert decode_message(wire) == message
    pickled = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    assert pickle.loads(pickled) == message

    print(
        f"Append: {args.entries} entries x {args.events} events, "
        f"{args.key_bytes}-byte keys, {args.value_bytes}-byte values, "
        f"{args.headers} header(s) per event"
    )
    print(f"encoded size: wire {len(wire):,} bytes, pickle {len(pickled):,} bytes")
    print()
    rows = [
        ("wire encode", rate(lambda: encode_message(message), args.seconds), len(wire)),
        ("wire decode", rate(lambda: decode_message(wire), args.seconds), len(wire)),
        ("pickle dumps", rate(lambda: pickle.dumps(message, 5), args.seconds), len(pickled)),
        ("pickle loads", rate(lambda: pickle.loads(pickled), args.seconds), len(pickled)),
    ]
    print(f"{'':<14}{'messages/s':>12}{'events/s':>14}{'MB/s':>10}")
    for name, per_second, size in rows:
        megabytes = per_second * size / 1e6
        print(f"{name:<14}{per_second:>12,.0f}{per_second * events:>14,.0f}{megabytes:>10,.1f}")
    by_name = {name: per_second for name, per_second, _ in rows}
    round_trip = 1 / (1 / by_name["wire encode"] + 1 / by_name["wire decode"])
    pickle_trip = 1 / (1 / by_name["pickle dumps"] + 1 / by_name["pickle loads"])
    print()
    print(
        f"encode+decode: wire {round_trip:,.0f} messages/s ({round_trip * events:,.0f} events/s), "
        f"pickle {pickle_trip:,.0f} messages/s; wire/pickle = {round_trip / pickle_trip:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
