"""Continuous group offset sync: keep selected consumer groups of ``T-global`` in step.

The sidecar of member B runs :meth:`GroupOffsetSync.run_round` every
``groupOffsetSync.intervalSeconds`` (in a worker thread: every call here blocks). A round
lists the selected groups in every other data member A, translates each group's
committed offsets from A onto B exactly (``service.translate_group``), reads the group's
offsets and members in B last (so the plan sees B as fresh as possible), and writes what
``sync_plan.plan_group`` allows: forward only, never while the group is active in B,
never past what B has delivered. It writes into B only: every member pulls into itself.

Nothing here raises out of a round: a failure is counted by kind, logged the first time
it happens (and when it clears), and the next round tries again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from kdsync.config import SidecarConfig
from kdsync.failover.kafka_io import ClusterClients
from kdsync.failover.service import FailoverRefused, translate_group
from kdsync.failover.sync_plan import GroupPlan, Partition, Skip, plan_group
from kdsync.failover.translation import GroupTranslation, Outcome
from kdsync.kafka.errors import KafkaUnavailable
from kdsync.record_format import RecordFormatError

log = logging.getLogger(__name__)

# Seconds per Kafka request in a round: short, so a member that is away costs a round
# little (its groups are synced again by the next round that reaches it).
REQUEST_TIMEOUT = 10.0
# A group's exact translation from a member, unchanged there, is reused this long.
CACHE_SECONDS = 60.0


class SyncObserver(Protocol):
    """Where a round's outcome goes (the runtime's metrics)."""

    def written(self, group: str, offsets: int, delays: list[float]) -> None: ...

    def failed(self, kind: str) -> None: ...

    def round_done(self, seconds: float, groups: int, in_step: int) -> None: ...


@dataclass
class SyncState:
    """What /status shows: counts since start and the last round's picture."""

    rounds: int = 0
    offsets_written: int = 0
    last_round_at: float | None = None  # monotonic, end of the last completed round
    last_round_seconds: float = 0.0
    max_round_seconds: float = 0.0
    translated: int = 0  # group translations made afresh (not from the cache) since start
    groups: int = 0
    in_step: int = 0
    waiting: dict[str, list[str]] = field(default_factory=dict)  # group -> "t[p]: why"
    errors: dict[str, int] = field(default_factory=dict)
    last_error: str | None = None


@dataclass(frozen=True)
class _Cached:
    committed: Mapping[Partition, int]  # the group's offsets in A it was made from
    translation: GroupTranslation
    made_at: float  # monotonic
    kept_in_target: frozenset[Partition]  # exact positions B has had an offset for since


def _settled(translation: GroupTranslation) -> bool:
    """An exact translation of an unchanged position stays true: it can be reused."""
    return all(p.outcome in (Outcome.EXACT, Outcome.NO_OFFSET) for p in translation.partitions)


def _exact_in(
    translation: GroupTranslation, target_committed: Mapping[Partition, int]
) -> frozenset[Partition]:
    return frozenset(
        (p.topic, p.partition)
        for p in translation.partitions
        if p.outcome is Outcome.EXACT and (p.topic, p.partition) in target_committed
    )


def _still_valid(
    cached: _Cached,
    committed: Mapping[Partition, int],
    target_committed: Mapping[Partition, int],
    now: float,
) -> bool:
    """Whether a cached translation may stand in for a new one.

    Only for the same offsets in A, and while B keeps the group's offsets it had: Kafka
    drops a group's offsets of a deleted topic, so a ``T-global`` deleted and made again
    in B (docs/operations.md), whose new log the cached positions do not point into,
    shows as offsets gone. A cache entry also ages out, which bounds how long any other
    change in B could go unnoticed.
    """
    return (
        cached.committed == committed
        and now - cached.made_at < CACHE_SECONDS
        and cached.kept_in_target <= frozenset(target_committed)
    )


