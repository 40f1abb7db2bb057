"""Helpers for the sidecar tests: traffic into origin topics, and the independent check.

Traffic (:mod:`kdsync.verification.traffic`) is produced with a plain confluent-kafka
producer; the check (:mod:`kdsync.verification.group_check`) reads every ``T-global`` and
every origin ``T`` with :mod:`kdsync.verification.replica_check`, which uses
confluent-kafka only (none of the sidecar's reading or writing code). Both live in the
package so the fault campaigns (:mod:`kdsync.chaos`) use the same code.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from kdsync import naming
from kdsync.local_group import LocalSidecarGroup
from kdsync.transport.identity import MemberTlsFiles
from kdsync.verification.group_check import GlobalWatch, wait_for
from kdsync.verification.group_check import verify_group as check_and_verify
from kdsync.verification.replica_check import CheckResult
from kdsync.verification.traffic import BIG_VALUE_BYTES, PARTITIONS, Traffic, event_record

__all__ = [
    "BIG_VALUE_BYTES",
    "PARTITIONS",
    "GlobalWatch",
    "Traffic",
    "brief_status",
    "event_record",
    "http_get",
    "latency_figures",
    "member_tls_files",
    "start_watched",
    "start_with_traffic",
    "verify_group",
    "wait_for",
    "wait_for_exactly",
]


def start_watched(
    group: LocalSidecarGroup, clusters: Mapping[str, str], source_topic: str
) -> tuple[str, GlobalWatch]:
    """Start every sidecar of ``group``, wait until all are ready, and follow each data
    member's ``T-global``. Returns the global topic's name and the watch."""
    global_topic = naming.global_topic(source_topic)
    group.start()
    group.wait_ready(timeout=90)
    return global_topic, GlobalWatch(clusters, global_topic)


def start_with_traffic(
    group: LocalSidecarGroup,
    clusters: Mapping[str, str],
    source_topic: str,
    count_per_origin: int,
) -> dict[str, int]:
    """Start every sidecar of ``group``, wait until all are ready, produce
    ``count_per_origin`` events into each origin and check the group replicated them
    (the healthy start most fault tests begin from). Returns the events per origin."""
    group.start()
    group.wait_ready(timeout=90)
    produced = Traffic(clusters, source_topic, count_per_origin=count_per_origin).start().join()
    verify_group(group, clusters, source_topic, naming.global_topic(source_topic), produced)
    return produced


def brief_status(group: LocalSidecarGroup) -> str:
    out: dict[str, Any] = {}
    for name in group.members:
        status = group.status(name)
        if status is None:
            out[name] = "no answer" if group.members[name].running else "not running"
            continue
        out[name] = {
            k: status.get(k)
            for k in (
                *("phase", "role", "ready", "notReadyReasons", "deliveredSeq", "halted"),
                # Where an origin's events wait, when they stop arriving.
                *("eventsIn", "outboxBatches", "sourceHeld", "sourceQueued"),
                "sourceReadAgoSeconds",
            )
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
    client_properties: Mapping[str, Mapping[str, str]] | None = None,
    replicas: Collection[str] | None = None,
) -> CheckResult:
    """:func:`kdsync.verification.group_check.verify_group`, with ``group``'s state in a
    timeout's message."""
    return check_and_verify(
        bootstrap,
        topic,
        global_topic,
        produced,
        timeout=timeout,
        watch=watch,
        global_partitions=global_partitions,
        describe_status=lambda: brief_status(group),
        client_properties=client_properties,
        replicas=replicas,
    )


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


def member_tls_files(config_path: Path) -> MemberTlsFiles:
    """The CA, certificate and key a member's sidecar config names."""
    tls = yaml.safe_load(config_path.read_text())["tls"]
    return MemberTlsFiles(ca_cert=Path(tls["ca"]), cert=Path(tls["cert"]), key=Path(tls["key"]))


def wait_for_exactly(
    group: LocalSidecarGroup, clusters: Mapping[str, str], global_topic: str, expected: int
) -> GlobalWatch:
    """Wait until every member's ``T-global`` holds ``expected`` events, then read each to
    its end and require exactly that many. Returns the (closed) watch, whose followers
    still hold what they read."""
    watch = GlobalWatch(clusters, global_topic)
    try:
        wait_for(
            f"{expected} events in every {global_topic}",
            lambda: all(watch.count(m) >= expected for m in clusters),
            timeout=120,
            describe=lambda: brief_status(group),
        )
        for member, follower in watch.followers.items():
            follower.read_to_end(60)
            assert len(follower.records) == expected, (member, len(follower.records))
    finally:
        watch.close()
    return watch
