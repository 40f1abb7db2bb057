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
from kdsync.backfill.seeding import (
    SeedingError,
    applied_everywhere,
    choose_donor,
    read_ledger,
    seed_ledger,
    write_seed,
)
from kdsync.config import MemberConfig, SidecarConfig
from kdsync.ordering import Configuration, LedgerState
from kdsync.runtime.members_command import POLL_SECONDS, Statuses
from kdsync.runtime.status_report import newest_configuration

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

    def __call__(self, statuses: Statuses, deadline: float) -> None:
        target = self._kafka_member(self.member)
        if read_ledger(target, self._config.group, self._timeout) is not None:
            self._out(f"{self.member}'s cluster holds its ledger already: the backfill is done")
            return
        while True:
            seen = statuses()
            data_members = self._data_members(seen)
            choice = choose_donor(seen, data_members)
            donor = self._kafka_member(choice.donor)
            ledger = read_ledger(donor, self._config.group, self._timeout)
            if ledger is None or ledger.applied_index < choice.floor:
                self._wait(
                    deadline,
                    f"{choice.donor} has applied nothing at or past index {choice.floor} "
                    "(what the group's logs may trim): it is far behind or halted; it holds "
                    "the new member back until it applies",
                )
                continue
            point = ledger.applied_index
            while behind := applied_everywhere(statuses(), data_members, point):
                self._wait(deadline, f"{', '.join(behind)} did not apply index {point} yet")
            self._copy(donor, ledger, point)
            return

    def _copy(self, donor: MemberConfig, ledger: LedgerState, point: int) -> None:
        """Copy up to ``ledger``, then seed. The copy refuses a target that holds more than
        the ledger says (an earlier run, killed before its ledger, copied from a later
        point and this one chose an earlier one): running the command again chooses anew."""
        # Heartbeat T-globals keep a day and serve only the lag metrics: not copied (the
        # new member's starts with the first live heartbeat; the writer expects that).
        upto = {
            self._config.topics.global_topic(t): n
            for t, n in ledger.next_seq.items()
            if not naming.is_heartbeat_topic(t)
        }
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
        held = {t: result.present.get(t, 0) + result.copied.get(t, 0) for t in upto}
        short = {t: (held[t], n) for t, n in upto.items() if held[t] != n}
        if short:
            raise SeedingError(
                f"the copy into {self.member} ended short of the point: {short} "
                "(held, wanted); run the command again"
            )
        seeded = seed_ledger(ledger, self._startup())
        handover = _handover(donor.name, ledger, result.copied, result.present)
        write_seed(
            self._kafka_member(self.member),
            self._config.group,
            seeded,
            handover,
            f"{self._prefix}.ledger",
            self._timeout,
        )
        copied = sum(result.copied.values())
        self._out(
            f"{self.member} is seeded: {copied} records copied ({sum(result.present.values())} "
            f"were there), live ordering takes over at applied index {point}"
        )

    def _data_members(self, statuses: Mapping[str, Mapping[str, Any]]) -> list[str]:
        config = newest_configuration(statuses.values()) or {}
        witnesses = set(config.get("witnesses", []))
        members = [*config.get("voters", []), *config.get("learners", [])]
        return [m for m in members if m not in witnesses and m != self.member]

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
            raise SeedingError(f"{problem}; give a longer --timeout, or run the command again")
        self._sleep(POLL_SECONDS)


def _endpoint(member: MemberConfig) -> KafkaEndpoint:
    assert member.kafka is not None
    return KafkaEndpoint(member.name, member.kafka.client_properties())


def _handover(
    donor: str, ledger: LedgerState, copied: Mapping[str, int], present: Mapping[str, int]
) -> dict[str, Any]:
    """What the audit and an SRE need to prove the hand-over: where live ordering took
    over (the first live seq of each topic is ``nextSeq``) and what was copied from whom."""
    return {
        "donor": donor,
        "appliedIndex": ledger.applied_index,
        "appliedTerm": ledger.applied_term,
        "nextSeq": dict(ledger.next_seq),
        "copied": dict(copied),
        "presentBefore": dict(present),
        "at": datetime.now(UTC).isoformat(timespec="milliseconds"),
    }
