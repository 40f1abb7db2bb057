"""``kdsync members``: show a running group's configuration, or remove a member from it.

Removing runs in three steps, each waited for with a deadline:

1. **Drain** (a data member): every record of its source partitions, up to the ends
   its brokers report after the wait began, is in its own ``T-global`` (its
   ``/source-backlog`` is empty). Events it reads after its removal never enter the
   order, so the user stops producing to its source topics first.
2. **Propose** on whoever leads, again while the answer is "ask again" (a leader asked to
   remove itself hands over first; a new leader commits an entry of its own first).
3. **Wait for the commit**, then tell the user to stop the removed member's sidecar: the
   leader no longer replicates to it, so it may never learn that it was removed.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kdsync.runtime.status_report import (
    describe_configuration,
    fetch_status,
    newest_configuration,
    reported_configurations,
)

# How often the group is asked again while waiting (the CLI polls HTTP; nothing finer).
POLL_SECONDS = 0.5

Clock = Callable[[], float]
Sleep = Callable[[float], None]


class MembersCommandError(Exception):
    """Stops the command: the message says what is wrong and what to do."""


@dataclass
class GroupView:
    """What the reachable members say: their /status documents by member name."""

    statuses: dict[str, dict[str, Any]]
    urls: dict[str, str]
    unreachable: list[str]

    @property
    def configuration(self) -> Mapping[str, Any]:
        """The newest configuration any member reports (the leader's is never older)."""
        newest = newest_configuration(self.statuses.values())
        if newest is None:
            raise MembersCommandError(
                "no member reports its configuration: they are starting, or run a release "
                "without membership changes"
            )
        return newest

    @property
    def configurations(self) -> list[Mapping[str, Any]]:
        return reported_configurations(self.statuses.values())

    @property
    def leader(self) -> str | None:
        leaders = [
            (s.get("term", 0), name)
            for name, s in self.statuses.items()
            if s.get("role") == "leader"
        ]
        return max(leaders)[1] if leaders else None


def look(urls: Sequence[str]) -> GroupView:
    statuses: dict[str, dict[str, Any]] = {}
    by_member: dict[str, str] = {}
    unreachable: list[str] = []
    for url in urls:
        status = fetch_status(url)
        if "unreachable" in status or "member" not in status:
            unreachable.append(f"{url} ({status.get('unreachable', 'no member named')})")
            continue
        statuses[status["member"]] = status
        by_member[status["member"]] = url
    if not statuses:
        raise MembersCommandError(f"no member answered: {', '.join(unreachable)}")
    return GroupView(statuses, by_member, unreachable)


def show(urls: Sequence[str], out: Callable[[str], None]) -> int:
    view = look(urls)
    out(f"configuration: {describe_configuration(view.configuration)}")
    out(f"leader: {view.leader or 'none known'}")
    for line in view.unreachable:
        out(f"unreachable: {line}")
    return 0


def remove(
    urls: Sequence[str],
    member: str,
    *,
    timeout: float,
    drain: bool,
    out: Callable[[str], None],
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> int:
    deadline = clock() + timeout
    view = look(urls)
    config = view.configuration
    if member not in _members_of(config):
        if not any(member in _members_of(c) for c in view.configurations):
            raise MembersCommandError(
                f"{member} is not in the group's configuration: {describe_configuration(config)}"
            )
        out(f"{member} is out of the newest configuration already; resuming")
    elif drain and member not in config.get("witnesses", []):
        _drain(
            member,
            _answered_by(member, urls, view, deadline, out, clock, sleep),
            deadline,
            out,
            clock,
            sleep,
        )
    while True:
        index = _propose(urls, member, deadline, out, clock, sleep)
        final = _await_commit(urls, member, index, deadline, clock, sleep)
        if final is not None:
            break
        out(f"the removal at index {index} was cut from the log (a new leader); asking again")
        _check_deadline(clock, deadline, f"the removal of {member} kept being cut")
        sleep(POLL_SECONDS)
    out(f"{member} is out of the group: {describe_configuration(final)}")
    out(f"Stop {member}'s sidecar now: the others no longer talk to it.")
    return 0


def _members_of(config: Mapping[str, Any]) -> list[str]:
    return [*config.get("voters", []), *config.get("learners", [])]


def _answered_by(
    member: str,
    urls: Sequence[str],
    view: GroupView,
    deadline: float,
    out: Callable[[str], None],
    clock: Clock,
    sleep: Sleep,
) -> GroupView:
    """A view in which ``member`` answered: it may be busy or frozen for a while, so an
    address that did not answer is asked again until the deadline."""
    if member in view.statuses or not view.unreachable:
        return view
    out(f"waiting for {member} to answer (unreachable: {', '.join(view.unreachable)})")
    while member not in view.statuses and clock() < deadline:
        sleep(POLL_SECONDS)
        view = look(urls)
    return view


def _drain(
    member: str,
    view: GroupView,
    deadline: float,
    out: Callable[[str], None],
    clock: Clock,
    sleep: Sleep,
) -> None:
    """Wait until every record in the member's source partitions, up to the ends its
    brokers report after the wait began, is in its own T-global: in the order."""
    if member not in view.statuses:
        raise MembersCommandError(
            f"{member} did not answer, so nothing shows that it ordered every event it "
            f"read; give its URL or --config, or pass --no-drain if it is gone for good "
            f"(events it read and did not order then stay out of the group)"
        )
    out(f"waiting for {member} to order every event in its source topics (stop producing first)")
    while True:
        code, answer = get_json(view.urls[member], "/source-backlog")
        backlog = answer.get("backlog")
        if code == 200 and backlog == {}:
            return
        if code == 200 and isinstance(backlog, dict):
            shown = ", ".join(f"{where} {count}" for where, count in list(backlog.items())[:3])
            problem = f"records not yet in the order: {shown}"
        else:
            problem = str(answer.get("reason") or f"HTTP {code}")
        _check_deadline(
            clock,
            deadline,
            f"{member} is not drained ({problem}): stop producing to its source topics, or "
            "give a longer --timeout. A source written by transactional producers keeps its "
            "last commit marker (or an aborted tail) here: check its outboxBatches is 0 in "
            "`kdsync status`, then use --no-drain",
        )
        sleep(POLL_SECONDS)


def _check_deadline(clock: Clock, deadline: float, problem: str) -> None:
    if clock() >= deadline:
        raise MembersCommandError(problem)


def _propose(
    urls: Sequence[str],
    member: str,
    deadline: float,
    out: Callable[[str], None],
    clock: Clock,
    sleep: Sleep,
) -> int:
    """Propose on whoever leads until a leader has the change in its log; its index."""
    last_reason = ""
    while True:
        view = look(urls)
        target = view.leader or next(iter(view.statuses))
        code, answer = post_membership(view.urls[target], {"remove": member})
        reason = str(answer.get("reason") or "")
        outcome = answer.get("outcome")
        if code == 200 and outcome == "appended":
            return int(answer["index"])
        index = int((answer.get("configuration") or {}).get("index", 0))
        if code == 404 and outcome == "not-a-member" and target == view.leader and index:
            # Not in the leader's configuration: an earlier ask appended it already.
            return index
        if 400 <= code < 500 and code != 409 and outcome != "not-a-member":
            raise MembersCommandError(f"{target} refused (HTTP {code}): {reason}")
        if reason != last_reason:
            out(f"{target}: {reason or f'HTTP {code}'}; asking again")
            last_reason = reason
        _check_deadline(
            clock,
            deadline,
            f"no leader took the change before the deadline (last answer: {reason}); "
            "check `kdsync status`, then run the command again",
        )
        sleep(POLL_SECONDS)


def _await_commit(
    urls: Sequence[str],
    member: str,
    index: int,
    deadline: float,
    clock: Clock,
    sleep: Sleep,
) -> Mapping[str, Any] | None:
    """The committed configuration without ``member``; None when the leader's log no
    longer has the change (a new leader cut it: propose again)."""
    while True:
        view = look(urls)
        for name, status in view.statuses.items():
            config = status.get("configuration") or {}
            if (
                name != member
                and config.get("committed")
                and config.get("index", 0) >= index
                and member not in _members_of(config)
            ):
                return config
        leader = view.statuses.get(view.leader or "")
        if (
            leader is not None
            and int(leader.get("commitIndex", 0)) >= index
            and member in _members_of(leader.get("configuration") or {})
        ):
            return None  # committed past the change without it: it was cut
        _check_deadline(
            clock,
            deadline,
            f"the removal of {member} (index {index}) was not seen committed before the "
            "deadline: the group may lack a majority; check `kdsync status`",
        )
        sleep(POLL_SECONDS)


def post_membership(
    url: str, body: Mapping[str, Any], timeout: float = 10.0
) -> tuple[int, dict[str, Any]]:
    """POST /membership; (HTTP status, answer). Unreachable is (0, {reason})."""
    request = urllib.request.Request(
        f"{_base(url)}/membership",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    return _exchange(request, timeout)


def get_json(url: str, path: str, timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
    """GET ``path``; (HTTP status, answer). Unreachable is (0, {reason})."""
    return _exchange(urllib.request.Request(f"{_base(url)}{path}"), timeout)


def _base(url: str) -> str:
    target = url.rstrip("/")
    if not target.startswith(("http://", "https://")):
        target = f"http://{target}"
    return target.removesuffix("/status")


def _exchange(request: urllib.request.Request, timeout: float) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read())
            return response.status, answer if isinstance(answer, dict) else {}
    except urllib.error.HTTPError as exc:
        try:
            answer = json.loads(exc.read())
        except ValueError:
            answer = {"reason": str(exc)}
        return exc.code, answer if isinstance(answer, dict) else {"reason": str(answer)}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return 0, {"reason": f"unreachable: {getattr(exc, 'reason', exc)}"}
