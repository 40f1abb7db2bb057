"""Steady traffic into every origin ``T``: a plain confluent-kafka producer per origin.

Shared by the integration tests and the fault campaigns (:mod:`kdsync.chaos`). The events
mix keys, null keys, tombstones, duplicate and null headers and binary values, so the
check downstream also proves fidelity.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

PARTITIONS = 3  # of each origin T the traffic spreads over
BIG_VALUE_BYTES = 900 * 1024  # under the brokers' default 1 MiB per batch


def event_record(origin: str, index: int, big: bool = False) -> dict[str, Any]:
    """Keyword arguments of ``Producer.produce`` for the ``index``-th event of ``origin``:
    a mix of keys, null keys, tombstones, headers (duplicates, None values) and binary."""
    key: bytes | None = None if index % 5 == 4 else f"{origin}-k{index % 37}".encode()
    value: bytes | None
    if big:
        value = (f"{origin}-big-{index}-".encode() + os.urandom(16)) * (BIG_VALUE_BYTES // 32)
        value = value[:BIG_VALUE_BYTES]
    elif index % 7 == 6:
        value = None  # tombstone
    elif index % 3 == 1:
        value = bytes([index % 256, 0, 255]) + os.urandom(24)  # binary, NUL bytes included
    else:
        value = f"{origin}-v{index}".encode()
    headers: list[tuple[str, bytes | None]] = []
    if index % 2 == 0:
        headers = [
            ("trace", f"{origin}-{index}".encode()),
            ("dup", b"first"),
            ("dup", b"second"),
            ("nothing", None),
            ("bin", b"\x00\xff\x01"),
        ]
    elif index % 11 == 0:
        headers = [("kdsync.seq", b"the user's own, not kdsync's")]
    return {
        "key": key,
        "value": value,
        "headers": headers or None,
        "partition": index % PARTITIONS,
    }


class TrafficError(AssertionError):
    """Producing failed: a record was refused or never acknowledged."""


@dataclass
class Traffic:
    """Producers writing concurrently into every origin's ``T`` (one thread each)."""

    bootstrap: Mapping[str, str]  # origin member -> bootstrap servers
    topic: str
    rate_per_origin: float | None = None  # events/s; None: as fast as possible
    count_per_origin: int | None = None  # stop after this many; None: until stop()
    big_every: int = 0  # every n-th event is ~900 KiB (0: none)
    # origin member -> extra librdkafka properties (security.protocol, sasl.*, ssl.*)
    client_properties: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    acked: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Traffic:
        for origin in self.bootstrap:
            self.acked[origin] = 0
            thread = threading.Thread(target=self._run, args=(origin,), daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def _run(self, origin: str) -> None:
        producer = Producer(
            {
                **self.client_properties.get(origin, {}),
                "bootstrap.servers": self.bootstrap[origin],
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
            }
        )
        lock = threading.Lock()

        def on_delivery(error: KafkaError | None, _message: Message) -> None:
            with lock:
                if error is None:
                    self.acked[origin] += 1
                else:
                    self.errors.append(f"{origin}: {error}")

        started = time.monotonic()
        index = 0
        while not self._stop.is_set():
            if self.count_per_origin is not None and index >= self.count_per_origin:
                break
            if self.rate_per_origin is not None:
                due = started + index / self.rate_per_origin
                wait = due - time.monotonic()
                if wait > 0:
                    # pacing of the producer, not synchronisation
                    self._stop.wait(min(wait, 0.5))
                    continue
            big = self.big_every > 0 and index % self.big_every == self.big_every - 1
            record = event_record(origin, index, big)
            while True:
                try:
                    producer.produce(self.topic, on_delivery=on_delivery, **record)
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
            index += 1
        remaining = producer.flush(120)
        if remaining:
            self.errors.append(f"{origin}: {remaining} record(s) never acknowledged")

    def stop(self, timeout: float = 150.0) -> dict[str, int]:
        """Stop producing, wait for every acknowledgement; the events per origin."""
        self._stop.set()
        return self.join(timeout)

    def join(self, timeout: float = 150.0) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))
            if thread.is_alive():
                raise TrafficError("a producer did not finish in time")
        if self.errors:
            raise TrafficError(f"producing failed: {self.errors[:3]}")
        return dict(self.acked)

    @property
    def total(self) -> int:
        return sum(self.acked.values())