class GroupOffsetSync:
    """One member's pull of consumer group offsets from the other data members."""

    def __init__(
        self,
        config: SidecarConfig,
        observer: SyncObserver,
        *,
        timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        self._config = config
        self._sync = config.group_offset_sync
        self._observer = observer
        own = config.own_member.kafka
        assert own is not None, "only a data member syncs group offsets into its cluster"
        self._target = ClusterClients(config.member, own.client_properties(), timeout)
        self._sources: dict[str, ClusterClients] = {}
        for member in config.data_members:
            if member.name != config.member and member.kafka is not None:
                self._sources[member.name] = ClusterClients(
                    member.name, member.kafka.client_properties(), timeout
                )
        self._cache: dict[tuple[str, str], _Cached] = {}
        # (group, partition) -> when a round first saw B not in step there.
        self._pending_since: dict[tuple[str, Partition], float] = {}
        self._failing: set[str] = set()
        self._lock = threading.Lock()  # one round at a time; close waits for it
        self._stopping = False
        self.state = SyncState()

    def close(self) -> None:
        self._stopping = True
        with self._lock:
            for clients in (self._target, *self._sources.values()):
                clients.close()

    # ------------------------------------------------------------------ a round

    def run_round(self) -> None:
        with self._lock:
            if self._stopping:
                return
            started = time.monotonic()
            failures: dict[str, str] = {}
            groups = self._selected_groups(failures)
            plans: list[GroupPlan] = []
            for group, members in sorted(groups.items()):
                if self._stopping:
                    return
                try:
                    plan = self._sync_group(group, members, started, failures)
                except Exception as exc:  # a bug or a client error we did not foresee
                    if "unexpected" not in self._failing:
                        log.exception("group offset sync of consumer group %s failed", group)
                    failures["unexpected"] = f"consumer group {group}: {exc!r}"
                    continue
                if plan is not None:
                    plans.append(plan)
            # Forget groups that are gone (or no longer selected).
            self._cache = {k: v for k, v in self._cache.items() if k[1] in groups}
            self._pending_since = {k: v for k, v in self._pending_since.items() if k[0] in groups}
            self._finish(started, plans, len(groups), failures)

    def _selected_groups(self, failures: dict[str, str]) -> dict[str, list[str]]:
        """Selected group -> the other members where it exists."""
        found: dict[str, list[str]] = {}
        for name, clients in self._sources.items():
            try:
                listed = set(clients.group_ids())
            except Exception as exc:  # KafkaUnavailable, or anything the client raises
                failures[f"unavailable:{name}"] = str(exc)
                continue
            # Named groups are looked up even when a listing leaves them out.
            for group in sorted(listed | set(self._sync.groups)):
                if self._sync.selects(group):
                    found.setdefault(group, []).append(name)
        return found

    def _translations(
        self,
        group: str,
        members: list[str],
        target_committed: Mapping[Partition, int],
        failures: dict[str, str],
    ) -> tuple[list[GroupTranslation], bool] | None:
        """The group's translations from ``members``, and whether any was made afresh."""
        translations: list[GroupTranslation] = []
        fresh = False
        for name in members:
            source = self._sources[name]
            try:
                committed = source.committed_offsets(group)
                cached = self._cache.get((name, group))
                now = time.monotonic()
                if cached is not None and _still_valid(cached, committed, target_committed, now):
                    self._remember_kept(name, group, target_committed)
                    translations.append(cached.translation)
                    continue
                fresh = True
                self.state.translated += 1
                translation = translate_group(
                    self._config.topics, group, source, self._target, committed
                )
            except KafkaUnavailable as exc:
                failures[f"unavailable:{name}"] = str(exc)
                return None  # this group waits: a plan without A could miss its furthest
            except FailoverRefused as exc:
                failures["topics"] = f"consumer group {group} from {name}: {exc}"
                return None
            except RecordFormatError as exc:
                failures["record-format"] = str(exc)
                return None
            if _settled(translation):
                self._cache[(name, group)] = _Cached(
                    dict(committed), translation, now, _exact_in(translation, target_committed)
                )
            else:
                self._cache.pop((name, group), None)
            translations.append(translation)
        return translations, fresh

    def _remember_kept(self, name: str, group: str, offsets: Mapping[Partition, int]) -> None:
        """Note partitions where B has the group's offset now (for ``_still_valid``)."""
        cached = self._cache.get((name, group))
        if cached is not None:
            kept = cached.kept_in_target | _exact_in(cached.translation, offsets)
            self._cache[(name, group)] = replace(cached, kept_in_target=kept)

    def _sync_group(
        self, group: str, members: list[str], started: float, failures: dict[str, str]
    ) -> GroupPlan | None:
        try:
            committed = self._target.committed_offsets(group)
        except KafkaUnavailable as exc:
            failures["unavailable:" + self._config.member] = str(exc)
            return None
        made = self._translations(group, members, committed, failures)
        if made is None:
            return None
        translations, fresh = made
        try:
            if fresh:  # translating took a while: look at B again
                committed = self._target.committed_offsets(group)
            active = bool(self._target.active_members(group))
        except KafkaUnavailable as exc:
            failures["unavailable:" + self._config.member] = str(exc)
            return None
        plan = plan_group(group, translations, committed, active)
        for where in [*plan.writes, *plan.skipped]:
            self._pending_since.setdefault((group, where), started)
        if plan.writes:
            try:
                self._target.write_offsets(group, plan.writes)
            except KafkaUnavailable as exc:
                # Most often a consumer joined the group in B since it was described:
                # Kafka refuses the write, and the consumer's own position stands.
                failures["write-refused"] = str(exc)
                return plan
            now = time.monotonic()
            delays = [
                now - self._pending_since.pop((group, where), started)
                for where in plan.writes
                if where not in plan.skipped
            ]
            for name in members:
                self._remember_kept(name, group, plan.writes)
            self._observer.written(group, len(plan.writes), delays)
            self.state.offsets_written += len(plan.writes)
            log.debug("consumer group %s: wrote %s", group, dict(plan.writes))
        for key in [k for k in self._pending_since if k[0] == group]:
            if key[1] not in plan.writes and key[1] not in plan.skipped:
                del self._pending_since[key]  # in step without a write of ours
        return plan

    def _finish(
        self, started: float, plans: list[GroupPlan], groups: int, failures: dict[str, str]
    ) -> None:
        for kind, message in sorted(failures.items()):
            self.state.errors[kind] = self.state.errors.get(kind, 0) + 1
            self.state.last_error = message
            self._observer.failed(kind)
            if kind not in self._failing and kind != "unexpected":  # that one has its trace
                log.warning("group offset sync (%s): %s", kind, message)
        for kind in sorted(self._failing - set(failures)):
            log.info("group offset sync: %s recovered", kind)
        self._failing = set(failures)
        seconds = time.monotonic() - started
        in_step = sum(1 for p in plans if p.in_step)
        state = self.state
        state.rounds += 1
        state.last_round_at = time.monotonic()
        state.last_round_seconds = seconds
        state.max_round_seconds = max(state.max_round_seconds, seconds)
        state.groups = groups
        state.in_step = in_step
        state.waiting = {
            p.group: [f"{t}[{n}]: {why.value}" for (t, n), why in sorted(p.skipped.items())]
            for p in plans
            if p.skipped and any(why is not Skip.ACTIVE for why in p.skipped.values())
        }
        self._observer.round_done(seconds, groups, in_step)

    def status(self) -> dict[str, object]:
        state = self.state
        ago = None if state.last_round_at is None else time.monotonic() - state.last_round_at
        return {
            "groups": state.groups,
            "inStep": state.in_step,
            "rounds": state.rounds,
            "offsetsWritten": state.offsets_written,
            "lastRoundAgoSeconds": None if ago is None else round(ago, 1),
            "lastRoundSeconds": round(state.last_round_seconds, 3),
            "maxRoundSeconds": round(state.max_round_seconds, 3),
            "translations": state.translated,
            "waiting": state.waiting,
            "errors": dict(state.errors),
            "lastError": state.last_error,
        }
