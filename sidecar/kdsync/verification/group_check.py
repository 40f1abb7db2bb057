"""Wait until every member's ``T-global`` holds what was produced, then check the group.

The live counterpart of :func:`kdsync.verification.replica_check.check_group`: it follows
each ``T-global`` (read_committed) while the group catches up, then reads every topic to
its end and checks agreement, exactly-once, no loss, origin order and fidelity. Used by
the integration tests and the fault campaigns.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping

from kdsync.verification.replica_check import (
    CheckResult,
    SourceRecord,
    TopicFollower,
    check_group,
    global_order,
)


class VerificationFailed(AssertionError):
    """The group broke a promise (or the check could not finish); the message says which."""


class WaitTimeout(AssertionError):
    """A condition did not hold before its deadline."""


class GlobalWatch:
    """Follows each member's ``T-global`` (read_committed), counting its events."""

    def __init__(
        self,
        bootstrap: Mapping[str, str],
        global_topic: str,
        client_properties: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """``client_properties``: member -> extra librdkafka properties (security)."""
        extra = client_properties or {}
        self.followers = {
            m: TopicFollower(b, global_topic, properties=extra.get(m)) for m, b in bootstrap.items()
        }

    def count(self, member: str) -> int:
        follower = self.followers[member]
        follower.poll(0.2)
        return len(follower.records)

    def close(self) -> None:
        for follower in self.followers.values():
            follower.close()


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
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}. {describe()}")
        time.sleep(interval)  # polling interval of a condition with a deadline


def verify_group(
    bootstrap: Mapping[str, str],
    topic: str,
    global_topic: str,
    produced: Mapping[str, int],
    *,
    timeout: float = 120.0,
    watch: GlobalWatch | None = None,
    global_partitions: int = 1,
    describe_status: Callable[[], str] = lambda: "",
    client_properties: Mapping[str, Mapping[str, str]] | None = None,
    replicas: Collection[str] | None = None,
) -> CheckResult:
    """Wait until every ``T-global`` holds every produced event, then run the checker.

    ``bootstrap`` maps each data member to its cluster; ``produced`` the events written to
    each origin's ``T``. Raises :class:`VerificationFailed` unless the check passes;
    returns its result.
    ``describe_status`` adds the members' state to a timeout's message;
    ``client_properties`` (member -> librdkafka properties) reaches secured clusters;
    ``replicas``, the members whose ``T-global`` is checked (default: all of
    ``bootstrap``; a member removed from the group is still an origin, not a replica).
    """
    extra = client_properties or {}
    own_watch = watch is None
    held = {m: b for m, b in bootstrap.items() if replicas is None or m in replicas}
    watch = watch or GlobalWatch(held, global_topic, extra)
    expected = sum(produced.values())
    origins = {m: TopicFollower(b, topic, properties=extra.get(m)) for m, b in bootstrap.items()}
    try:

        def everyone_has_all() -> bool:
            return all(watch.count(m) >= expected for m in held)

        wait_for(
            f"{expected} events in every {global_topic}",
            everyone_has_all,
            timeout,
            lambda: (
                "counts "
                + json.dumps({m: len(f.records) for m, f in watch.followers.items()})
                + "; status "
                + describe_status()
            ),
        )
        # Each topic is read to the end offsets it has now: anything late (a duplicate
        # would show up as an extra event) is read as well, and nothing is cut short.
        for member, follower in origins.items():
            follower.read_to_end(60)
            if len(follower.records) < produced[member]:
                raise VerificationFailed(
                    f"{member}'s {topic} holds {len(follower.records)} of {produced[member]} events"
                )
        for follower in watch.followers.values():
            follower.read_to_end(60)
        globals_by_member = {m: global_order(f.records) for m, f in watch.followers.items()}
        by_coordinates: dict[str, dict[tuple[int, int], SourceRecord]] = {
            m: {(p, o): r for p, o, r in f.records} for m, f in origins.items()
        }
        result = check_group(topic, globals_by_member, by_coordinates)
        if not result.ok:
            raise VerificationFailed("checker found problems:\n" + "\n".join(result.problems))
        if result.events != expected:
            raise VerificationFailed(f"{result.events} events, {expected} produced")
        for member, rows in globals_by_member.items():
            for row in rows:
                _, _, partition, _ = row.coordinates
                if row.partition != partition % global_partitions:
                    raise VerificationFailed(
                        f"{member}: seq {row.seq} from origin partition {partition} is in "
                        f"T-global partition {row.partition}, "
                        f"expected {partition % global_partitions}"
                    )
        return result
    finally:
        for follower in origins.values():
            follower.close()
        if own_watch:
            watch.close()
