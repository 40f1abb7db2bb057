"""Rules that relate several fields of a sidecar config: the members as a group.

Member names and peer addresses unique, ``member`` one of ``members``, more data members
than witnesses, exactly one of mutual TLS and ``insecure``, and the tls section under an
admin listener. They run on a validated ``SidecarConfig`` and, as far as its shape
allows, on raw data whose fields are not all valid yet, so that one run reports as much
as possible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kdsync.config.problems import Loc

MemberFacts = tuple[str | None, str | None, bool]  # name, peer, witness


def group_problems(
    member: str | None,
    members: Sequence[MemberFacts],
    *,
    insecure: bool,
    has_tls: bool,
    has_admin: bool = False,
) -> list[tuple[Loc, str, str]]:
    """Rules that relate several fields. Unknown (None) names and peers are skipped, so
    this also runs on raw data whose fields are not all valid yet."""
    problems: list[tuple[Loc, str, str]] = []
    if len(members) < 2:
        problems.append(
            (
                ("members",),
                f"a group needs at least 2 members, this one has {len(members)}",
                "list every member of the group, including this one",
            )
        )
    first_name: dict[str, int] = {}
    first_peer: dict[str, int] = {}
    for index, (name, peer, _) in enumerate(members):
        if name is not None and name in first_name:
            problems.append(
                (
                    ("members", index, "name"),
                    f"member name {name!r} is already used by members[{first_name[name]}]",
                    "give every member a unique name",
                )
            )
        elif name is not None:
            first_name[name] = index
        if peer is not None and peer in first_peer:
            problems.append(
                (
                    ("members", index, "peer"),
                    f"peer address {peer!r} is already used by members[{first_peer[peer]}]",
                    "give every member its own host:port",
                )
            )
        elif peer is not None:
            first_peer[peer] = index
    witnesses = sum(1 for _, _, witness in members if witness)
    data = len(members) - witnesses
    if witnesses and witnesses >= data:
        problems.append(
            (
                ("members",),
                f"{data} data member(s) and {witnesses} witness(es): a group needs more "
                "data members than witnesses, so that every majority includes a member "
                "that stores the log durably",
                "add a data member or remove a witness",
            )
        )
    if member is not None and member not in first_name:
        problems.append(
            (
                ("member",),
                f"{member!r} is not one of the members {list(first_name)}",
                "set `member` to this sidecar's entry in `members`",
            )
        )
    if insecure and has_tls:
        problems.append(
            (
                ("insecure",),
                "both `insecure: true` and a tls section are set",
                "remove `insecure: true` to use mutual TLS, or remove the tls section",
            )
        )
    elif not insecure and not has_tls:
        problems.append(
            (
                ("tls",),
                "peer links need mutual TLS: the tls section is missing",
                "add `tls: {ca: ..., cert: ..., key: ...}` (`kdsync pki --out DIR --config "
                "member.yaml` makes a group CA and member certificates), or set "
                "`insecure: true` for a local test",
            )
        )
    if has_admin and not has_tls:
        # The admin listener authenticates its clients with the group CA and serves with
        # the member's own certificate: there is no plaintext admin listener.
        problems.append(
            (
                ("admin",),
                "the admin listener needs the tls section (it serves with this member's "
                "certificate and checks clients against the group CA); `insecure: true` "
                "does not cover it",
                "add `tls: {ca: ..., cert: ..., key: ...}`, or remove the admin section",
            )
        )
    return problems


def raw_group_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str, str]]:
    """``group_problems`` on unvalidated data, as far as its shape allows."""
    raw_members = data.get("members")
    if not isinstance(raw_members, list):
        return []
    facts: list[MemberFacts] = []
    for item in raw_members:
        entry = item if isinstance(item, dict) else {}
        name, peer = entry.get("name"), entry.get("peer")
        facts.append(
            (
                name if isinstance(name, str) else None,
                peer if isinstance(peer, str) else None,
                entry.get("witness") is True,
            )
        )
    member = data.get("member")
    return group_problems(
        member if isinstance(member, str) else None,
        facts,
        insecure=data.get("insecure") is True,
        has_tls=data.get("tls") is not None,
        has_admin=data.get("admin") is not None,
    )
