"""Replication while sidecars crash, a broker restarts, or a member stays away
(issue #4, second "Must show"). Traffic runs at a steady rate while the faults happen;
afterwards the independent checker must find every ``T-global`` identical, every event
exactly once, in origin order, with fidelity intact."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from kdsync.local_group import LocalSidecarGroup
from kdsync.localkafka import LocalKafkaFleet
from tests.integration.sidecar.conftest import MEMBER_CLUSTERS
from tests.integration.sidecar.harness import (
    GlobalWatch,
    Traffic,
    brief_status,
    start_watched,
    verify_group,
    wait_for,
)

pytestmark = pytest.mark.kafka

RATE = 150  # events/s per origin while faults happen


def _grows(
    watch: GlobalWatch,
    group: LocalSidecarGroup,
    members: list[str],
    by: int,
    timeout: float,
    unless_stopped: str | None = None,
) -> None:
    """Wait until each of ``members``' T-global has ``by`` more events than now, or, if
    ``unless_stopped`` names a member, until that member's sidecar has stopped."""
    start = {m: watch.count(m) for m in members}
    stopped = unless_stopped
    wait_for(
        f"T-global of {members} to grow by {by}"
        + (f", or {stopped}'s sidecar to stop" if stopped else ""),
        lambda: (
            all(watch.count(m) >= start[m] + by for m in members)
            or (stopped is not None and not group.members[stopped].running)
        ),
        timeout,
        lambda: f"from {start}; status {brief_status(group)}",
    )


def test_sidecars_killed_again_and_again(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    """SIGKILL a sidecar mid-traffic, several rounds, a different member each time; each
    comes back and recovers from its own cluster."""
    group = sidecar_group("kill", bootstrap, source_topic)
    global_topic, watch = start_watched(group, bootstrap, source_topic)
    traffic = Traffic(bootstrap, source_topic, rate_per_origin=RATE, big_every=700).start()
    try:
        _grows(watch, group, list(bootstrap), 200, 60)
        for victim in ("m2", "m1", "m3", "m2"):
            group.kill(victim)
            others = [m for m in bootstrap if m != victim]
            _grows(watch, group, others, 150, 60)
            group.start_member(victim)
            group.wait_ready(timeout=90, names=[victim])
    finally:
        produced = traffic.stop()
    verify_group(group, bootstrap, source_topic, global_topic, produced, watch=watch)
    watch.close()


def test_broker_restart_during_traffic(
    sidecar_group: Callable[..., LocalSidecarGroup],
    kafka_fleet: LocalKafkaFleet,
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    """One member's broker restarts under traffic; its sidecar rides it out and the group
    ends consistent. A broker away for longer than the sidecar waits for a log write
    (60 s: on a loaded machine a restart can take that long) makes the sidecar stop on
    purpose, saying so; then it is started again as its pod would be."""
    group = sidecar_group("broker", bootstrap, source_topic)
    global_topic, watch = start_watched(group, bootstrap, source_topic)
    traffic = Traffic(bootstrap, source_topic, rate_per_origin=RATE).start()
    try:
        _grows(watch, group, list(bootstrap), 200, 60)
        went_down = time.monotonic()
        kafka_fleet[MEMBER_CLUSTERS["m2"]].restart()
        _grows(watch, group, list(bootstrap), 200, 90, unless_stopped="m2")
        if not group.members["m2"].running:
            # The whole log: the line may be followed by the clients' shutdown noise.
            log = group.members["m2"].log_path.read_text(errors="replace")
            assert "could not store the ordering log" in log, log[-20_000:]
            assert time.monotonic() - went_down >= 55, "m2 stopped before its 60 s write limit"
            group.start_member("m2")
            group.wait_ready(timeout=90, names=["m2"])
            _grows(watch, group, list(bootstrap), 200, 90)
    finally:
        produced = traffic.stop()
    assert group.members["m2"].running, "m2's sidecar died when its broker restarted"
    verify_group(group, bootstrap, source_topic, global_topic, produced, watch=watch)
    watch.close()


def test_member_down_for_a_while_others_continue_then_it_catches_up(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    group = sidecar_group("away", bootstrap, source_topic)
    global_topic, watch = start_watched(group, bootstrap, source_topic)
    traffic = Traffic(bootstrap, source_topic, rate_per_origin=RATE).start()
    try:
        _grows(watch, group, list(bootstrap), 100, 60)
        group.kill("m3")
        away_since = time.monotonic()
        # The other two keep replicating (their own events: m3's origin is not read).
        _grows(watch, group, ["m1", "m2"], 1500, 90)
        away_for = time.monotonic() - away_since
        group.start_member("m3")
        group.wait_ready(timeout=120, names=["m3"])
    finally:
        produced = traffic.stop()
    print(f"\nm3 was away for {away_for:.1f}s")
    verify_group(group, bootstrap, source_topic, global_topic, produced, watch=watch)
    watch.close()
