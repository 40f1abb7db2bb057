"""The member driver: the sans-I/O code between the ordering core and a member's I/O.

The sidecar (``kdsync.runtime``) and the simulator (``kdsync.simulation``) run the same
``MemberDriver``; only its ports differ (Kafka and TCP, or seeded simulated ones).
"""

from kdsync.driver.member_driver import (
    FRAMES_PER_TURN,
    DriverLimits,
    DriverObserver,
    DriverState,
    MemberDriver,
)
from kdsync.driver.ports import (
    DeliveryPort,
    DriverPorts,
    FrameSender,
    LogPort,
    SourcePartition,
    SourcePort,
    WriteFailure,
)

__all__ = [
    "FRAMES_PER_TURN",
    "DeliveryPort",
    "DriverLimits",
    "DriverObserver",
    "DriverPorts",
    "DriverState",
    "FrameSender",
    "LogPort",
    "MemberDriver",
    "SourcePartition",
    "SourcePort",
    "WriteFailure",
]
