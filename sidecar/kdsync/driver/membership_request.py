"""A request to change the group's membership (remove a member, add a witness or a data
member), as a member answers it.

Pure: the sidecar's ``POST /membership`` and the tests call the same function. The
answer says whether to ask again (this member does not lead, or a change is still
settling) or to give up (the change itself is not allowed), so that a caller such as
``kdsync members remove`` can retry on whoever leads without guessing.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from kdsync.driver.member_driver import MemberDriver
from kdsync.driver.report import configuration_section
from kdsync.ordering import Configuration, Role, change_problem


class Outcome(Enum):
    APPENDED = "appended"  # the change is in the leader's log; it is in force once committed
    ASK_AGAIN = "ask-again"  # not now or not here: ask the leader named, or again shortly
    REFUSED = "refused"  # the change is not allowed: asking again will not help
    NOT_A_MEMBER = "not-a-member"  # nobody of that name in the configuration in force
    ALREADY_A_MEMBER = "already-a-member"  # an add whose member is in force already


@dataclass(frozen=True)
class MembershipAnswer:
    outcome: Outcome
    reason: str | None
    leader: str | None
    index: int | None = None  # where the change was appended

    def as_json(self, driver: MemberDriver) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "reason": self.reason,
            "leader": self.leader,
            "index": self.index,
            "configuration": configuration_section(driver),
        }


def remove_member(driver: MemberDriver, member: str) -> MembershipAnswer:
    """Ask this member to remove ``member`` from the group (data member or witness)."""
    node = driver.node
    config = node.config
    not_leading = _not_leading(driver)
    if not_leading is not None:
        return not_leading
    if member not in config.members:
        return MembershipAnswer(
            Outcome.NOT_A_MEMBER,
            f"no member {member!r} in the configuration in force ({config.describe()})",
            node.status().leader,
        )
    return _propose(driver, config.without(member), f"removing {member}")


def add_member(
    driver: MemberDriver, member: str, address: str, *, witness: bool
) -> MembershipAnswer:
    """Ask this member to add ``member``, reached at ``address`` (host:port, checked by
    the caller): a witness as a voter; a data member as a learner, which the leader makes
    a voter once it has caught up. A data member's sidecar starts only after a backfill
    seeded its ``T-global`` and ledger (``kdsync.backfill``)."""
    node = driver.node
    config = node.config
    not_leading = _not_leading(driver)
    if not_leading is not None:
        return not_leading
    kind = "a witness" if witness else "a data member"
    if member in config.members:
        if config.is_witness(member) != witness:
            other = "a data member" if witness else "a witness"
            reason = f"{member} is {other} of the group already, not {kind}"
            return MembershipAnswer(Outcome.REFUSED, reason, None)
        recorded = config.address_of(member)
        if recorded is not None and recorded != address:
            reason = (
                f"{member} is in the group already, reached at {recorded}, not {address}: "
                f"to move it, remove it and add it again"
            )
            return MembershipAnswer(Outcome.REFUSED, reason, None)
        return MembershipAnswer(
            Outcome.ALREADY_A_MEMBER,
            f"{member} is in the configuration in force already ({config.describe()})",
            node.status().leader,
            node.config_index,
        )
    proposed = (
        config.with_witness(member, address) if witness else config.with_learner(member, address)
    )
    return _propose(driver, proposed, f"adding {member} as {kind}")


def _not_leading(driver: MemberDriver) -> MembershipAnswer | None:
    """ "Ask again" on a member that does not lead: only the leader's configuration is the
    newest, so judge nothing against ours."""
    status = driver.node.status()
    if status.role == Role.LEADER:
        return None
    where = f"{status.leader} leads" if status.leader else "no leader is known"
    return MembershipAnswer(
        Outcome.ASK_AGAIN, f"only the leader changes the membership; {where}", status.leader
    )


def _propose(driver: MemberDriver, proposed: Configuration, what: str) -> MembershipAnswer:
    node = driver.node
    problem = change_problem(node.config, proposed)
    if problem is not None:
        return MembershipAnswer(Outcome.REFUSED, f"{what}: {problem}", None)
    refused = driver.propose_configuration(proposed)
    leader = node.status().leader
    if refused is not None:
        return MembershipAnswer(Outcome.ASK_AGAIN, refused, leader)
    return MembershipAnswer(Outcome.APPENDED, None, leader, node.config_index)
