"""A member that cannot write its T-global keeps ordering in bounded memory (issue #13):
committed entries it has stored leave memory past ``max_log_bytes`` and are read back
from its ordering log when it applies them."""

from __future__ import annotations

from kdsync.ordering import Timing
from kdsync.ordering.log import entry_size
from tests.unit.ordering_pump import (
    ELECTION_DEADLINE,
    THREE,
    Pump,
    assert_same_order_everywhere,
    halted_follower,
)

BOUND = 300  # bytes of committed, stored entries a member keeps in memory


def test_a_halted_member_keeps_ordering_in_bounded_memory_and_catches_up() -> None:
    timing = Timing(max_log_bytes=BOUND, max_apply_bytes=60, retained_applied=3)
    pump, leader, follower = halted_follower(timing)
    node = pump.node(follower)
    largest = 0
    held = 0
    for _ in range(60):
        for member in THREE.members:
            pump.produce(member, 2)
        pump.tick()
        held = max(held, node.log_memory_bytes())
        largest = max([largest, *(entry_size(e) for e in pump.disks[follower].log)])
    # It votes and stores on: the group commits everything, it has applied only the
    # apply window's worth, and its own ordering log holds the rest.
    assert node.commit_index == pump.node(leader).commit_index
    behind = node.commit_index - len(pump.unwritten.get(follower, ())) - 1
    assert behind > 100, node.status()
    assert pump.disks[follower].log[-1].index == node.commit_index
    stored = sum(entry_size(e) for e in pump.disks[follower].log)
    assert stored > 10 * BOUND
    # Its memory stayed within the bound (plus the one entry that crosses it).
    assert 0 < held <= BOUND + largest, (held, BOUND, largest)

    served = pump.loads_served
    pump.resume(follower)
    pump.run_until(pump.all_delivered_everywhere, 200, "the halted member catches up")
    assert pump.loads_served > served, "what it had not applied came back from its log"
    assert_same_order_everywhere(pump, THREE.data_members)
    assert pump.node(follower).log_memory_bytes() <= BOUND + largest


def test_without_a_bound_a_halted_member_holds_everything_it_orders() -> None:
    """The measure above is not vacuous: the default bound (64 MiB) is never reached
    here, and the same traffic stays in memory."""
    pump, _, follower = halted_follower(Timing(max_apply_bytes=60, retained_applied=3))
    for _ in range(60):
        for member in THREE.members:
            pump.produce(member, 2)
        pump.tick()
    node = pump.node(follower)
    assert node.log_memory_bytes() > 10 * BOUND
    assert pump.loads_served == 0


def test_a_member_that_stored_entries_but_never_heard_them_committed_keeps_them() -> None:
    """Only committed entries leave memory: one that might still be overwritten by a new
    leader stays, however far over the bound the log is (the pump checks after every
    step that nothing past the commit index was compacted)."""
    timing = Timing(max_log_bytes=0)
    pump = Pump(THREE, timing)
    pump.run_until(lambda: pump.leader() is not None, ELECTION_DEADLINE, "election")
    leader = pump.leader()
    assert leader is not None
    follower, other = (m for m in THREE.members if m != leader)
    # The follower stores the leader's entries, but the leader hears no one: no commit.
    pump.cut.update({(follower, leader), (other, leader)})
    pump.produce(leader, 5)
    node = pump.node(follower)
    assert node.log.last_index > node.commit_index
    assert node.log.snapshot_index <= node.commit_index
    assert node.log_memory_bytes() > 0
    pump.cut.clear()
    pump.run_until(pump.all_delivered_everywhere, 200, "everything everywhere")
    assert_same_order_everywhere(pump, THREE.data_members)


def test_a_leader_admits_batches_only_while_its_uncommitted_ones_fit() -> None:
    """Uncommitted entries may never leave memory, so a leader bounds them at admission:
    cut off from its followers, it stops ordering at ``max_uncommitted_bytes`` (plus the
    batch that crosses it), and the rest waits in the origins' outboxes, not in logs."""
    timing = Timing(max_uncommitted_bytes=100)
    pump = Pump(THREE, timing)
    pump.run_until(lambda: pump.leader() is not None, ELECTION_DEADLINE, "election")
    leader = pump.leader()
    assert leader is not None
    node = pump.node(leader)
    pump.cut.update({(leader, m) for m in THREE.members if m != leader})
    pump.produce(leader, 30)
    batches = [e.batch for e in node.log.slice(node.commit_index + 1, node.log.last_index)]
    held = sum(b.size_bytes() for b in batches if b is not None)
    largest = max(b.size_bytes() for b in batches if b is not None)
    assert 0 < held <= 100 + largest, held
    assert len(batches) < 30
    pump.cut.clear()
    pump.run_until(pump.all_delivered_everywhere, 300, "everything everywhere after healing")
    assert_same_order_everywhere(pump, THREE.data_members)
