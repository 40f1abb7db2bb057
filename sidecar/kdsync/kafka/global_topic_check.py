"""Holds this member's ``T-global`` topics to the config rule (``global_topic_rule``).

A check lists the cluster's ``T-global`` topics, reads their configs, puts back what the
rule allows with an incremental alter, and reports the rest. Blocking; the runtime runs
one check at a time in a worker thread. A check never raises: a failure (the brokers
away, a request refused) is counted, logged when it starts and when it clears, and the
next check tries again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from confluent_kafka.admin import AdminClient

# Where the classes are defined: confluent_kafka.admin re-exports them without __all__.
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType

from kdsync.kafka.client_config import admin_config
from kdsync.kafka.global_topic_rule import (
    CONFIGS,
    MIN_RETENTION_MS,
    Action,
    Finding,
    global_topics,
    judge_topic,
)

log = logging.getLogger(__name__)

# What a finding came to after the check acted on it (status "action").
FIXED = "fixed"
FIX_FAILED = "fix-failed"


class ConfigCheckObserver(Protocol):
    def drift(self, topic: str, config: str, drifting: bool) -> None:
        """Whether ``config`` of ``topic`` is off the rule after this check."""

    def fixed(self, topic: str, config: str) -> None:
        """``config`` of ``topic`` was put back."""

    def failed(self) -> None:
        """A check failed as a whole."""


class GlobalTopicConfigCheck:
    def __init__(
        self,
        properties: Mapping[str, str],
        suffix: str,
        is_source: Callable[[str], bool],
        wanted_partitions: int,
        observer: ConfigCheckObserver,
        min_retention_ms: Mapping[str, int] | None = None,
        timeout: float = 10.0,  # bounds a check under way when the sidecar stops
    ) -> None:
        self._admin = AdminClient(admin_config(properties))
        self._suffix = suffix
        self._is_source = is_source
        self._wanted_partitions = wanted_partitions
        self._observer = observer
        self._min_retention_ms = dict(min_retention_ms or {})  # topic -> its own floor
        self._timeout = timeout
        self.checks = 0
        self.errors = 0
        self.last_error: str | None = None
        self._checked_at: float | None = None
        self._topics: dict[str, dict[str, dict[str, Any]]] = {}
        self._fixes: dict[tuple[str, str], int] = {}
        self._reported: set[tuple[str, str, str | None]] = set()  # warned, still off the rule

    def run_round(self) -> None:
        try:
            self._check()
        except Exception as exc:  # a broker away must never stop the sidecar
            self.errors += 1
            self._observer.failed()
            if self.last_error is None:
                log.warning("T-global config check failed (retried every round): %s", exc)
            self.last_error = str(exc)
            return
        if self.last_error is not None:
            log.info("T-global config check works again")
            self.last_error = None
        self.checks += 1
        self._checked_at = time.monotonic()

    def _check(self) -> None:
        metadata = self._admin.list_topics(timeout=self._timeout)
        counts = {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None
        }
        names = global_topics(counts, self._suffix, self._is_source)
        configs: dict[str, dict[str, str]] = {}
        if names:
            futures = self._admin.describe_configs(
                [ConfigResource(ResourceType.TOPIC, name) for name in names],
                request_timeout=self._timeout,
            )
            for resource, future in futures.items():
                entries = future.result(timeout=self._timeout)
                configs[resource.name] = {
                    key: entry.value for key, entry in entries.items() if key in CONFIGS
                }
        topics: dict[str, dict[str, dict[str, Any]]] = {}
        reported: set[tuple[str, str, str | None]] = set()
        for name in names:
            findings = judge_topic(
                name,
                configs.get(name, {}),
                counts[name],
                self._wanted_partitions,
                self._min_retention_ms.get(name, MIN_RETENTION_MS),
            )
            outcome = self._fix(name, [f for f in findings if f.action is Action.FIX])
            topics[name] = {}
            for finding in findings:
                action = outcome.get(finding.config, finding.action.value)
                drifting = action in (Action.REPORT.value, FIX_FAILED)
                if drifting:
                    key = (name, finding.config, finding.found)
                    reported.add(key)
                    if key not in self._reported:
                        log.warning(
                            "%s: %s is %s, the rule wants %s; %s",
                            name,
                            finding.config,
                            finding.found,
                            finding.wanted,
                            finding.why if action == Action.REPORT.value else "could not fix it",
                        )
                self._observer.drift(name, finding.config, drifting)
                topics[name][finding.config] = {
                    "wanted": finding.wanted,
                    "found": finding.found,
                    "action": action,
                    **({"why": finding.why} if finding.why else {}),
                }
        still = {(topic, config) for topic, config, _ in reported}
        for topic, config, _ in self._reported - reported:
            if topic not in topics:  # gone: no series left standing at 1
                self._observer.drift(topic, config, False)
            if (topic, config) not in still:  # not merely another wrong value
                log.info("%s: %s follows the T-global config rule again", topic, config)
        self._reported = reported
        self._topics = topics

    def _fix(self, topic: str, fixes: list[Finding]) -> dict[str, str]:
        """Set each finding's ``set_to``; config -> FIXED or FIX_FAILED."""
        if not fixes:
            return {}
        resource = ConfigResource(
            ResourceType.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(f.config, f.set_to, incremental_operation=AlterConfigOpType.SET)
                for f in fixes
            ],
        )
        try:
            for future in self._admin.incremental_alter_configs([resource]).values():
                future.result(timeout=self._timeout)
        except Exception as exc:  # refused (ACLs) or the brokers away: reported as drift
            log.warning("%s: could not put back %s: %s", topic, [f.config for f in fixes], exc)
            return {f.config: FIX_FAILED for f in fixes}
        for f in fixes:
            self._fixes[(topic, f.config)] = self._fixes.get((topic, f.config), 0) + 1
            self._observer.fixed(topic, f.config)
            log.warning(
                "%s: %s was %s, the rule wants %s (%s); set it back to %s",
                topic,
                f.config,
                f.found,
                f.wanted,
                f.why,
                f.set_to,
            )
        return {f.config: FIXED for f in fixes}

    def status(self) -> dict[str, Any]:
        """``globalTopicConfig`` in /status."""
        checked_at = self._checked_at
        topics = self._topics
        drift = sorted(
            f"{topic} {config}={entry['found']} ({entry['action']})"
            for topic, configs in topics.items()
            for config, entry in configs.items()
            if entry["action"] in (Action.REPORT.value, FIX_FAILED)
        )
        fixes: dict[str, dict[str, int]] = {}
        for (topic, config), count in sorted(self._fixes.items()):
            fixes.setdefault(topic, {})[config] = count
        return {
            "checks": self.checks,
            "lastCheckAgoSeconds": None
            if checked_at is None
            else round(time.monotonic() - checked_at, 1),
            "errors": self.errors,
            "lastError": self.last_error,
            "drift": drift,
            "fixes": fixes,
            "topics": topics,
        }
