"""The simulator's operator for membership changes: plays a scenario's steps one at a
time against whoever leads, as the operator or ``kdsync members`` would.

- Adding a data member: the learner is proposed; once that is committed, the new member
  is seeded from a peer's durable state (what the backfill job copies: a ledger from
  the peer's ledger history and its global topics up to it, at a point every member has
  applied and every log still holds the entries after) and started; the leader makes it
  a voter once it has caught up.
- Adding a witness: it is started (it recovers from everyone) and proposed as a voter.
- Removing a member: proposed until committed (a leader asked to remove itself hands
  over first, and the change is asked of the next leader); the removed member is
  stopped a while later, as an operator deletes its pod, and never started again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

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
        self.done: list[str] = []  # steps completed, for the report

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
        if step.kind == "add-witness" and name not in self._members:
            others = tuple(m for m in config.voters if m != name)
            group = GroupSpec((*others, name), config.witnesses | {name})
            self._start_member(name, group, None)
        if node.change_pending and len(self._steps) > 1:
            # A hasty operator asks for the next change before this one committed: the
            # leader must refuse it (one change at a time), and does not act on it.
            early = _proposal(self._steps[1], config)
            if early is not None and self._steps[1].kind != "remove":
                leader.propose(early)

    def _finish(self, step: MembershipStep, now: int) -> None:
        self._steps.popleft()
        self.done.append(f"{step.kind} {step.member} at tick {now}")

    def _leader(self) -> SimMember | None:
        """The up member that leads in the highest term."""
        leaders = [
            (m.node.term, m.name, m)
            for m in self._members.values()
            if m.node is not None and m.node.role == Role.LEADER
        ]
        return max(leaders, key=lambda t: (t[0], t[1]))[2] if leaders else None

    def _donor(self, name: str) -> SimKafka | None:
        """A backfill for the new member: a data member's ledger, and its global topics
        up to it, at an applied index K that every other member can continue from and
        none needs anything at or below from the new member, should it lead.

        - At or below what every data member has applied (their logs match the group's
          up to there; the new member knows the term of K, where its log starts, for a
          peer whose log ends there).
        - At or past what any log trimmed, or may still trim with what any member knows
          of ``all_durable`` (which stays put while the new learner has stored nothing):
          entry K (whose term starts the first Append to the new member) and those after
          it must still be there to send. A witness counts: it may remember more than
          data members that restarted since, and passes that on once it leads.

        None while no ledger fits: a member far behind holds the new one back."""
        floor, ceiling = 0, None
        donors: list[tuple[SimKafka, Configuration]] = []
        for member in self._members.values():
            if member.name in self.removed or member.name == name:
                continue
            if member.node is not None:
                floor = max(floor, member.node.all_durable)
            if member.is_witness:
                continue
            kafka = member.kafka
            floor = max(floor, kafka.trimmed_below)
            applied = kafka.ledger.applied_index
            ceiling = applied if ceiling is None else min(ceiling, applied)
            donors.append((kafka, Configuration(member.group.members, member.group.witnesses)))
        if ceiling is None or ceiling < floor:
            return None
        copies = [kafka.backfill_copy(ceiling, seed) for kafka, seed in donors]
        fit = [c for c in copies if c is not None and c.ledger.applied_index >= floor]
        return max(fit, key=lambda c: c.ledger.applied_index) if fit else None


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
