"""The backfill step of ``kdsync members add`` for a data member: pick the point, copy the
donor's ``T-global`` with Spark, then write the new member's first ledger.

It runs after the new member's addition as a learner has committed, and before its sidecar
starts. Every step can be interrupted and run again: a cluster already holding the new
member's ledger is seeded, and the copy resumes after what is already committed
(``copy_job``). See ``seeding`` for why the slowest member's latest ledger is the point.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import SparkSession

from kdsync import naming
from kdsync.backfill.copy_job import KafkaEndpoint, copy_global_topics
from kdsync.backfill.seeding import SeedingError, read_state, seed_ledger, write_marker, write_seed
from kdsync.backfill_point import (
    DonorChoice,
    PointNotReady,
    applied_everywhere,
    below_floor,
    choose_donor,
    members_to_ask,
)
from kdsync.config import MemberConfig, SidecarConfig
from kdsync.ordering import Configuration, LedgerState
from kdsync.runtime.members_command import POLL_SECONDS, Statuses

Clock = Callable[[], float]
Sleep = Callable[[float], None]


class Backfill:
    """``members_command.Seed`` for new data member ``config.member``, whose config file
    lists every member's Kafka (the donor's too)."""

    def __init__(
        self,
        config: SidecarConfig,
        spark: Callable[[], SparkSession],
        out: Callable[[str], None],
        *,
        kafka_timeout: float = 30.0,
        clock: Clock = time.monotonic,
        sleep: Sleep = time.sleep,
    ) -> None:
        self._config = config
        self._spark = spark
        self._out = out
        self._timeout = kafka_timeout
        self._clock = clock
        self._sleep = sleep
        self.member = config.member
        self._prefix = f"{naming.transactional_id(config.group, self.member)}.backfill"

    def __call__(self, statuses: Statuses, deadline: float) -> bool:
        """Seed the new member (True), or find it seeded by an earlier run (False)."""
        target = self._kafka_member(self.member)
        there = read_state(target, self._config.group, self._timeout)
        if there.ledger is not None:
            self._check_seeded(there.ledger, statuses, deadline)
            self._out(f"{self.member}'s cluster holds its ledger already: the backfill is done")
            return False
        # Before anything is copied: its sidecar now refuses to start (and one started too
        # early is fenced) until the ledger is written.
        write_marker(target, self._config.group, self._timeout)
        if not read_state(target, self._config.group, self._timeout).seeding_started:
            # A sidecar that ran too early wrote a ledger before the marker: a sidecar
            # would no longer see the marker, nor later the hand-over.
            raise SeedingError(
                f"{self.member}'s ledger topic {naming.ledger_topic(self._config.group)} holds "
                f"ledger records of a sidecar that ran before its backfill: stop {self.member}'s "
                "sidecar, delete that topic and its T-global topics there, then run the "
                "command again"
            )
        while True:
            data_members, choice = self._choose(statuses, deadline)
            donor = self._kafka_member(choice.donor)
            ledger = read_state(donor, self._config.group, self._timeout).ledger
            point = -1 if ledger is None else ledger.applied_index  # none yet: below any floor
            problem = below_floor(choice, point)
            if problem is not None:
                self._wait(deadline, problem)
                continue
            assert ledger is not None
            while behind := applied_everywhere(statuses(), data_members, point):
                self._wait(
                    deadline,
                    f"{', '.join(behind)} did not answer, or did not apply index {point} yet",
                )
            self._copy(donor, ledger, point)
            return True

    def _choose(self, statuses: Statuses, deadline: float) -> tuple[list[str], DonorChoice]:
        """The data members other than the new one, and the donor and floor among them
        (and the witnesses), asking again while one of them misses a poll."""
        while True:
            seen = statuses()
            data_members, witnesses = members_to_ask(seen, self.member)
            try:
                return data_members, choose_donor(seen, data_members, witnesses)
            except PointNotReady as error:
                self._wait(deadline, str(error))

    def _check_seeded(self, ledger: LedgerState, statuses: Statuses, deadline: float) -> None:
        """A ledger found on the new member's cluster must be one the group's logs can
        continue from: not one seeded for an earlier attempt (the logs were trimmed after
        that attempt was given up), nor a former member's of the same name."""
        floor = self._choose(statuses, deadline)[1].floor
        if ledger.applied_index < floor:
            topics = naming.ledger_topic(self._config.group), naming.log_topic(self._config.group)
            raise SeedingError(
                f"{self.member}'s cluster holds a ledger at applied index "
                f"{ledger.applied_index}, but the group's logs may be trimmed up to {floor}: "
                "it was seeded for an earlier attempt that was given up, or it is a former "
                f"member's. Delete {', '.join(topics)} and its T-global topics there, then run "
                "the command again"
            )

    def _copy(self, donor: MemberConfig, ledger: LedgerState, point: int) -> None:
        """Copy up to ``ledger``, then seed. The copy refuses a target that holds more than
        the ledger says (an earlier run, killed before its ledger, copied from a later
        point and this one chose an earlier one): running the command again chooses anew."""
        # Heartbeat T-globals keep a day and serve only the lag metrics: not copied (the
        # new member's starts with the first live heartbeat; the writer expects that).
        sources = {
            self._config.topics.global_topic(t): t
            for t in ledger.next_seq
            if not naming.is_heartbeat_topic(t)
        }
        upto = {g: ledger.next_seq[t] for g, t in sources.items()}
        shown = ", ".join(f"{t} below seq {n}" for t, n in sorted(upto.items())) or "nothing"
        self._out(f"backfill from {donor.name} at applied index {point}: {shown}")
        result = copy_global_topics(
            self._spark(),
            _endpoint(donor),
            _endpoint(self._kafka_member(self.member)),
            upto,
            self._prefix,
            timeout=self._timeout,
        )
        # Where the new member's T-global starts: seq 0, or later when the donor's was
        # trimmed by retention; a topic not copied starts with its first live event.
        first_seq = dict(ledger.next_seq)
        first_seq.update({sources[g]: seq for g, seq in result.first_seq.items()})
        seeded = seed_ledger(ledger, self._startup())
        handover = _handover(donor.name, ledger, first_seq, result.copied, result.present)
        write_seed(
            self._kafka_member(self.member), self._config.group, seeded, handover, self._timeout
        )
        copied = sum(result.copied.values())
        self._out(
            f"{self.member} is seeded: {copied} records copied ({sum(result.present.values())} "
            f"were there), live ordering takes over at applied index {point}"
        )

    def _startup(self) -> Configuration:
        """The group's seed, as the new member's file lists it (without itself): the
        configuration in force at the point when no change had been applied by then."""
        others = [m for m in self._config.members if m.name != self.member]
        return Configuration(
            voters=tuple(m.name for m in others),
            witnesses=frozenset(m.name for m in others if m.witness),
        )

    def _kafka_member(self, name: str) -> MemberConfig:
        for member in self._config.members:
            if member.name == name and member.kafka is not None:
                return member
        raise SeedingError(
            f"{name}'s Kafka cluster is not in {self.member}'s config file: list every data "
            "member with its kafka section there (the backfill reads from one of them)"
        )

    def _wait(self, deadline: float, problem: str) -> None:
        if self._clock() >= deadline:
            raise SeedingError(
                f"{problem}; give a longer --timeout, or run the command again. Until the new "
                f"member catches up, no member trims its ordering log: to give up, "
                f"`kdsync members remove {self.member}`"
            )
        self._sleep(POLL_SECONDS)


def _endpoint(member: MemberConfig) -> KafkaEndpoint:
    assert member.kafka is not None
    return KafkaEndpoint(member.name, member.kafka.client_properties())


def _handover(
    donor: str,
    ledger: LedgerState,
    first_seq: Mapping[str, int],
    copied: Mapping[str, int],
    present: Mapping[str, int],
) -> dict[str, Any]:
    """What the audit and an SRE need to prove the hand-over (``kafka.ledger_reader``):
    where live ordering took over (the first live seq of each source topic is
    ``nextSeq``), where the copy starts (``firstSeq``), and what was copied from whom."""
    return {
        "donor": donor,
        "appliedIndex": ledger.applied_index,
        "appliedTerm": ledger.applied_term,
        "nextSeq": dict(ledger.next_seq),
        "firstSeq": dict(first_seq),
        "copied": dict(copied),
        "presentBefore": dict(present),
        "at": datetime.now(UTC).isoformat(timespec="milliseconds"),
    }
