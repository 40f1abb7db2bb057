"""``kdsync members``: show a running group's configuration, remove a member from it, or
add a witness to it.

Removing runs in three steps, each waited for with a deadline:

1. **Drain** (a data member): every record of its source partitions, up to the ends
   its brokers report after the wait began, is in its own ``T-global`` (its
   ``/source-backlog`` is empty). Events it reads after its removal never enter the
   order, so the user stops producing to its source topics first.
2. **Propose** on whoever leads, again while the answer is "ask again" (a leader asked to
   remove itself hands over first; a new leader commits an entry of its own first).
3. **Wait for the commit**, then tell the user to stop the removed member's sidecar: the
   leader no longer replicates to it, so it may never learn that it was removed.

Adding a witness: its sidecar runs first (the others refuse it until the change is in
their logs), so that the group, which counts it from the moment the change is appended,
has its vote at once. The change carries the address the others dial it at; then the
command waits for the commit and for the witness to have the change in its own log.
Adding a data member: its sidecar must *not* run yet. The learner (with its address) is
proposed and committed; then a backfill (``kdsync.backfill``, handed in as ``seed``) gives
its cluster a peer's ``T-global`` and ledger; then its sidecar is started, and the
command waits until the leader has made it a voter (once it caught up).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kdsync.group_configuration import (
    describe_configuration,
    leader_of,
    newest_configuration,
    reported_configurations,
)
from kdsync.runtime.status_report import fetch_status

# How often the group is asked again while waiting (the CLI polls HTTP; nothing finer).
POLL_SECONDS = 0.5

Clock = Callable[[], float]
Sleep = Callable[[float], None]
# The backfill of a new data member: given a way to read every member's /status now and
# the deadline, it seeds the member's cluster (True), or finds it seeded (False), printing
# progress. It decides from the member's cluster, not from whether its sidecar answers.
Statuses = Callable[[], Mapping[str, Mapping[str, Any]]]
Seed = Callable[[Statuses, float], bool]


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
        return leader_of(self.statuses)


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
    _, final = _change(urls, {"remove": member}, member, deadline, out, clock, sleep)
    out(f"{member} is out of the group: {describe_configuration(final)}")
    out(f"Stop {member}'s sidecar now: the others no longer talk to it.")
    return 0


def add(
    urls: Sequence[str],
    member: str,
    *,
    witness: bool,
    peer: str | None,
    timeout: float,
    out: Callable[[str], None],
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> int:
    """Add witness ``member``, whose sidecar already runs (its file names the group's
    members and itself), reached at ``peer`` (default: the address it reports); or data
    member ``member`` with ``seed`` (see ``add_data_member``)."""
    if not witness:
        raise MembersCommandError(
            f"a data member's T-global needs a backfill from a peer first: give {member}'s "
            "own config file (--member-config) and --peer HOST:PORT. If it is a witness, "
            "pass --witness"
        )
    deadline = clock() + timeout
    view = _answered_by(member, urls, look(urls), deadline, out, clock, sleep)
    status = view.statuses.get(member)
    if status is None:
        asked = "did not answer" if view.unreachable else "is not among the sidecars given"
        raise MembersCommandError(
            f"{member} {asked}: start its sidecar first (its file lists the group's "
            f"members and {member} as a witness), then give its address or --config too. "
            "Until it runs, a group that counts it needs every other voter to commit"
        )
    if status.get("witness") is not True:
        raise MembersCommandError(
            f"{member}'s sidecar runs as a data member, not a witness: its file must give "
            f"{member} witness: true and no kafka section"
        )
    groups = {s.get("group") for s in view.statuses.values()}
    if len(groups) != 1:
        raise MembersCommandError(f"the sidecars given belong to different groups: {groups}")
    # Every member must read a change that carries an address (older releases cannot),
    # and must answer: the group counts the witness from the moment it is appended.
    group_config = newest_configuration(s for name, s in view.statuses.items() if name != member)
    voters = [v for v in (group_config or {}).get("voters", []) if v != member]
    silent = [v for v in voters if v not in view.statuses]
    if silent:
        raise MembersCommandError(
            f"{', '.join(silent)} did not answer: give every member's address (or --config), "
            "and add a witness while every voter is up"
        )
    older = [v for v in voters if "peer" not in view.statuses[v]]
    if older:
        raise MembersCommandError(
            f"{', '.join(older)} run(s) an older release, which cannot read a membership "
            "change that carries a peer address: upgrade every member first"
        )
    address = peer or status.get("peer")
    if not isinstance(address, str):
        raise MembersCommandError(
            f"{member} reports no peer address (an older release): give --peer HOST:PORT"
        )
    # The group's word, not the new member's: its startup file names it already.
    if group_config is not None and member in _members_of(group_config):
        out(f"{member} is in the newest configuration already; resuming")
    request = {"add": member, "witness": True, "peer": address}
    index, final = _change(urls, request, member, deadline, out, clock, sleep, joins=True)
    out(f"{member} is in the group: {describe_configuration(final)}")
    _await_joined(urls, member, index, deadline, out, clock, sleep)
    return 0


def add_data_member(
    urls: Sequence[str],
    member: str,
    *,
    peer: str,
    member_url: str,
    seed: Seed,
    timeout: float,
    out: Callable[[str], None],
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> int:
    """Add data member ``member`` (reached by the others at ``peer``; its sidecar's HTTP at
    ``member_url``): learner, backfill, start, voter. ``urls`` are the running members'."""
    deadline = clock() + timeout
    view = look(urls)
    answer = fetch_status(member_url)
    own = answer if answer.get("member") == member else None
    group_config = view.configuration
    data_voters = [
        v for v in group_config.get("voters", []) if v not in group_config.get("witnesses", [])
    ]
    if own is not None and member in data_voters:
        out(f"{member} is a voting member already: {describe_configuration(group_config)}")
        return 0
    if own is not None and member not in group_config.get("learners", []):
        raise MembersCommandError(
            f"{member}'s sidecar runs already: stop it. A new data member's sidecar starts "
            "only after the backfill seeded its cluster; started on its own file it would "
            "take itself for a member of the group it names"
        )
    silent = [v for v in group_config.get("voters", []) if v not in view.statuses]
    if silent or not view.statuses:
        raise MembersCommandError(
            f"{', '.join(silent) or 'no member'} did not answer: give every member's address "
            "(or --config), and add a data member while every voter is up"
        )
    older = [v for v in view.statuses if "allDurable" not in view.statuses[v]]
    if older:
        raise MembersCommandError(
            f"{', '.join(older)} run(s) an older release, which cannot seed a new data "
            "member: upgrade every member first"
        )
    if member in _members_of(group_config):
        out(f"{member} is in the newest configuration already; resuming")
    request = {"add": member, "witness": False, "peer": peer}
    _, final = _change(urls, request, member, deadline, out, clock, sleep, joins=True)
    out(f"{member} is in the group as a learner: {describe_configuration(final)}")
    seeded_now = seed(lambda: look(urls).statuses, deadline)
    if own is None:
        out(f"Start {member}'s sidecar now: it catches up from the leader, then votes.")
    elif seeded_now:
        # It ran before its backfill and was fenced by it: it must start again.
        out(f"Restart {member}'s sidecar now: it ran before its backfill, which stopped it.")
    _await_voter(urls, member_url, member, deadline, out, clock, sleep)
    return 0


