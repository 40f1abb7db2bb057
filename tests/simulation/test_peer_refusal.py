"""The simulator with the product's peer links (``product_links``: the sidecar's own
``PeerLinks``) refuses a member no startup file or configuration names, as the peer
handshake does ("'x' is not another member"): a witness started before its addition (the
operator starts one before it proposes it) hears nothing until the change is in the
others' logs. The simulator's own network lets any member in: such a witness recovered
from the group at once.

With them, CI seeds found two liveness gaps (now closed) of a member whose log is behind
a data member's runtime addition: it refused the added member (1000407, 1001271), or
retired it because the configuration it was seeded with did not name it (1005408,
1007066, 1009835), and once that member led, the lagging one could not answer it. A
member whose membership comes from its log now says so when it dials, with where it
listens and its configuration index (the hello's ``membershipChanged``, ``address`` and
``configIndex``), and a member whose configuration is older links it
(``PeerLinks.heard_from``) and keeps it until its own catches up (docs/ordering.md,
"The simulator")."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from kdsync.driver import DriverLimits
from kdsync.ordering import GroupSpec, OrderingNode, Role, Timing
from kdsync.simulation import make_scenario, run_scenario
from kdsync.simulation.member import SimMember
from kdsync.simulation.network import LinkFaults, SimNetwork

TIMING = Timing()
GROUP = GroupSpec(("a", "b", "c"))


def _member(name: str, group: GroupSpec, network: SimNetwork, seed: int) -> SimMember:
    return SimMember(
        name,
        group,
        TIMING,
        network,
        random.Random(seed),
        OrderingNode,
        8,
        DriverLimits(),
        product_links=True,
    )


def test_a_witness_started_before_its_addition_hears_nothing_until_the_change_is_in_the_logs() -> (
    None
):
    network = SimNetwork(random.Random(1), LinkFaults(max_delay=1))
    members = {name: _member(name, GROUP, network, seed) for seed, name in enumerate(GROUP.members)}
    now = 0

    def step() -> None:
        nonlocal now
        now += 1
        for sender, receiver, frame in network.due(now):
            origin = members[sender]
            members[receiver].deliver(sender, frame, origin.incarnations, origin.hello_config_index)
        for member in members.values():
            member.step(now)

    def leader() -> SimMember | None:
        found = [m for m in members.values() if m.node is not None and m.node.role == Role.LEADER]
        return found[0] if found else None

    for _ in range(20 * TIMING.election_ticks):
        step()
        if leader() is not None:
            break
    first = leader()
    assert first is not None, "no leader elected"
    # The witness starts with its startup file: the voters and itself.
    members["x"] = witness = _member(
        "x", GroupSpec(("a", "b", "c", "x"), witnesses=frozenset({"x"})), network, 9
    )
    for _ in range(10 * TIMING.election_ticks):
        step()
    assert witness.node is not None and witness.node.role == Role.RECOVERING, witness.node.role
    assert all(m.node is not None and m.node.config.members == GROUP.members
               for n, m in members.items() if n != "x")  # fmt: skip
    # Its addition, with the address the product records: once it is in their logs, the
    # members link it, answer it, and it recovers into the group.
    current = leader()
    assert current is not None and current.node is not None
    current.propose(current.node.config.with_witness("x", "x.sim:7400"))
    for _ in range(20 * TIMING.election_ticks):
        step()
        if witness.node.role != Role.RECOVERING:
            break
    assert witness.node.role != Role.RECOVERING, "the added witness never recovered"
    assert "x" in witness.node.config.members


@pytest.mark.parametrize("seed", [1000407, 1001271, 1005408, 1007066, 1009835])
def test_a_member_behind_a_runtime_addition_follows_the_added_member_when_it_leads(
    seed: int,
) -> None:
    """The lagging member takes the added leader's link (it dialled with its membership
    from its log), answers it, and catches up to the configuration that adds it."""
    outcome = run_scenario(replace(make_scenario(seed), product_links=True))
    assert outcome.ok, outcome.report()
