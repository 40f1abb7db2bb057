"""The simulator's operator for membership changes: plays a scenario's steps one at a
time against whoever leads, as the operator or ``kdsync members`` would.

- Adding a data member: the learner is proposed; once that is committed, the new member
  is seeded from a peer's durable state at the point the product's backfill chooses
  (``kdsync.backfill_point``: the latest ledger of the data member that applied least,
  and its global topics up to it) and started; the leader makes it a voter once it has
  caught up.
- Adding a witness: it is started (it recovers from everyone) and proposed as a voter.
- Removing a member: proposed until committed (a leader asked to remove itself hands
  over first, and the change is asked of the next leader); the removed member is
  stopped a while later, as an operator deletes its pod, and never started again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from kdsync.backfill_point import (
    PointNotReady,
    applied_everywhere,
    below_floor,
    choose_donor,
    members_to_ask,
)
from kdsync.driver.report import node_section
from kdsync.ordering import Configuration, GroupSpec, Role
from kdsync.simulation.member import SimKafka, SimMember
from kdsync.simulation.scenario import MembershipStep

# A removed member keeps running this long before it is stopped: it must not disturb
# the group meanwhile (it may not know that it was removed).
REMOVED_RUNS_TICKS = 50

# (name, its startup file's group, its durable state to start from) -> the started member
StartMember = Callable[[str, GroupSpec, SimKafka | None], SimMember]


class MembershipOperator:
    def __init__(
        self,
        steps: tuple[MembershipStep, ...],
        members: dict[str, SimMember],
        start_member: StartMember,
    ) -> None:
        self._steps = deque(steps)
        self._members = members
        self._start_member = start_member
        self.removed: set[str] = set()  # out of the configuration in force
        self.leaving: set[str] = set()  # being removed, or removed: produces no more
        self._stop_at: dict[str, int] = {}
        self.done: list[tuple[MembershipStep, int]] = []  # steps completed, and the tick

    @property
    def pending(self) -> tuple[MembershipStep, ...]:
        return tuple(self._steps)

    def drive(self, now: int) -> None:
        """One tick of the operator."""
        for name, at in list(self._stop_at.items()):
            if now >= at:
                self._members[name].crash()
                del self._stop_at[name]
        if not self._steps or self._steps[0].at > now:
            return
        leader = self._leader()
        if leader is None:
            return
        step = self._steps[0]
        node = leader.node
        assert node is not None
        config = node.config
        settled = not node.change_pending
        name = step.member
        proposal = _proposal(step, config)
        if proposal is not None:
            if step.kind == "remove":
                self.leaving.add(name)
            leader.propose(proposal)
        elif step.kind == "add-data":
            if settled and name not in self._members:
                backfill = self._donor(name)
                if backfill is not None:
                    group = GroupSpec((*config.voters, name), config.witnesses)
                    self._start_member(name, group, backfill)
            elif settled and config.is_voter(name):
                self._finish(step, now)
        elif settled:
            if step.kind == "remove":
                self.leaving.add(name)
                self.removed.add(name)
                self._stop_at[name] = now + REMOVED_RUNS_TICKS
            self._finish(step, now)
        if step.kind == "add-witness":
            self._start_witness(name, config)
        if node.change_pending and len(self._steps) > 1:
            # A hasty operator asks for the next change before this one committed: the
            # leader must refuse it (one change at a time), and does not act on it. The
            # proposal is taken at the leader's next step, which may come after the
            # commit: then it is a change like any other. A witness is started first, as
            # the product starts one before proposing it (a backfill needs its answer
            # once it is in the configuration); it may then run while the change before
            # it is pending, or lost. (Not when that configuration would be invalid: the
            # witness's startup file would be too, and the leader refuses the change.)
            following = self._steps[1]
            early = _proposal(following, config)
            if early is not None and following.kind != "remove":
                if following.kind == "add-witness" and not early.problems():
                    self._start_witness(following.member, config)
                leader.propose(early)

    def _start_witness(self, name: str, config: Configuration) -> None:
        """Start the new witness (once), with its startup file's group: the voters and it."""
        if name in self._members:
            return
        others = tuple(m for m in config.voters if m != name)
        self._start_member(name, GroupSpec((*others, name), config.witnesses | {name}), None)

    def _finish(self, step: MembershipStep, now: int) -> None:
        self._steps.popleft()
        self.done.append((step, now))

    def _leader(self) -> SimMember | None:
        """The up member that leads in the highest term."""
        leaders = [
            (m.node.term, m.name, m)
            for m in self._members.values()
            if m.node is not None and m.node.role == Role.LEADER
        ]
        return max(leaders, key=lambda t: (t[0], t[1]))[2] if leaders else None

    def _donor(self, name: str) -> SimKafka | None:
        """The new member's backfill, as the product's backfill chooses it
        (``kdsync.backfill_point``, on the ``/status`` documents the sidecars would serve):
        the latest ledger of the data member that applied least, and its global topics up
        to it, once that point is at or past what any log may trim and every data member
        has applied it.

        None while no point fits yet (a member down or behind holds the new one back, as
        it does the product's backfill, which asks again until its timeout)."""
        statuses = {
            m.name: node_section(m.driver)
            for m in self._members.values()
            if m.driver is not None and m.name != name and m.name not in self.removed
        }
        data_members, witnesses = members_to_ask(statuses, name)
        try:
            choice = choose_donor(statuses, data_members, witnesses)
        except PointNotReady:
            return None
        donor = self._members[choice.donor]
        point = donor.kafka.ledger.applied_index
        if below_floor(choice, point) or applied_everywhere(statuses, data_members, point):
            return None
        seed = Configuration(donor.group.members, donor.group.witnesses)
        return donor.kafka.backfill_copy(seed)


def _proposal(step: MembershipStep, config: Configuration) -> Configuration | None:
    """The configuration ``step`` asks for next, from ``config``; None once it is in."""
    name = step.member
    if step.kind == "remove":
        return config.without(name) if name in config.members else None
    if name in config.members:
        return None
    # An address as the product records one (the simulated network needs none): the
    # configuration then crosses the wire and the ledger in its form with addresses.
    address = f"{name}.sim:7400"
    if step.kind == "add-data":
        return config.with_learner(name, address)
    return config.with_witness(name, address)
