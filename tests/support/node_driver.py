"""A stand-in for ``MemberDriver`` around a bare ``OrderingNode``: what the membership
requests (``kdsync.driver.membership_request``) and readiness use of a driver."""

from __future__ import annotations

from dataclasses import dataclass, field

from kdsync.driver import DriverState
from kdsync.ordering import Configuration, OrderingNode


@dataclass
class NodeDriver:
    node: OrderingNode
    state: DriverState = field(default_factory=DriverState)

    def propose_configuration(self, proposed: Configuration) -> str | None:
        return self.node.propose_configuration(proposed)
