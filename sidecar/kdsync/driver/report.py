"""What a member reports about itself: readiness, lag and the ``/status`` document.

Pure functions of the driver's and the node's state, so the sidecar's HTTP endpoints,
its metrics and the simulator all judge a member the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kdsync.driver.member_driver import MemberDriver
from kdsync.ordering import Role

# A member is caught up (ready) when it has applied all but this many committed entries.
READY_LAG_ENTRIES = 256


def readiness(phase: str, driver: MemberDriver | None) -> tuple[bool, list[str]]:
    """Ready = running, in a majority view, following a leader, caught up, not halted."""
    if driver is None or phase != "running":
        return False, [f"phase {phase}"]
    node = driver.node
    state = driver.state
    reasons: list[str] = []
    status = node.status()
    view = node.view()
    config = node.config
    quorum = config.quorum
    if status.role == Role.RECOVERING:
        reasons.append("witness still recovering its state from the other members")
    if not node.in_majority():
        reasons.append(
            f"not in touch with a majority: hears {len(view)} of {len(config.voters)} voting "
            f"member(s) (a majority is {quorum}) and no live leader"
        )
    if status.leader is None:
        reasons.append("no leader known")
    if state.halted:
        reasons.append(f"delivery halted: {state.halted}")
    if node.ledger is not None:
        lag = node.known_commit - state.durable_applied
        if lag > READY_LAG_ENTRIES:
            reasons.append(f"catching up: {lag} committed entries not yet applied")
    if state.fatal:
        reasons.append(state.fatal)
    return not reasons, reasons


def member_lag(driver: MemberDriver) -> dict[str, int]:
    """Log entries each member is behind: every peer's on a leader, our own everywhere."""
    node = driver.node
    status = node.status()
    lag: dict[str, int] = {}
    if status.role == Role.LEADER:
        for peer, match in node.peer_match().items():
            lag[peer] = max(0, status.last_index - match)
    applied = driver.state.durable_applied if node.ledger is not None else status.commit_index
    lag[node.member] = max(0, node.known_commit - applied)
    return lag


def node_section(driver: MemberDriver) -> dict[str, Any]:
    """The ordering part of ``/status``."""
    node = driver.node
    status = node.status()
    return {
        "role": status.role.value,
        "term": status.term,
        "leader": status.leader,
        "view": sorted(node.view()),
        "members": list(node.config.members),
        "configuration": configuration_section(driver),
        "commitIndex": status.commit_index,
        "knownCommit": node.known_commit,
        "appliedIndex": driver.state.durable_applied,
        # Every data member stored the log up to here: no ordering log is trimmed past it,
        # so a backfill point for a new member must not be below it (kdsync.backfill).
        "allDurable": node.all_durable,
        # Where this member's log topic started when it did (a restart forgets allDurable;
        # the trims it made before are below this): the backfill point must not be below.
        "trimmedBelow": node.trimmed_below,
        "memberLag": member_lag(driver),
        "pendingEvents": driver.pending_events,
        # What ordering.maxLogBytes bounds: log entries held in memory, read-backs included.
        "logMemoryBytes": node.log_memory_bytes(),
        # Own batches on their way into the order, and whether reading waits for room.
        "outboxBatches": node.outbox_size(),
        "sourceHeld": driver.source_held,
    }


def configuration_section(driver: MemberDriver) -> dict[str, Any]:
    """The configuration in force at this member: who votes, who learns, where it was
    appended (0: the startup file's), and whether this member knows it committed."""
    node = driver.node
    return {
        **node.config.as_json(),
        "index": node.config_index,
        "committed": node.config_index <= node.status().commit_index,
    }


def delivery_section(driver: MemberDriver | None) -> Mapping[str, Any]:
    """The delivery part of ``/status`` (empty before the driver exists)."""
    if driver is None:
        return {"eventsIn": 0, "eventsOut": 0, "transactions": 0, "deliveredSeq": {}}
    state = driver.state
    return {
        "halted": state.halted,
        "lastDeliveryError": state.last_delivery_error,
        "eventsIn": state.events_in,
        "eventsOut": state.events_out,
        "transactions": state.transactions,
        "deliveredSeq": dict(state.delivered_seq),
    }
