"""Helpers for the sidecar tests: traffic into origin topics, and the independent check.

Traffic is produced with a plain confluent-kafka producer; the check reads every
``T-global`` and every origin ``T`` with :mod:`kdsync.verification.replica_check`, which
uses confluent-kafka only (none of the sidecar's reading or writing code).
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from kdsync import naming
from kdsync.local_group import LocalSidecarGroup
from kdsync.verification.replica_check import (
    CheckResult,
    SourceRecord,
    TopicFollower,
    check_group,
    global_order,
)

PARTITIONS = 3
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


@dataclass
class Traffic:
    """Producers writing concurrently into every origin's ``T`` (one thread each)."""

    bootstrap: Mapping[str, str]  # origin member -> bootstrap servers
    topic: str
    rate_per_origin: float | None = None  # events/s; None: as fast as possible
    count_per_origin: int | None = None  # stop after this many; None: until stop()
    big_every: int = 0  # every n-th event is ~900 KiB (0: none)
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
            assert not thread.is_alive(), "a producer did not finish in time"
        assert not self.errors, f"producing failed: {self.errors[:3]}"
        return dict(self.acked)

    @property
    def total(self) -> int:
        return sum(self.acked.values())


class GlobalWatch:
    """Follows each member's ``T-global`` (read_committed), counting its events."""

    def __init__(self, bootstrap: Mapping[str, str], global_topic: str) -> None:
        self.followers = {m: TopicFollower(b, global_topic) for m, b in bootstrap.items()}

    def count(self, member: str) -> int:
        follower = self.followers[member]
        follower.poll(0.2)
        return len(follower.records)

    def close(self) -> None:
        for follower in self.followers.values():
            follower.close()


def start_watched(
    group: LocalSidecarGroup, clusters: Mapping[str, str], source_topic: str
) -> tuple[str, GlobalWatch]:
    """Start every sidecar of ``group``, wait until all are ready, and follow each data
    member's ``T-global``. Returns the global topic's name and the watch."""
    global_topic = naming.global_topic(source_topic)
    group.start()
    group.wait_ready(timeout=90)
    return global_topic, GlobalWatch(clusters, global_topic)


def wait_for(
    what: str,
    condition: Callable[[], bool],
    timeout: float,
    describe: Callable[[], str] = lambda: "",
    interval: float = 0.25,
) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` (and ``describe()``) after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}. {describe()}")
        time.sleep(interval)  # polling interval of a condition with a deadline


def brief_status(group: LocalSidecarGroup) -> str:
    out: dict[str, Any] = {}
    for name in group.members:
        status = group.status(name)
        if status is None:
            out[name] = "no answer" if group.members[name].running else "not running"
            continue
        out[name] = {
            k: status.get(k)
            for k in ("phase", "role", "ready", "notReadyReasons", "deliveredSeq", "halted")
        }
    return json.dumps(out)


def verify_group(
    group: LocalSidecarGroup,
    bootstrap: Mapping[str, str],
    topic: str,
    global_topic: str,
    produced: Mapping[str, int],
    *,
    timeout: float = 120.0,
    watch: GlobalWatch | None = None,
    global_partitions: int = 1,
) -> CheckResult:
    """Wait until every ``T-global`` holds every produced event, then run the checker.

    ``bootstrap`` maps each data member to its cluster; ``produced`` the events written to
    each origin's ``T``. Asserts the check passes; returns its result.
    """
    own_watch = watch is None
    watch = watch or GlobalWatch(bootstrap, global_topic)
    expected = sum(produced.values())
    origins = {m: TopicFollower(b, topic) for m, b in bootstrap.items()}
    try:

        def everyone_has_all() -> bool:
            return all(watch.count(m) >= expected for m in bootstrap)

        wait_for(
            f"{expected} events in every {global_topic}",
            everyone_has_all,
            timeout,
            lambda: (
                "counts "
                + json.dumps({m: len(f.records) for m, f in watch.followers.items()})
                + "; status "
                + brief_status(group)
            ),
        )
        # Each topic is read to the end offsets it has now: anything late (a duplicate
        # would show up as an extra event) is read as well, and nothing is cut short.
        for member, follower in origins.items():
            follower.read_to_end(60)
            assert len(follower.records) >= produced[member], (
                f"{member}'s {topic} holds {len(follower.records)} of {produced[member]} events"
            )
        for follower in watch.followers.values():
            follower.read_to_end(60)
        globals_by_member = {m: global_order(f.records) for m, f in watch.followers.items()}
        by_coordinates: dict[str, dict[tuple[int, int], SourceRecord]] = {
            m: {(p, o): r for p, o, r in f.records} for m, f in origins.items()
        }
        result = check_group(topic, globals_by_member, by_coordinates)
        assert result.ok, "checker found problems:\n" + "\n".join(result.problems)
        assert result.events == expected, f"{result.events} events, {expected} produced"
        for member, rows in globals_by_member.items():
            for row in rows:
                _, _, partition, _ = row.coordinates
                assert row.partition == partition % global_partitions, (
                    f"{member}: seq {row.seq} from origin partition {partition} is in "
                    f"T-global partition {row.partition}, expected {partition % global_partitions}"
                )
        return result
    finally:
        for follower in origins.values():
            follower.close()
        if own_watch:
            watch.close()


def http_get(address: str, path: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def latency_figures(group: LocalSidecarGroup, names: Sequence[str]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for name in names:
        status = group.status(name) or {}
        figures[name] = {
            "latencyMs": status.get("latencyMs"),
            "eventsOut": status.get("eventsOut"),
            "transactions": status.get("transactions"),
        }
    return figures
