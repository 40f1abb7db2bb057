"""``kdsync members remove`` end to end below HTTP: what a member answers a removal
(``kdsync.driver.membership_request``, against real OrderingNodes), and how the command
drains, finds the leader, retries and waits (``kdsync.runtime.members_command``, against
a scripted group)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kdsync.driver import DriverState, MemberDriver
from kdsync.driver.membership_request import Outcome, remove_member
from kdsync.ordering import Configuration, GroupSpec, OrderingNode
from kdsync.runtime import members_command
from kdsync.runtime.http_api import _from_this_host, build_app
from kdsync.runtime.members_command import MembersCommandError
from kdsync.runtime.sidecar import Sidecar
from tests.unit.ordering_pump import ELECTION_DEADLINE, THREE, Pump


@dataclass
class NodeDriver:
    """What remove_member and readiness use of a MemberDriver: the node, its state."""

    node: OrderingNode
    state: DriverState = field(default_factory=DriverState)

    def propose_configuration(self, proposed: Configuration) -> str | None:
        return self.node.propose_configuration(proposed)


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
    # GET /source-backlog answers by URL (default: drained)
    backlogs: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    now: float = 0.0
    on_sleep: list[Any] = field(default_factory=list)

    def fetch_status(self, url: str, timeout: float = 5.0) -> dict[str, Any]:
        return dict(self.statuses[url]) if url in self.statuses else {"unreachable": "refused"}

    def post(self, url: str, body: Any, timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
        self.asked.append(url)
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
    code, answer = _post(EndpointSidecar(_driver(pump, leader)), b'{"add": "x"}', JSON)
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
