"""``kdsync members remove`` and ``add --witness`` end to end below HTTP: what a member
answers a change (``kdsync.driver.membership_request``, against real OrderingNodes), and
how the command drains, finds the leader, retries and waits
(``kdsync.runtime.members_command``, against a scripted group)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kdsync.driver import MemberDriver
from kdsync.driver.membership_request import Outcome, add_member, remove_member
from kdsync.ordering import GroupSpec
from kdsync.runtime import members_command
from kdsync.runtime.http_api import _from_this_host, build_app
from kdsync.runtime.members_command import MembersCommandError
from kdsync.runtime.sidecar import Sidecar
from tests.support.node_driver import NodeDriver
from tests.unit.ordering_pump import ELECTION_DEADLINE, THREE, Pump


def _driver(pump: Pump, member: str) -> MemberDriver:
    return cast(MemberDriver, NodeDriver(pump.node(member)))


def _elected(group: GroupSpec) -> tuple[Pump, str]:
    pump = Pump(group)
    pump.run_until(lambda: pump.leader() is not None, ELECTION_DEADLINE, "election")
    leader = pump.leader()
    assert leader is not None
    node = pump.node(leader)
    pump.run_until(lambda: node.commit_index >= node.log.last_index, 50, "the no-op")
    return pump, leader


def test_a_member_answers_a_removal_by_what_the_caller_should_do() -> None:
    pump, leader = _elected(THREE)
    follower, other = (m for m in THREE.members if m != leader)

    answer = remove_member(_driver(pump, follower), other)
    assert answer.outcome == Outcome.ASK_AGAIN and answer.leader == leader

    answer = remove_member(_driver(pump, leader), "zed")
    assert answer.outcome == Outcome.NOT_A_MEMBER
    assert answer.reason is not None and "a, b, c" in answer.reason

    answer = remove_member(_driver(pump, leader), leader)
    assert answer.outcome == Outcome.ASK_AGAIN
    assert answer.reason is not None and "hands leadership over" in answer.reason

    pump, leader = _elected(THREE)
    follower, other = (m for m in THREE.members if m != leader)
    answer = remove_member(_driver(pump, leader), other)
    assert answer.outcome == Outcome.APPENDED
    node = pump.node(leader)
    assert answer.index == node.log.last_index
    assert set(node.config.members) == {leader, follower}
    pump.run_until(lambda: not node.change_pending, 50, "the removal to commit")
    assert pump.node(follower).config == node.config


def test_a_removal_that_would_break_the_group_is_refused_not_retried() -> None:
    pump, leader = _elected(GroupSpec(("a", "b", "w"), frozenset({"w"})))
    data = next(m for m in ("a", "b") if m != leader) if leader != "w" else "a"
    answer = remove_member(_driver(pump, leader), data)
    assert answer.outcome == Outcome.REFUSED
    assert answer.reason is not None and "more voting data members than witnesses" in answer.reason


@pytest.mark.parametrize(
    ("remote", "local"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.7", False),
        ("::ffff:10.0.0.7", False),
        (None, False),
        ("", False),
    ],
)
def test_membership_changes_are_taken_from_this_host_only(remote: str | None, local: bool) -> None:
    assert _from_this_host(remote) is local


# ---------------------------------------------------------------- the command


@dataclass
class ScriptedGroup:
    """Members' /status documents and /membership answers, changed as the test goes."""

    statuses: dict[str, dict[str, Any]]
    answers: dict[str, Iterator[tuple[int, dict[str, Any]]]] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)
    bodies: list[Any] = field(default_factory=list)  # what each POST /membership sent
    # GET /source-backlog answers by URL (default: drained)
    backlogs: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    now: float = 0.0
    on_sleep: list[Any] = field(default_factory=list)

    def fetch_status(self, url: str, timeout: float = 5.0) -> dict[str, Any]:
        return dict(self.statuses[url]) if url in self.statuses else {"unreachable": "refused"}

    def post(self, url: str, body: Any, timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
        self.asked.append(url)
        self.bodies.append(body)
        return next(self.answers[url])

    def get(self, url: str, path: str, timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
        assert path == "/source-backlog"
        return self.backlogs.get(url, (200, {"backlog": {}}))

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for step in self.on_sleep:
            step(self)


def _status(member: str, role: str, term: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "member": member,
        "role": role,
        "term": term,
        "phase": "running",
        "peer": f"{member}.example:7400",
        "configuration": {
            "voters": ["m1", "m2", "m3"],
            "witnesses": [],
            "learners": [],
            "index": 0,
            "committed": True,
        },
        **extra,
    }


JSON = "application/json"
AFTER = {"voters": ["m2", "m3"], "witnesses": [], "learners": [], "index": 9, "committed": True}


def _m1_leading_m2_and_m3() -> ScriptedGroup:
    return ScriptedGroup(
        {
            "u1": _status("m1", "leader"),
            "u2": _status("m2", "follower"),
            "u3": _status("m3", "follower"),
        }
    )


def _run(group: ScriptedGroup, monkeypatch: pytest.MonkeyPatch, member: str, **kw: Any) -> str:
    monkeypatch.setattr(members_command, "fetch_status", group.fetch_status)
    monkeypatch.setattr(members_command, "post_membership", group.post)
    monkeypatch.setattr(members_command, "get_json", group.get)
    lines: list[str] = []
    members_command.remove(
        list(group.statuses),
        member,
        timeout=kw.get("timeout", 60.0),
        drain=kw.get("drain", True),
        out=lines.append,
        clock=group.clock,
        sleep=group.sleep,
    )
    return "\n".join(lines)


def test_removing_the_leader_drains_it_then_asks_the_next_leader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = _m1_leading_m2_and_m3()
    group.backlogs["u1"] = (200, {"backlog": {"t[0]": 3}})
    group.answers["u1"] = iter([(409, {"reason": "the change removes the leader: ask again"})])
    group.answers["u2"] = iter([(200, {"outcome": "appended", "index": 9})])

    def events_flow(g: ScriptedGroup) -> None:
        if g.now >= 2.0:  # m1's last records reach its T-global after a while
            g.backlogs.pop("u1", None)
        if g.asked == ["u1"]:  # it handed over: m2 leads in term 2
            g.statuses["u1"]["role"] = "follower"
            g.statuses["u2"].update(role="leader", term=2)
        if len(g.asked) == 2:  # the removal committed at m2 and m3
            for url in ("u2", "u3"):
                g.statuses[url]["configuration"] = AFTER

    group.on_sleep.append(events_flow)
    output = _run(group, monkeypatch, "m1")
    assert group.asked == ["u1", "u2"], "asked the leader, then the next one"
    assert group.now >= 2.0, "proposed only once drained"
    assert "m1 is out of the group: m2, m3 (index 9, committed)" in output
    assert "Stop m1's sidecar now" in output


def test_a_refused_removal_stops_with_the_leaders_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    group = ScriptedGroup({"u1": _status("m1", "leader"), "u2": _status("m2", "follower")})
    group.answers["u1"] = iter([(422, {"reason": "removing m2: a group needs 2 voters"})])
    with pytest.raises(MembersCommandError, match=r"m1 refused \(HTTP 422\): removing m2: a"):
        _run(group, monkeypatch, "m2", drain=False)


def test_a_name_outside_the_group_is_an_error_naming_the_members(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = ScriptedGroup({"u1": _status("m1", "leader")})
    with pytest.raises(MembersCommandError, match=r"m9 is not in .*: m1, m2, m3 \(index 0"):
        _run(group, monkeypatch, "m9")


def test_draining_a_member_that_does_not_answer_needs_no_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = ScriptedGroup({"u1": _status("m1", "leader"), "u2": _status("m2", "follower")})
    with pytest.raises(MembersCommandError, match="--no-drain"):
        _run(group, monkeypatch, "m3")


def test_a_member_still_busy_at_the_deadline_is_not_removed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = ScriptedGroup({"u1": _status("m1", "leader"), "u3": _status("m3", "follower")})
    group.backlogs["u3"] = (200, {"backlog": {"t[1]": 5}})
    with pytest.raises(MembersCommandError, match="stop producing to its source topics"):
        _run(group, monkeypatch, "m3", timeout=10.0)
    assert group.asked == [], "nothing was proposed"


def test_no_leader_taking_the_change_ends_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = ScriptedGroup({"u1": _status("m1", "leader"), "u2": _status("m2", "follower")})
    group.answers["u1"] = iter(
        [(409, {"reason": "the previous membership change has not committed yet"})] * 1000
    )
    with pytest.raises(MembersCommandError, match="no leader took the change"):
        _run(group, monkeypatch, "m2", drain=False, timeout=5.0)


def test_a_drain_asks_again_while_the_members_brokers_do_not_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = ScriptedGroup({"u1": _status("m1", "leader"), "u2": _status("m2", "follower")})
    group.backlogs["u2"] = (503, {"reason": "its Kafka cluster did not answer: timed out"})
    group.answers["u1"] = iter([(200, {"outcome": "appended", "index": 9})])

    def brokers_back(g: ScriptedGroup) -> None:
        if g.now >= 3.0:
            g.backlogs.pop("u2", None)
        if g.asked:
            g.statuses["u1"]["configuration"] = {**AFTER, "voters": ["m1", "m3"]}

    group.on_sleep.append(brokers_back)
    _run(group, monkeypatch, "m2")
    assert group.now >= 3.0, "no answer from the brokers is no drain"


def test_running_it_again_after_the_change_was_appended_waits_for_the_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pending = {**AFTER, "committed": False}
    group = ScriptedGroup(
        {
            "u1": _status("m1", "follower", term=2),  # still shows m1: an older log
            "u2": _status("m2", "leader", term=2, configuration=pending),
            "u3": _status("m3", "follower", term=2, configuration=pending),
        }
    )
    gone = {"outcome": "not-a-member", "reason": "no 'm1'", "configuration": pending}
    group.answers["u2"] = iter([(404, gone)])

    def commit(g: ScriptedGroup) -> None:
        for url in ("u2", "u3"):
            g.statuses[url]["configuration"] = AFTER

    group.on_sleep.append(commit)
    output = _run(group, monkeypatch, "m1")
    assert "out of the newest configuration already" in output
    assert "m1 is out of the group: m2, m3 (index 9, committed)" in output


def test_a_removal_cut_from_the_log_and_unreachable_leaders_are_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = _m1_leading_m2_and_m3()
    group.answers["u1"] = iter(
        [
            (0, {"reason": "unreachable: connection refused"}),
            (503, {"reason": "this member is recovering"}),
            (200, {"outcome": "appended", "index": 9}),
            (200, {"outcome": "appended", "index": 12}),
        ]
    )

    def cut_then_commit(g: ScriptedGroup) -> None:
        if len(g.asked) == 3:  # the first append is cut: the leader shows m3 again
            g.statuses["u1"]["configuration"]["index"] = 11
            g.statuses["u1"]["commitIndex"] = 11
        if len(g.asked) == 4:
            for url in ("u1", "u2"):
                g.statuses[url]["configuration"] = {
                    **AFTER,
                    "voters": ["m1", "m2"],
                    "index": 12,
                }

    group.on_sleep.append(cut_then_commit)
    output = _run(group, monkeypatch, "m3", drain=False)
    assert len(group.asked) == 4
    assert "was cut from the log" in output
    assert "m3 is out of the group: m1, m2 (index 12, committed)" in output


# ---------------------------------------------------------------- the endpoint


@dataclass
class EndpointSidecar:
    """What POST /membership uses of a Sidecar."""

    driver: MemberDriver | None
    allow: bool = True
    phase: str = "running"

    @property
    def config(self) -> Any:
        return SimpleNamespace(allow_membership_changes=self.allow)


def _post(sidecar: EndpointSidecar, body: bytes, content_type: str) -> tuple[int, dict[str, Any]]:
    async def go() -> tuple[int, dict[str, Any]]:
        app = build_app(cast(Sidecar, sidecar))
        async with TestClient(TestServer(app)) as client:
            response = await client.post(
                "/membership", data=body, headers={"Content-Type": content_type}
            )
            return response.status, await response.json()

    return asyncio.run(go())


def test_the_endpoint_is_off_unless_configured_and_takes_only_json() -> None:
    pump, leader = _elected(THREE)
    other = next(m for m in THREE.members if m != leader)
    body = json.dumps({"remove": other}).encode()
    code, answer = _post(EndpointSidecar(_driver(pump, leader), allow=False), body, JSON)
    assert code == 403 and "allowMembershipChanges" in answer["reason"]
    code, answer = _post(EndpointSidecar(_driver(pump, leader)), body, "text/plain")
    assert code == 415
    code, answer = _post(EndpointSidecar(_driver(pump, leader)), b'{"drop": "x"}', JSON)
    assert code == 400 and '{"remove"' in answer["reason"]
    code, answer = _post(EndpointSidecar(None, phase="recovering"), body, JSON)
    assert code == 503
    code, answer = _post(EndpointSidecar(_driver(pump, leader)), body, JSON)
    assert code == 200 and answer["outcome"] == "appended", answer
    assert answer["index"] == pump.node(leader).log.last_index
    assert other not in answer["configuration"]["voters"]
    assert answer["configuration"]["committed"] is False


def test_an_answer_that_is_not_kdsyncs_stops_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    group = ScriptedGroup({"u1": _status("m1", "leader"), "u2": _status("m2", "follower")})
    group.answers["u1"] = iter([(404, {"reason": "Not Found"})])  # e.g. a proxy
    with pytest.raises(MembersCommandError, match=r"m1 refused \(HTTP 404\): Not Found"):
        _run(group, monkeypatch, "m2", drain=False)


# ---------------------------------------------------------------- adding a witness

W_PEER = "10.0.0.9:7400"
ADD_W = {"add": "w", "witness": True, "peer": W_PEER}


def _body(value: Any) -> bytes:
    return json.dumps(value).encode()


def test_a_member_answers_a_witness_addition_by_what_the_caller_should_do() -> None:
    pump, leader = _elected(THREE)
    follower = next(m for m in THREE.members if m != leader)
    node = pump.node(leader)

    answer = add_member(_driver(pump, follower), "w", W_PEER, witness=True)
    assert answer.outcome == Outcome.ASK_AGAIN and answer.leader == leader
    assert "w" not in node.config.members

    answer = add_member(_driver(pump, leader), "w", W_PEER, witness=True)
    assert answer.outcome == Outcome.APPENDED, answer
    assert answer.index == node.log.last_index == node.config_index
    assert node.config.is_witness("w") and node.config.address_of("w") == W_PEER
    # Three of the four voters commit it: w need not run yet.
    pump.run_until(lambda: not node.change_pending, 50, "the addition to commit")
    for member in THREE.members:
        assert pump.node(member).config == node.config, member
        assert pump.node(member).config.address_of("w") == W_PEER, "the address travels"

    appended_at = node.config_index
    answer = add_member(_driver(pump, leader), "w", W_PEER, witness=True)
    assert answer.outcome == Outcome.ALREADY_A_MEMBER and answer.index == appended_at
    # Asked again at another address: refused, naming the way to move it.
    answer = add_member(_driver(pump, leader), "w", "10.0.0.10:7400", witness=True)
    assert answer.outcome == Outcome.REFUSED, answer
    assert answer.reason is not None and "remove it and add it again" in answer.reason
    assert node.log.last_index == appended_at and node.config.address_of("w") == W_PEER

    answer = add_member(_driver(pump, leader), follower, W_PEER, witness=True)
    assert answer.outcome == Outcome.REFUSED
    assert answer.reason is not None and "data member" in answer.reason
    assert node.log.last_index == appended_at and not node.config.is_witness(follower)


def test_a_witness_addition_that_would_break_the_group_is_refused() -> None:
    pump, leader = _elected(GroupSpec(("a", "b", "w"), frozenset({"w"})))
    node = pump.node(leader)
    before = node.log.last_index
    answer = add_member(_driver(pump, leader), "v", W_PEER, witness=True)
    assert answer.outcome == Outcome.REFUSED
    assert answer.reason is not None and "more voting data members than witnesses" in answer.reason
    assert node.log.last_index == before and "v" not in node.config.members


def test_the_endpoint_adds_a_witness_only_when_asked_properly() -> None:
    pump, leader = _elected(THREE)
    node = pump.node(leader)
    before = node.log.last_index
    on_leader = EndpointSidecar(_driver(pump, leader))

    code, answer = _post(EndpointSidecar(_driver(pump, leader), allow=False), _body(ADD_W), JSON)
    assert code == 403 and "allowMembershipChanges" in answer["reason"]
    for witness in (None, "yes", 1):
        code, answer = _post(
            on_leader, _body({"add": "d", "peer": W_PEER, "witness": witness}), JSON
        )
        assert code == 400 and '"witness": true' in answer["reason"], (witness, answer)
    code, answer = _post(on_leader, _body({"add": "d", "peer": W_PEER}), JSON)
    assert code == 400 and "backfill" in answer["reason"], answer
    for peer in ("nonsense", "10.0.0.9:port", "10.0.0.9:70000", 7400, None):
        code, answer = _post(on_leader, _body({**ADD_W, "peer": peer}), JSON)
        assert code == 400 and "'peer'" in answer["reason"], (peer, answer)
    code, answer = _post(on_leader, _body({"add": "w", "witness": True}), JSON)
    assert code == 400 and "'peer'" in answer["reason"], answer
    code, answer = _post(on_leader, _body({**ADD_W, "remove": "b"}), JSON)
    assert code == 400 and '{"add"' in answer["reason"], answer
    assert node.log.last_index == before and "w" not in node.config.members, "nothing appended"

    code, answer = _post(on_leader, _body(ADD_W), JSON)
    assert code == 200 and answer["outcome"] == "appended", answer
    assert answer["index"] == node.log.last_index > before
    config = answer["configuration"]
    assert "w" in config["voters"] and config["witnesses"] == ["w"]
    assert config["addresses"] == {"w": W_PEER}
    assert config["index"] == answer["index"] and config["committed"] is False

    code, answer = _post(on_leader, _body(ADD_W), JSON)
    assert code == 200 and answer["outcome"] == "already-a-member", answer
    assert answer["index"] == config["index"] == node.log.last_index


def test_the_endpoint_refuses_a_witness_name_no_member_could_reach() -> None:
    """A name the peer transport refuses (transport.validate_member_name) would put a
    voter in the log that no member can ever dial."""
    pump, leader = _elected(THREE)
    node = pump.node(leader)
    before = node.log.last_index
    code, answer = _post(
        EndpointSidecar(_driver(pump, leader)), _body({**ADD_W, "add": "w 2/x"}), JSON
    )
    assert code == 400, answer
    assert node.log.last_index == before and "w 2/x" not in node.config.members


WITH_W = {
    "voters": ["m1", "m2", "m3", "w"],
    "witnesses": ["w"],
    "learners": [],
    "addresses": {"w": W_PEER},
    "index": 9,
    "committed": True,
}


def _witness(**extra: Any) -> dict[str, Any]:
    """A witness's sidecar before it joined: its file names the group and itself."""
    started = {**WITH_W, "index": 0}
    started.pop("addresses")
    return _status(
        "w", "follower", **{"witness": True, "peer": W_PEER, "configuration": started, **extra}
    )


def _with_w() -> ScriptedGroup:
    group = _m1_leading_m2_and_m3()
    group.statuses["uw"] = _witness()
    return group


def _add(
    group: ScriptedGroup,
    monkeypatch: pytest.MonkeyPatch,
    member: str = "w",
    urls: list[str] | None = None,
    **kw: Any,
) -> list[tuple[float, str]]:
    """Run ``add``; what it printed, with the (scripted) time it printed it."""
    monkeypatch.setattr(members_command, "fetch_status", group.fetch_status)
    monkeypatch.setattr(members_command, "post_membership", group.post)
    monkeypatch.setattr(members_command, "get_json", group.get)
    lines: list[tuple[float, str]] = []
    members_command.add(
        urls if urls is not None else list(group.statuses),
        member,
        witness=kw.get("witness", True),
        peer=kw.get("peer"),
        timeout=kw.get("timeout", 60.0),
        out=lambda line: lines.append((group.now, line)),
        clock=group.clock,
        sleep=group.sleep,
    )
    return lines


def _printed(lines: list[tuple[float, str]], text: str) -> float:
    """When ``text`` was printed."""
    for at, line in lines:
        if text in line:
            return at
    raise AssertionError(f"{text!r} was not printed: {lines}")


def test_adding_a_witness_proposes_its_address_then_waits_for_the_commit_and_its_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = _with_w()
    group.answers["u1"] = iter([(200, {"outcome": "appended", "index": 9})])

    def replicate(g: ScriptedGroup) -> None:
        if g.now >= 1.0:  # appended at the leader only
            g.statuses["u1"]["configuration"] = {**WITH_W, "committed": False}
        if g.now >= 2.0:  # committed at m1 and m2
            for url in ("u1", "u2"):
                g.statuses[url]["configuration"] = WITH_W
        if g.now >= 4.0:  # the leader reached w: the change is in its log
            g.statuses["uw"]["configuration"] = WITH_W

    group.on_sleep.append(replicate)
    lines = _add(group, monkeypatch)
    assert group.asked == ["u1"], "asked the leader"
    assert group.bodies == [ADD_W], "with the address w's sidecar reports"
    assert _printed(lines, "w is in the group: m1, m2, m3, w (witness) (index 9, committed)") == 2.0
    assert _printed(lines, "w follows the group (its log has the change at index 9)") == 4.0
    assert not any("resuming" in line for _, line in lines)


def test_a_witness_that_never_hears_from_the_leader_is_an_error_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = _with_w()
    group.answers["u1"] = iter([(200, {"outcome": "appended", "index": 9})])

    def commit(g: ScriptedGroup) -> None:
        g.statuses["u1"]["configuration"] = WITH_W

    group.on_sleep.append(commit)
    with pytest.raises(MembersCommandError, match="has not heard from the leader"):
        _add(group, monkeypatch, timeout=10.0)
    assert group.now >= 10.0


def test_a_data_member_needs_its_config_for_the_backfill(monkeypatch: pytest.MonkeyPatch) -> None:
    group = _with_w()
    with pytest.raises(MembersCommandError, match=r"backfill .*--member-config.* pass --witness"):
        _add(group, monkeypatch, witness=False)
    assert group.asked == []


def test_a_witness_whose_sidecar_does_not_answer_is_not_added(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = _m1_leading_m2_and_m3()
    with pytest.raises(MembersCommandError, match="w did not answer: start its sidecar first"):
        _add(group, monkeypatch, urls=["u1", "u2", "u3", "uw"], timeout=5.0)
    assert group.asked == [], "nothing was proposed"
    assert group.now >= 5.0, "asked again until the deadline: it may be starting"


def test_a_witness_sidecar_that_starts_late_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = _m1_leading_m2_and_m3()
    group.answers["u1"] = iter([(200, {"outcome": "appended", "index": 9})])

    def starts_then_joins(g: ScriptedGroup) -> None:
        if g.now >= 3.0 and "uw" not in g.statuses:
            g.statuses["uw"] = _witness()
        if g.asked:
            for url in ("u1", "u2", "uw"):
                g.statuses[url]["configuration"] = WITH_W

    group.on_sleep.append(starts_then_joins)
    lines = _add(group, monkeypatch, urls=["u1", "u2", "u3", "uw"])
    assert group.bodies == [ADD_W]
    assert _printed(lines, "w follows the group") >= 3.0


def test_a_sidecar_running_as_a_data_member_is_not_added_as_a_witness(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = _m1_leading_m2_and_m3()
    group.statuses["uw"] = _witness(witness=False)
    with pytest.raises(MembersCommandError, match="runs as a data member, not a witness"):
        _add(group, monkeypatch)
    assert group.asked == []


def test_peer_overrides_the_address_the_witness_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    group = _with_w()
    group.answers["u1"] = iter([(200, {"outcome": "appended", "index": 9})])

    def commit_everywhere(g: ScriptedGroup) -> None:
        for url in ("u1", "u2", "uw"):
            g.statuses[url]["configuration"] = {**WITH_W, "addresses": {"w": "w.example:7400"}}

    group.on_sleep.append(commit_everywhere)
    _add(group, monkeypatch, peer="w.example:7400")
    assert group.bodies == [{**ADD_W, "peer": "w.example:7400"}]


def test_an_addition_cut_from_the_log_is_proposed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    group = _with_w()
    group.answers["u1"] = iter(
        [
            (200, {"outcome": "appended", "index": 9}),
            (200, {"outcome": "appended", "index": 12}),
        ]
    )

    def cut_then_commit(g: ScriptedGroup) -> None:
        if len(g.asked) == 1:  # a new leader's entries replaced index 9: no w there
            g.statuses["u1"]["commitIndex"] = 11
        if len(g.asked) == 2:
            for url in ("u1", "u2", "uw"):
                g.statuses[url]["configuration"] = {**WITH_W, "index": 12}

    group.on_sleep.append(cut_then_commit)
    lines = _add(group, monkeypatch)
    assert group.bodies == [ADD_W, ADD_W]
    _printed(lines, "the addition at index 9 was cut from the log")
    _printed(lines, "w is in the group: m1, m2, m3, w (witness) (index 12, committed)")
    _printed(lines, "its log has the change at index 12")


def test_running_add_again_after_the_change_was_appended_waits_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = _with_w()
    for url in ("u1", "u2"):
        group.statuses[url]["configuration"] = {**WITH_W, "committed": False}
    group.answers["u1"] = iter([(200, {"outcome": "already-a-member", "index": 9})])

    def commit(g: ScriptedGroup) -> None:
        for url in ("u1", "u2", "uw"):
            g.statuses[url]["configuration"] = WITH_W

    group.on_sleep.append(commit)
    lines = _add(group, monkeypatch)
    assert group.bodies == [ADD_W]
    _printed(lines, "w is in the newest configuration already; resuming")
    _printed(lines, "w is in the group")


def test_a_first_addition_does_not_say_it_resumes_whatever_order_the_urls_come_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before it joins, the witness reports its startup file's configuration, which
    names it, at index 0 like the group's own: that is not the group's configuration."""
    group = _with_w()
    group.answers["u1"] = iter([(200, {"outcome": "appended", "index": 9})])

    def commit(g: ScriptedGroup) -> None:
        for url in ("u1", "u2", "uw"):
            g.statuses[url]["configuration"] = WITH_W

    group.on_sleep.append(commit)
    lines = _add(group, monkeypatch, urls=["uw", "u1", "u2", "u3"])
    _printed(lines, "w follows the group")
    assert not any("already" in line for _, line in lines), lines


def test_a_witness_is_added_only_while_every_voter_answers_on_this_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The group counts the witness from the moment the change is appended, and a member
    of an older release cannot read a change that carries an address: both are checked
    before anything is asked."""
    group = _with_w()
    with pytest.raises(MembersCommandError, match="m3 did not answer"):
        _add(group, monkeypatch, urls=["u1", "u2", "uw"])
    del group.statuses["u2"]["peer"]
    with pytest.raises(MembersCommandError, match=r"m2 run.* an older release"):
        _add(group, monkeypatch)
    assert group.asked == [] and group.bodies == []


def test_the_endpoint_adds_a_data_member_as_a_learner() -> None:
    pump, leader = _elected(THREE)
    node = pump.node(leader)
    on_leader = EndpointSidecar(_driver(pump, leader))
    body = {"add": "d", "witness": False, "peer": W_PEER}

    code, answer = _post(on_leader, _body(body), JSON)
    assert code == 200 and answer["outcome"] == "appended", answer
    config = answer["configuration"]
    assert config["learners"] == ["d"] and "d" not in config["voters"], config
    assert config["addresses"] == {"d": W_PEER}
    pump.run_until(lambda: not node.change_pending, 50, "the addition to commit")

    code, answer = _post(on_leader, _body(body), JSON)
    assert code == 200 and answer["outcome"] == "already-a-member", answer
    code, answer = _post(on_leader, _body({**body, "witness": True}), JSON)
    assert code == 422 and "a data member of the group already" in answer["reason"], answer
    # A second data member waits until d votes: each backfill needs d's answer.
    second = {"add": "e", "witness": False, "peer": "e.example:7400"}
    code, answer = _post(on_leader, _body(second), JSON)
    assert code == 422 and "d is still joining as a learner: add e once" in answer["reason"]
