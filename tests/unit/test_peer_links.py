"""``PeerLinks``, the driver's frame port over the peer transport: a member added to the
group at runtime is dialled at the address its configuration entry carries, and the
driver tells the port about a new configuration before it sends anything under it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import pytest

from kdsync.driver import DriverPorts, MemberDriver
from kdsync.driver.peer_links import PeerLinks
from kdsync.ordering import (
    Configuration,
    Delivery,
    Entry,
    GroupSpec,
    HardState,
    LedgerState,
    OrderingNode,
    RecoveredState,
    Role,
    Timing,
)
from kdsync.ordering.log import ReplicatedLog
from kdsync.ordering.messages import RecoverRequest
from kdsync.ordering.witness import recover_reply
from kdsync.transport import PeerTransport
from kdsync.transport.address import parse_address
from kdsync.transport.base import validate_member_name
from kdsync.wire_format.messages import decode_message, encode_message

W_ADDRESS = "10.0.0.9:7400"


@dataclass
class FakeTransport:
    """The parts of a PeerTransport that PeerLinks uses, behaving like TcpTransport's:
    ``send`` to a stranger raises, ``add_peer`` refuses a live peer or ourselves."""

    member: str
    known: dict[str, str]
    membership_changed: bool = False
    introduce: Callable[[str, str, int], bool] | None = None
    advertised_address: str | None = None
    config_index: int = 0
    added: list[tuple[str, str]] = field(default_factory=list)
    sent: list[tuple[str, bytes]] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)

    @property
    def peers(self) -> tuple[str, ...]:
        return tuple(self.known)

    def send(self, peer: str, frame: bytes) -> bool:
        if peer not in self.known:
            raise ValueError(f"{peer!r} is not another member of the group")
        if peer in self.retired:
            return False
        self.sent.append((peer, frame))
        return True

    def add_peer(self, peer: str, address: str) -> bool:
        if peer == self.member or (self.known.get(peer) == address and peer not in self.retired):
            return False
        validate_member_name(peer)
        parse_address(address)
        self.added.append((peer, address))
        self.known[peer] = address
        if peer in self.retired:
            self.retired.remove(peer)  # back from retirement, as TcpTransport does
        return True

    def retire_peer(self, peer: str) -> bool:
        if peer not in self.known or peer in self.retired:
            return False
        self.retired.append(peer)
        return True


def _links(member: str = "a", *peers: str) -> tuple[PeerLinks, FakeTransport]:
    transport = FakeTransport(member, {p: f"10.0.0.1:{7400 + i}" for i, p in enumerate(peers)})
    return PeerLinks(cast(PeerTransport, transport)), transport


def test_a_member_added_with_an_address_is_dialled_and_frames_reach_it() -> None:
    links, transport = _links("a", "b")
    assert links.send("w", b"too early") is False, "w is no peer yet"
    config = Configuration(("a", "b", "w"), frozenset({"w"}), addresses=(("w", W_ADDRESS),))

    links.follow_configuration(config, 9)
    assert transport.added == [("w", W_ADDRESS)], "only the member with an address"
    assert transport.membership_changed is True
    assert transport.advertised_address is None, "a's address is its startup file's"
    assert links.send("w", b"append") is True
    assert transport.sent == [("w", b"append")]

    # The same configuration again (or one the member is in already) dials nobody twice.
    links.follow_configuration(config, 9)
    assert transport.added == [("w", W_ADDRESS)]


def test_membership_changed_follows_where_the_configuration_came_from() -> None:
    links, transport = _links("a", "b", "c")
    startup = Configuration(("a", "b", "c"))
    links.follow_configuration(startup, 0)
    assert transport.membership_changed is False, "the startup file's: nothing changed"
    links.follow_configuration(startup.without("c"), 7)
    assert transport.membership_changed is True
    # The change was cut from the log: the startup file's configuration is back.
    links.follow_configuration(startup, 0)
    assert transport.membership_changed is False
    assert transport.added == []


def test_a_member_nobody_can_reach_is_logged_once_and_frames_to_it_are_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    links, transport = _links("a", "b")
    # d joined with no address (not through `kdsync members add`): no one can dial it.
    config = Configuration(("a", "b", "d"))
    links.follow_configuration(config, 4)
    links.follow_configuration(config, 4)
    links.follow_configuration(Configuration(("a", "b", "d"), learners=("e",)), 5)
    about_d = [r for r in caplog.records if "member d is in the group" in r.getMessage()]
    assert len(about_d) == 1, [r.getMessage() for r in caplog.records]
    assert about_d[0].levelno == logging.ERROR
    assert "no peer address" in about_d[0].getMessage()
    assert not any("member b is in the group" in r.getMessage() for r in caplog.records), (
        "b is in the startup file: it is reachable"
    )
    assert transport.added == []
    assert links.send("d", b"x") is False, "dropped, not an exception"
    assert links.send("b", b"y") is True
    assert transport.sent == [("b", b"y")]


def test_an_unusable_address_in_the_log_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    links, transport = _links("a", "b")
    config = Configuration(("a", "b", "w"), frozenset({"w"}), addresses=(("w", "no port here"),))
    links.follow_configuration(config, 3)
    assert transport.added == []
    assert any(
        "no port here" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records
    )
    assert links.send("w", b"x") is False


@dataclass
class _NodeView:
    """What ``retire_departed`` reads of a node."""

    config: Configuration
    config_index: int
    commit_index: int
    role: Role = Role.FOLLOWER

    def status(self) -> _NodeView:
        return self


def test_a_member_that_dials_before_our_log_names_it_is_linked_until_a_removal_commits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Our log is behind m3's addition: m3's dial (its membership from its log) is taken
    and answered at the address its hello gave; being outside our configuration does not
    retire it, a committed configuration that removes it does."""
    links, transport = _links("a", "b", "c")
    startup = Configuration(("a", "b", "c"))
    links.follow_configuration(startup.without("c"), 5)  # our log: c left at index 5
    assert transport.introduce is not None, "the links answer the transport's question"
    assert transport.introduce("m3", "10.0.0.3:7400", 12) is True
    assert transport.added == [("m3", "10.0.0.3:7400")]
    assert links.send("m3", b"append reply") is True
    assert transport.introduce("m3", "10.0.0.3:7400", 12) is True, "linked already"
    assert len(transport.added) == 1, "not dialled twice"
    assert transport.introduce("a", "10.0.0.1:1", 12) is False, "ourselves"
    assert transport.introduce("m4", "no port", 12) is False
    assert any("m4" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    assert links.send("m4", b"x") is False
    # A member whose configuration is not past ours, which does not name it, left the
    # group (or never joined): not linked.
    assert transport.introduce("old", "10.0.0.7:7400", 5) is False
    assert links.send("old", b"x") is False

    node = cast(OrderingNode, _NodeView(startup.without("c"), 5, 10))
    assert links.retire_departed(node) == ["c"], "m3 is not retired for being unknown to us"
    # Our log catches up: the configuration that added m3 (the log's address wins) ...
    added = Configuration(
        ("a", "b", "c", "m3"), addresses=(("m3", "10.0.0.3:7500"), ("a", "10.0.0.1:7600"))
    )
    links.follow_configuration(added, 12)
    assert transport.added[-1] == ("m3", "10.0.0.3:7500")
    assert transport.advertised_address == "10.0.0.1:7600", "what our hellos give"
    # ... and, later, one that removes it: once that commits, m3 is retired.
    node = cast(OrderingNode, _NodeView(startup, 20, 20))
    assert links.retire_departed(node) == ["m3"]


def test_an_introduced_member_is_retired_once_our_log_has_committed_its_index() -> None:
    """A member linked because it dialled us (its configuration at index 12) whose addition
    our log never shows (it was cut, and no membership change came since: our
    configuration is still the startup file's, at index 0): once our log has committed
    index 12, it is retired, not linked for good. So is a removed member that claims an
    index just past ours to be linked again."""
    links, transport = _links("a", "b", "c")
    assert transport.introduce is not None
    assert transport.introduce("m3", "10.0.0.3:7400", 12) is True
    startup = Configuration(("a", "b", "c"))
    assert links.retire_departed(cast(OrderingNode, _NodeView(startup, 0, 11))) == []
    assert links.retire_departed(cast(OrderingNode, _NodeView(startup, 0, 12))) == ["m3"]
    assert links.retire_departed(cast(OrderingNode, _NodeView(startup, 0, 10_000))) == []

    links.follow_configuration(startup.without("c"), 20)
    without_c = cast(OrderingNode, _NodeView(startup.without("c"), 20, 20))
    assert links.retire_departed(without_c) == ["c"]
    assert transport.introduce("c", "10.0.0.66:7400", 21) is True, "its word, for now"
    assert links.send("c", b"x") is True
    assert links.retire_departed(without_c) == []
    assert links.retire_departed(cast(OrderingNode, _NodeView(startup.without("c"), 20, 21))) == [
        "c"
    ], "our log committed past its claim without adding it"
    assert links.send("c", b"x") is False


def test_a_member_our_older_configuration_retired_is_linked_again_when_it_dials_from_a_newer() -> (
    None
):
    """A new member seeded before another's addition (CI seed 1005408): its startup file
    names m3, but the configuration it was seeded with does not, so it retires m3; m3,
    added since and now leading, dials it with its configuration at index 41. Retired for
    good, the new member could not answer m3's Appends and would never catch up."""
    links, transport = _links("m4", "m0", "m1", "m3")
    seeded = Configuration(("m0", "m1", "m4"))
    links.follow_configuration(seeded, 0)
    node = cast(OrderingNode, _NodeView(seeded, 0, 5))
    assert links.retire_departed(node) == ["m3"]
    assert links.send("m3", b"x") is False
    assert transport.introduce is not None
    assert transport.introduce("m3", "10.0.0.3:7400", 41) is True
    assert transport.added[-1] == ("m3", "10.0.0.3:7400")
    assert links.send("m3", b"append reply") is True
    assert links.retire_departed(node) == [], "not while our configuration is behind m3's"
    # A member that left, dialling with a configuration no newer than ours, stays retired.
    links.follow_configuration(Configuration(("m0", "m1", "m3", "m4")), 41)
    gone = cast(OrderingNode, _NodeView(Configuration(("m0", "m3", "m4")), 50, 50))
    assert links.retire_departed(gone) == ["m1"]
    assert transport.introduce("m1", "10.0.0.1:7400", 30) is False
    assert links.send("m1", b"x") is False


def test_a_claim_heard_before_retirement_keeps_the_link() -> None:
    """m3's connection came in (its hello at index 41) before our first look at our
    configuration, which does not name it: the link it made must not be retired, since
    no new hello would come to undo it."""
    links, transport = _links("m4", "m0", "m1", "m3")
    assert transport.introduce is not None
    assert transport.introduce("m3", "10.0.0.1:7402", 41) is True
    assert transport.added == [], "linked already: nothing to dial"
    seeded = Configuration(("m0", "m1", "m4"))
    assert links.retire_departed(cast(OrderingNode, _NodeView(seeded, 0, 5))) == []
    assert links.retire_departed(cast(OrderingNode, _NodeView(seeded, 0, 40))) == []
    assert links.retire_departed(cast(OrderingNode, _NodeView(seeded, 0, 41))) == ["m3"], (
        "our log committed m3's index, and what we follow still leaves it out"
    )


# ---------------------------------------------------------------- in the driver


Call = tuple[str, object, int | None]  # what, config or peer, config index


@dataclass
class RecordingFrames:
    """A FrameSender that records, in order, what it was told and sent, and routes the
    frames to the members that run."""

    member: str
    wire: list[tuple[str, str, bytes]]
    calls: list[Call] = field(default_factory=list)

    def send(self, peer: str, frame: bytes) -> bool:
        self.calls.append(("send", peer, None))
        self.wire.append((self.member, peer, frame))
        return True

    def follow_configuration(self, config: Configuration, index: int) -> None:
        self.calls.append(("follow", config, index))

    def reach_members(self, config: Configuration) -> None:
        self.calls.append(("reach", config, None))


@dataclass
class PendingLog:
    """A log port whose writes the test completes (they are durable at once)."""

    writing: bool = False

    def persist(
        self, hard_state: HardState | None, entries: list[Entry], truncate_from: int | None
    ) -> None:
        self.writing = True

    def load(self, spans: list[tuple[int, int]], max_bytes: int) -> None:
        pass

    def trim(self, below_index: int) -> None:
        pass


@dataclass
class PendingDelivery:
    """A delivery port whose transactions the test commits."""

    writing: bool = False

    def write(self, deliveries: Sequence[Delivery], ledger: LedgerState) -> None:
        self.writing = True

    def commit(self, positions: Mapping[tuple[str, int], int]) -> None:
        pass


class TwoDrivers:
    """Two data members, each a real OrderingNode under a real MemberDriver, their
    frames delivered in order; frames to anyone else only recorded."""

    def __init__(self) -> None:
        group = GroupSpec(("a", "b"))
        self.wire: list[tuple[str, str, bytes]] = []
        self.frames: dict[str, RecordingFrames] = {}
        self.logs: dict[str, PendingLog] = {}
        self.deliveries: dict[str, PendingDelivery] = {}
        self.drivers: dict[str, MemberDriver] = {}
        for number, member in enumerate(group.members, start=1):
            self.frames[member] = RecordingFrames(member, self.wire)
            self.logs[member] = PendingLog()
            self.deliveries[member] = PendingDelivery()
            node = OrderingNode(member, group, Timing(), incarnation=number)
            ports = DriverPorts(
                self.logs[member], self.deliveries[member], None, self.frames[member]
            )
            self.drivers[member] = MemberDriver(node, ports)

    def settle(self) -> None:
        for _ in range(10_000):
            progressed = False
            for member, driver in self.drivers.items():
                if self.logs[member].writing:
                    self.logs[member].writing = False
                    driver.log_persisted()
                    progressed = True
                if self.deliveries[member].writing:
                    self.deliveries[member].writing = False
                    driver.transaction_committed()
                    progressed = True
            while self.wire:
                sender, receiver, frame = self.wire.pop(0)
                if receiver in self.drivers:
                    self.drivers[receiver].receive_frame(sender, frame)
                    progressed = True
            if not progressed:
                return
        pytest.fail("the drivers never went quiet")

    def run_until(self, done: Callable[[], bool], ticks: int, what: str) -> None:
        for _ in range(ticks):
            if done():
                return
            for driver in self.drivers.values():
                driver.tick()
            self.settle()
        pytest.fail(f"{what}: not within {ticks} ticks")

    def leader(self) -> str | None:
        leaders = [m for m, d in self.drivers.items() if d.node.role is Role.LEADER]
        return leaders[0] if len(leaders) == 1 else None


def _first_follow_with(calls: list[Call], member: str) -> int:
    for at, (kind, config, _) in enumerate(calls):
        if kind == "follow" and member in cast(Configuration, config).members:
            return at
    raise AssertionError(f"never told of a configuration with {member}: {calls}")


def _first_send_to(calls: list[Call], peer: str) -> int:
    for at, (kind, to, _) in enumerate(calls):
        if kind == "send" and to == peer:
            return at
    raise AssertionError(f"nothing sent to {peer}: {calls}")


def test_the_driver_follows_a_new_configuration_before_sending_to_its_new_member() -> None:
    group = TwoDrivers()
    for member, frames in group.frames.items():
        # At construction, before anything is sent: the startup file's configuration.
        assert frames.calls[0] == ("follow", Configuration(("a", "b")), 0), member
    group.run_until(lambda: group.leader() is not None, 200, "an election")
    leader = group.leader()
    assert leader is not None
    follower = next(m for m in group.drivers if m != leader)
    node = group.drivers[leader].node
    group.run_until(lambda: node.commit_index >= node.log.last_index, 50, "the no-op")

    added = node.config.with_witness("w", "127.0.0.1:9")
    assert group.drivers[leader].propose_configuration(added) is None
    group.settle()
    index = node.config_index
    assert index == node.log.last_index > 0

    calls = group.frames[leader].calls
    before_w = calls[: _first_send_to(calls, "w")]
    assert ("follow", added, index) in before_w, (
        f"a frame went to w before the configuration adding it was followed: {calls}"
    )
    assert [c for c in calls if c[0] == "follow"][-1] == ("follow", added, index)

    # The follower takes the change from the leader's Append, with the address.
    group.run_until(lambda: not node.change_pending, 50, "the change to commit")
    follower_calls = group.frames[follower].calls
    at = _first_follow_with(follower_calls, "w")
    config = follower_calls[at][1]
    assert isinstance(config, Configuration)
    assert config.address_of("w") == "127.0.0.1:9"
    assert follower_calls[at][2] == index
    assert ("send", "w", None) not in follower_calls[:at]


def test_a_member_restarted_after_a_witness_joined_dials_it_from_its_ledger() -> None:
    """The startup file still lists a and b only; the ledger has the change that added
    w: the driver's first act is to have the transport reach w."""
    with_w = Configuration(("a", "b", "w"), frozenset({"w"}), addresses=(("w", W_ADDRESS),))
    ledger = LedgerState(5, 1, {}, {}, with_w, 4)
    node = OrderingNode(
        "a", GroupSpec(("a", "b")), Timing(), incarnation=1, recovered=RecoveredState(ledger=ledger)
    )
    links, transport = _links("a", "b")
    MemberDriver(node, DriverPorts(PendingLog(), PendingDelivery(), None, links))
    assert transport.added == [("w", W_ADDRESS)]
    assert transport.membership_changed is True


def test_a_restarting_witness_reaches_a_member_added_since_before_asking_it() -> None:
    """A witness restarts with a startup file that predates the addition of w (as the
    files of members that were there before may). Its recovery asks everyone the
    answers name: m1's answer shows w, with its address. The driver must hand that
    configuration to the port before the request to w goes out, or the port (which
    knows only the file's members) drops it and the witness waits for ever."""
    grown = Configuration(
        ("m1", "m2", "m3", "x", "w"), frozenset({"x", "w"}), (), (("w", W_ADDRESS),)
    )
    node = OrderingNode(
        "x", GroupSpec(("m1", "m2", "m3", "x"), frozenset({"x"})), Timing(), incarnation=7
    )
    frames = RecordingFrames("x", [])
    driver = MemberDriver(node, DriverPorts(None, None, None, frames))
    for _ in range(5 * Timing().election_ticks):
        driver.tick()
        if any(call[0] == "send" for call in frames.calls):
            break
    requests = [decode_message(frame) for _, _, frame in frames.wire]
    asked = [peer for _, peer, _ in frames.wire]
    assert sorted(set(asked)) == ["m1", "m2", "m3"], asked
    request = requests[0]
    assert isinstance(request, RecoverRequest)
    answer = recover_reply(3, ReplicatedLog(), 0, request, 1 << 20, grown)
    driver.receive_frame("m1", encode_message(answer))
    reached = [i for i, call in enumerate(frames.calls) if call == ("reach", grown, None)]
    to_w = [i for i, call in enumerate(frames.calls) if call[:2] == ("send", "w")]
    assert reached and to_w, frames.calls
    assert reached[0] < to_w[0], frames.calls
    # Through the real port: w is dialled at the recorded address before it is asked.
    transport = FakeTransport("x", {"m1": "h:1", "m2": "h:2", "m3": "h:3"})
    links = PeerLinks(cast(PeerTransport, transport))
    links.reach_members(grown)
    assert transport.added == [("w", W_ADDRESS)]
    assert links.send("w", b"ask")


@dataclass
class _Status:
    commit_index: int


@dataclass
class _Node:
    """What ``retire_departed`` reads of an OrderingNode."""

    role: Role
    config: Configuration
    config_index: int
    commit_index: int

    def status(self) -> _Status:
        return _Status(self.commit_index)


def test_members_that_left_are_retired_once_their_removal_commits_not_before(
    caplog: pytest.LogCaptureFixture,
) -> None:
    links, transport = _links("a", "b", "c")
    without_c = Configuration(("a", "b", "w"), frozenset({"w"}), addresses=(("w", W_ADDRESS),))
    links.follow_configuration(without_c, 8)

    def retire(role: Role, commit_index: int) -> list[str]:
        node = _Node(role, without_c, 8, commit_index)
        return links.retire_departed(cast(OrderingNode, node))

    assert retire(Role.FOLLOWER, 7) == [], "not committed: the change may still be cut"
    assert retire(Role.RECOVERING, 9) == [], "a recovering witness keeps whom it must ask"
    assert retire(Role.FOLLOWER, 9) == ["c"]
    assert transport.retired == ["c"] and "w" not in transport.retired
    assert links.send("c", b"late") is False
    assert not [r for r in caplog.records if "member c" in r.getMessage()], "retired: quiet"
    assert retire(Role.LEADER, 10) == [], "once only"
