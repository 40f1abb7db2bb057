"""The benchmark probe stamps a record visible when it became readable, not when a read
window closed: its latencies are the systems' own, with no wait of the probe's in them.

The consumer here is scripted on a simulated clock and keeps librdkafka's rules: ``poll``
returns as soon as a record is readable, a batch ``consume`` with a timeout returns early
only once it holds all of ``num_messages``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from kdsync.benchmark import payload
from kdsync.benchmark.probe import Destination, ProbeSpec, _Follower

_TOPIC = "remote.events"
_SYSTEM_LATENCY = 0.005  # from the origin timestamp to readable, in every scripted record


@dataclass
class _Record:
    readable_at: float
    timestamp_ms: int
    tagged_value: bytes

    def value(self) -> bytes:
        return self.tagged_value

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return _TOPIC

    def timestamp(self) -> tuple[int, int]:
        return (1, self.timestamp_ms)


class _ScriptedConsumer:
    def __init__(self, records: list[_Record]) -> None:
        self.now = 0.0
        self._calls = 0
        self._waiting = sorted(records, key=lambda r: r.readable_at)

    def clock(self) -> float:
        return self.now

    def _take(self, limit: int) -> list[_Record]:
        readable = [r for r in self._waiting if r.readable_at <= self.now][:limit]
        self._waiting = self._waiting[len(readable) :]
        return readable

    def poll(self, timeout: float) -> _Record | None:
        self._calls += 1
        assert self._calls < 10_000, "the probe reads without ever waiting"
        if not self._take_ready() and self._waiting:
            self.now = min(self.now + timeout, self._waiting[0].readable_at)
        elif not self._waiting:
            self.now += timeout
        taken = self._take(1)
        return taken[0] if taken else None

    def _take_ready(self) -> bool:
        return bool(self._waiting) and self._waiting[0].readable_at <= self.now

    def consume(self, num_messages: int, timeout: float) -> list[_Record]:
        self._calls += 1
        assert self._calls < 10_000, "the probe reads without ever waiting"
        taken = self._take(num_messages)
        if len(taken) < num_messages and timeout > 0:
            deadline = self.now + timeout
            # librdkafka waits for the whole batch or the timeout, whichever comes first.
            while len(taken) < num_messages and self._waiting:
                next_at = self._waiting[0].readable_at
                if next_at > deadline:
                    break
                self.now = max(self.now, next_at)
                taken += self._take(num_messages - len(taken))
            if len(taken) < num_messages:
                self.now = deadline
        return taken

    def close(self) -> None:
        pass


def _spec(events: int) -> ProbeSpec:
    return ProbeSpec(
        destinations=(Destination("b", "unused:9092", (_TOPIC,), local_origin=1),),
        origins=(0, 1),
        phase=7,
        events_per_origin=events,
        deadline_seconds=60.0,
        ready_file="unused",
        grace_seconds=0.0,
    )


def _records(readable_at: list[float]) -> list[_Record]:
    pad = payload.padding(100)
    return [
        _Record(
            readable_at=at,
            timestamp_ms=round((at - _SYSTEM_LATENCY) * 1000),
            tagged_value=payload.encode(7, 0, seq, pad),
        )
        for seq, at in enumerate(readable_at)
    ]


def _follow(readable_at: list[float]) -> Any:
    consumer = _ScriptedConsumer(_records(readable_at))
    spec = _spec(len(readable_at))
    follower = _Follower(
        spec.destinations[0],
        spec,
        consumer=consumer,  # type: ignore[arg-type]
        clock=consumer.clock,
    )
    follower.run(threading.Event(), deadline=60.0)
    assert follower.error is None
    return follower.finish()


def test_sparse_records_are_timed_when_they_become_readable() -> None:
    # One record every 130 ms: a probe that waits out a 100 ms read window would add up to
    # 100 ms to each.
    result = _follow([0.05 + 0.13 * i for i in range(20)])
    assert result.delivered == 20
    assert result.latency.max_ms is not None
    assert result.latency.max_ms <= _SYSTEM_LATENCY * 1000 + 1


def test_a_burst_read_together_keeps_each_records_own_latency() -> None:
    # Ten records readable at once, then ten more 40 ms later: read in two reads, each
    # record timed from its own timestamp.
    result = _follow([0.2] * 10 + [0.24] * 10)
    assert result.delivered == 20
    assert result.duplicates == 0
    assert result.latency.max_ms is not None
    assert result.latency.max_ms <= _SYSTEM_LATENCY * 1000 + 1
