"""A valid member replaying old messages cannot change the order.

The peer port authenticates *who* sends, not *when*: a member (or whoever stole its
key) may resend any message it ever sent, in any order, and the transport hands each
frame up as it came. What protects the order is the ordering core: messages carry
their term, and a member ignores or rejects anything from a term older than its own
(an ``Append`` of an old term gets a failing reply, an old vote request no vote), while
replays within the current term are idempotent (an ``Append`` whose entries the log
already has changes nothing; a vote already cast is cast again for the same candidate).
"""

from __future__ import annotations

import random

from kdsync.ordering.messages import Message
from kdsync.wire_format.messages import decode_message, encode_message
from tests.unit.ordering_pump import (
    ELECTION_DEADLINE,
    THREE,
    TIMING,
    Pump,
    assert_same_order_everywhere,
)


def test_replayed_and_reordered_old_messages_leave_the_order_unchanged() -> None:
    pump = Pump(THREE)
    wire: list[tuple[str, str, bytes]] = []  # every frame that crossed a link

    def record(sender: str, receiver: str, message: Message) -> bool:
        wire.append((sender, receiver, encode_message(message)))
        return False

    pump.drop = record
    pump.run_until(lambda: pump.leader() is not None, ELECTION_DEADLINE, "first election")
    pump.produce("a", 5)
    pump.run_until(pump.all_delivered_everywhere, ELECTION_DEADLINE, "first events")
    first_leader = pump.leader()
    assert first_leader is not None
    pump.crash(first_leader)
    pump.run_until(lambda: pump.leader() is not None, ELECTION_DEADLINE, "re-election")
    pump.start(first_leader)
    pump.produce("b", 5)
    pump.run_until(pump.all_delivered_everywhere, ELECTION_DEADLINE, "second events")
    before = assert_same_order_everywhere(pump, THREE.members)
    leader = pump.leader()
    assert leader is not None
    term = pump.node(leader).term
    recorded = list(wire)
    pump.drop = lambda sender, receiver, message: False

    # Replay everything as it was sent, then again reordered, each frame decoded as
    # the receiving sidecar would.
    replay = recorded + random.Random(16).sample(recorded, len(recorded))
    for sender, receiver, frame in replay:
        pump.node(receiver).receive(sender, decode_message(frame))
        pump.pump()
    for _ in range(3 * TIMING.election_ticks):
        pump.tick()

    after = assert_same_order_everywhere(pump, THREE.members)
    assert after == before, "the replay changed what was delivered"
    assert pump.leader() == leader and pump.node(leader).term == term
    # And the group still orders new events after the replay.
    pump.produce("c", 3)
    pump.run_until(pump.all_delivered_everywhere, ELECTION_DEADLINE, "events after the replay")
    assert assert_same_order_everywhere(pump, THREE.members)[: len(before)] == before
    assert len(recorded) > 50, "the replay exercised too little traffic to mean anything"