def _await_voter(
    urls: Sequence[str],
    member_url: str,
    member: str,
    deadline: float,
    out: Callable[[str], None],
    clock: Clock,
    sleep: Sleep,
) -> None:
    """Until a committed configuration makes ``member`` a voter (the leader promotes a
    learner that has caught up)."""
    while True:
        view = look(urls)
        for name, status in view.statuses.items():
            config = status.get("configuration") or {}
            if name != member and config.get("committed") and member in config.get("voters", []):
                out(f"{member} votes now: {describe_configuration(config)}")
                return
        answer = fetch_status(member_url)
        own = answer if answer.get("member") == member else None
        state = "does not answer yet" if own is None else f"is {own.get('phase', 'up')}"
        _check_deadline(
            clock,
            deadline,
            f"{member} is not a voter yet: its sidecar {state} (its peers: "
            f"{_peer_errors(own or {})}); start it if it is not running, check that the "
            "others reach its peer address, then run the command again (it resumes). Until "
            f"it catches up no member trims its ordering log: to give up, `kdsync members "
            f"remove {member}`",
        )
        sleep(POLL_SECONDS)


def _await_joined(
    urls: Sequence[str],
    member: str,
    index: int,
    deadline: float,
    out: Callable[[str], None],
    clock: Clock,
    sleep: Sleep,
) -> None:
    """Until the new member has the change in its own log: the leader reaches it."""
    while True:
        status = look(urls).statuses.get(member) or {}
        if int((status.get("configuration") or {}).get("index", 0)) >= index:
            out(f"{member} follows the group (its log has the change at index {index})")
            return
        _check_deadline(
            clock,
            deadline,
            f"{member} is a voter now but has not heard from the leader (its role: "
            f"{status.get('role', 'unknown')}; its peers: {_peer_errors(status)}): check "
            f"that the others can reach its peer address, and its sidecar log. "
            f"`kdsync members remove {member}` backs the change out",
        )
        sleep(POLL_SECONDS)


