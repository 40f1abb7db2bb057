"""The ordering core: a sans-I/O, deterministic total-order protocol for kdsync groups.

No sockets, clocks, threads, randomness or Kafka in here (enforced by
tests/unit/test_layering.py); the shells in kdsync.sidecar and kdsync.simulation drive it.
"""

from kdsync.ordering.configuration import Configuration, ConfigurationError, change_problem
from kdsync.ordering.events import DeliveredEvent, OriginBatch, OriginPartition, SourceEvent
from kdsync.ordering.group import GroupSpec, GroupSpecError, Timing
from kdsync.ordering.ledger import BatchVerdict, Delivery, DeliveryLedger, LedgerState
from kdsync.ordering.log import Entry, ReplicatedLog, entry_size
from kdsync.ordering.messages import Message, Outbound
from kdsync.ordering.node import OrderingNode
from kdsync.ordering.ready import (
    HardState,
    NodeEvent,
    NodeStatus,
    Ready,
    RecoveredState,
    Role,
    may_precede_persist,
)

__all__ = [
    "BatchVerdict",
    "Configuration",
    "ConfigurationError",
    "DeliveredEvent",
    "Delivery",
    "DeliveryLedger",
    "Entry",
    "GroupSpec",
    "GroupSpecError",
    "HardState",
    "LedgerState",
    "Message",
    "NodeEvent",
    "NodeStatus",
    "OrderingNode",
    "OriginBatch",
    "OriginPartition",
    "Outbound",
    "Ready",
    "RecoveredState",
    "ReplicatedLog",
    "Role",
    "SourceEvent",
    "Timing",
    "change_problem",
    "entry_size",
    "may_precede_persist",
]
