"""``kdsync members``: show a running group's configuration, or remove a member from it.

Removing runs in three steps, each waited for with a deadline:

1. **Drain** (a data member): every record of its source partitions, up to end offsets
   fetched after the wait began, is in its own ``T-global`` (``sourceBacklog`` in its
   /status is empty). Events it reads after its removal never enter the order, so the
   user stops producing to its source topics first.
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
        return [s["configuration"] for s in self.statuses.values() if "configuration" in s]

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
        out(f"{member} is out of the newest configuration already; waiting for its commit")
    elif drain and member not in config.get("witnesses", []):
        _drain(member, view, deadline, out, clock, sleep)
    while True:
        index = _propose(urls, member, deadline, out, clock, sleep)
        final = _await_commit(urls, member, index, deadline, clock, sleep)
        if final is not None:
            break
        out(f"the removal at index {index} was cut from the log (a new leader); asking again")
    out(f"{member} is out of the group: {describe_configuration(final)}")
    out(f"Stop {member}'s sidecar now: the others no longer talk to it.")
    return 0


def _members_of(config: Mapping[str, Any]) -> list[str]:
    return [*config.get("voters", []), *config.get("learners", [])]


def _drain(
    member: str,
    view: GroupView,
    deadline: float,
    out: Callable[[str], None],
    clock: Clock,
    sleep: Sleep,
) -> None:
    """Wait until every record in the member's source partitions, up to end offsets its
    reader fetched after the wait began, is in the member's own T-global: in order."""
    if member not in view.statuses:
        raise MembersCommandError(
            f"{member} did not answer, so nothing shows that it ordered every event it "
            f"read; give its URL or --config, or pass --no-drain if it is gone for good "
            f"(events it read and did not order then stay out of the group)"
        )
    out(f"waiting for {member} to order every event in its source topics (stop producing first)")
    began = clock()
    while True:
        status = look([view.urls[member]]).statuses.get(member, {})
        age = status.get("sourceEndsAgeSeconds")
        backlog = status.get("sourceBacklog")
        if (
            status.get("phase") == "running"
            and backlog == {}
            and age is not None
            and float(age) < clock() - began
        ):
            return
        if clock() >= deadline:
            raise MembersCommandError(
                f"{member} still has source records that are not in the order "
                f"({_brief_backlog(backlog)}): stop producing to its source topics, or give "
                "a longer --timeout (a source written by transactional producers keeps its "
                "last commit marker here: check the outbox is empty, then use --no-drain)"
            )
        sleep(POLL_SECONDS)


def _brief_backlog(backlog: object) -> str:
    if not isinstance(backlog, dict):
        return "its status shows no source backlog: is it a release without one?"
    shown = ", ".join(f"{where} {count}" for where, count in list(backlog.items())[:3])
    return f"records behind: {shown}" if shown else "its source end offsets are not fresh yet"


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
        if code == 200:
            return int(answer["index"])
        if code == 404 and target == view.leader:
            # Not in the leader's configuration: an earlier ask appended it already.
            return int(answer.get("configuration", {}).get("index", 0))
        if code in (400, 403, 422):
            raise MembersCommandError(f"{target} refused: {reason}")
        if reason != last_reason:
            out(f"{target}: {reason or 'no answer'}; asking again")
            last_reason = reason
        if clock() >= deadline:
            raise MembersCommandError(
                f"no leader took the change before the deadline (last answer: {reason}); "
                "check `kdsync status`, then run the command again"
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
        if clock() >= deadline:
            raise MembersCommandError(
                f"the removal of {member} (index {index}) was not seen committed before the "
                "deadline: the group may lack a majority; check `kdsync status`"
            )
        sleep(POLL_SECONDS)


def post_membership(
    url: str, body: Mapping[str, Any], timeout: float = 10.0
) -> tuple[int, dict[str, Any]]:
    """POST /membership; (HTTP status, answer). Unreachable is (0, {reason})."""
    target = url.rstrip("/")
    if not target.startswith(("http://", "https://")):
        target = f"http://{target}"
    if target.endswith("/status"):
        target = target[: -len("/status")]
    request = urllib.request.Request(
        f"{target}/membership",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            answer = json.loads(exc.read())
        except ValueError:
            answer = {"reason": str(exc)}
        return exc.code, answer if isinstance(answer, dict) else {"reason": str(answer)}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return 0, {"reason": f"unreachable: {getattr(exc, 'reason', exc)}"}
