"""The fault schedule of a campaign: a pure function of a seed.

A schedule is a sequence of faults, one at a time: each is injected, held for its
duration, then healed, and the campaign waits until the group has recovered before the
next one starts (so every heal gets its own recovery time). Nothing here touches a
process or a socket; :mod:`kdsync.chaos.campaign` carries a schedule out. The same seed,
members and length give the same schedule, fault for fault.

Targets are member names, or the placeholder :data:`LEADER`, resolved when the fault is
injected (who leads depends on the run, not on the seed; the report records whom it hit).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass

LEADER = "@leader"


class FaultKind(enum.Enum):
    """What a fault does. Values are the names used in reports and on the command line."""

    # processes
    KILL_SIDECAR = "kill-sidecar"  # SIGKILL, restarted at heal
    PAUSE_SIDECAR = "pause-sidecar"  # SIGSTOP, SIGCONT at heal
    KILL_BROKER = "kill-broker"  # SIGKILL of a member's Kafka broker, restarted at heal
    # peer network (toxiproxy between every ordered pair of members)
    ISOLATE_MEMBER = "isolate-member"  # a minority of one cut off from the others
    ISOLATE_LEADER = "isolate-leader"  # the current leader cut off
    SPLIT_ALL = "split-all"  # every member alone: no majority anywhere
    ONE_WAY = "one-way"  # frames from one member to another dropped, the reverse flows
    PEER_LATENCY = "peer-latency"  # latency with jitter on every peer link
    PEER_BANDWIDTH = "peer-bandwidth"  # a bandwidth limit on one member's outbound links
    # a member's link to its own brokers (toxiproxy in front of a dedicated listener)
    SLOW_BROKER = "slow-broker"  # latency and a bandwidth limit towards one member's broker
    STALLED_BROKER = "stalled-broker"  # no bytes move between a sidecar and its broker
    BROKER_CUT = "broker-cut"  # the sidecar's broker connections refused and reset


ALL_KINDS: tuple[FaultKind, ...] = tuple(FaultKind)


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` applied to ``targets`` for ``hold_s`` seconds."""

    index: int
    kind: FaultKind
    targets: tuple[str, ...]
    hold_s: float
    # Kind-specific settings (latency_ms, jitter_ms, rate_kbps); sorted pairs, hashable.
    params: tuple[tuple[str, int], ...] = ()

    def param(self, name: str) -> int:
        return dict(self.params)[name]

    def describe(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in self.params)
        return f"#{self.index} {self.kind.value} {','.join(self.targets)} {self.hold_s:.1f}s{extra}"


@dataclass(frozen=True)
class ScheduleSettings:
    """What a schedule may contain. ``min_hold_s``/``max_hold_s`` bound every fault."""

    members: tuple[str, ...]
    faults: int
    kinds: tuple[FaultKind, ...] = ALL_KINDS
    min_hold_s: float = 3.0
    max_hold_s: float = 12.0
    # Every kind appears once (in seeded order) before any repeats, so a short campaign
    # still covers them all when ``faults >= len(kinds)``.
    cover_every_kind: bool = True

    def __post_init__(self) -> None:
        if len(self.members) < 3:
            raise ValueError("a campaign needs at least three data members (a majority of two)")
        if len(set(self.members)) != len(self.members):
            raise ValueError(f"member names repeat: {self.members}")
        if self.faults < 1:
            raise ValueError("faults must be at least 1")
        if not self.kinds:
            raise ValueError("choose at least one fault kind")
        if not 0 < self.min_hold_s <= self.max_hold_s:
            raise ValueError("hold times: need 0 < min_hold_s <= max_hold_s")


def parse_kinds(text: str) -> tuple[FaultKind, ...]:
    """``"kill-sidecar,one-way"`` -> kinds; ``"all"`` -> every kind. Raises ValueError."""
    if text.strip() == "all":
        return ALL_KINDS
    by_value = {kind.value: kind for kind in FaultKind}
    chosen: list[FaultKind] = []
    for word in (w.strip() for w in text.split(",")):
        if word not in by_value:
            raise ValueError(
                f"unknown fault kind {word!r}; choose from: all, {', '.join(sorted(by_value))}"
            )
        chosen.append(by_value[word])
    return tuple(dict.fromkeys(chosen))


def generate_schedule(seed: int, settings: ScheduleSettings) -> list[Fault]:
    """The faults of a campaign, in order. A pure function of its arguments."""
    rng = random.Random(seed)
    members = settings.members
    kinds: list[FaultKind] = []
    if settings.cover_every_kind:
        first = list(settings.kinds)
        rng.shuffle(first)
        kinds.extend(first)
    while len(kinds) < settings.faults:
        kinds.append(rng.choice(settings.kinds))
    faults: list[Fault] = []
    for index, kind in enumerate(kinds[: settings.faults]):
        hold = round(rng.uniform(settings.min_hold_s, settings.max_hold_s), 1)
        targets, params = _targets_and_params(kind, members, rng)
        faults.append(Fault(index, kind, targets, hold, params))
    return faults


def _targets_and_params(
    kind: FaultKind, members: Sequence[str], rng: random.Random
) -> tuple[tuple[str, ...], tuple[tuple[str, int], ...]]:
    one = (rng.choice(members),)
    if kind is FaultKind.ISOLATE_LEADER:
        return (LEADER,), ()
    if kind is FaultKind.SPLIT_ALL:
        return tuple(members), ()
    if kind is FaultKind.ONE_WAY:
        sender, receiver = rng.sample(list(members), 2)
        return (sender, receiver), ()
    if kind is FaultKind.PEER_LATENCY:
        return tuple(members), (
            ("jitter_ms", rng.randint(5, 50)),
            ("latency_ms", rng.randint(20, 200)),
        )
    if kind is FaultKind.PEER_BANDWIDTH:
        return one, (("rate_kbps", rng.choice((16, 64, 256))),)
    if kind is FaultKind.SLOW_BROKER:
        return one, (
            ("latency_ms", rng.randint(50, 400)),
            ("rate_kbps", rng.choice((32, 128, 512))),
        )
    return one, ()