def _change(
    urls: Sequence[str],
    request: Mapping[str, Any],
    member: str,
    deadline: float,
    out: Callable[[str], None],
    clock: Clock,
    sleep: Sleep,
    *,
    joins: bool = False,
) -> tuple[int, Mapping[str, Any]]:
    """Propose the change until it is committed (again when a new leader cut it); its
    index and the committed configuration."""
    change = "addition" if joins else "removal"
    while True:
        index = _propose(urls, request, deadline, out, clock, sleep)
        final = _await_commit(urls, member, index, deadline, clock, sleep, joins=joins)
        if final is not None:
            return index, final
        out(f"the {change} at index {index} was cut from the log (a new leader); asking again")
        _check_deadline(clock, deadline, f"the {change} of {member} kept being cut")
        sleep(POLL_SECONDS)


def _peer_errors(status: Mapping[str, Any]) -> str:
    peers = status.get("peers") or {}
    found = [f"{name} {p.get('lastError')}" for name, p in peers.items() if p.get("lastError")]
    return "; ".join(found) or "no link errors"


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
    request: Mapping[str, Any],
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
        code, answer = post_membership(view.urls[target], request)
        reason = str(answer.get("reason") or "")
        outcome = answer.get("outcome")
        if code == 200 and outcome in ("appended", "already-a-member"):
            # Already a member: an earlier ask appended it (the wait for the commit tells).
            return int(answer["index"])
        index = int((answer.get("configuration") or {}).get("index", 0))
        if code == 404 and outcome == "not-a-member" and target == view.leader and index:
            # Not in the leader's configuration: an earlier ask appended the removal.
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
    *,
    joins: bool = False,
) -> Mapping[str, Any] | None:
    """The committed configuration without ``member`` (with it, when it ``joins``);
    None when the leader's log no longer has the change (a new leader cut it: propose
    again). The member's own word does not count: it may not know it was removed."""
    change = "addition" if joins else "removal"
    while True:
        view = look(urls)
        for name, status in view.statuses.items():
            config = status.get("configuration") or {}
            if (
                name != member
                and config.get("committed")
                and config.get("index", 0) >= index
                and (member in _members_of(config)) == joins
            ):
                return config
        leader = view.statuses.get(view.leader or "")
        if (
            leader is not None
            and int(leader.get("commitIndex", 0)) >= index
            and (member in _members_of(leader.get("configuration") or {})) != joins
        ):
            return None  # committed past the change without it: it was cut
        _check_deadline(
            clock,
            deadline,
            f"the {change} of {member} (index {index}) was not seen committed before the "
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
