"""The ``kdsync`` command: run a sidecar, show a group's status, audit, check a config,
add a witness to or remove a member from a running group, fail consumer groups over
between members, issue a group's certificates."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from kdsync.config import ConfigError, SidecarConfig, load_config
from kdsync.pki import MEMBER_VALID_DAYS, make_group_pki
from kdsync.runtime.status_report import fetch_status, render


def _load(path: Path) -> SidecarConfig | None:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return None


def _setup_logging(level: str, member: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)-7s [{member}] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("aiohttp").setLevel(logging.WARNING)


def _run(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 2
    _setup_logging(args.log_level, config.member)
    from kdsync.runtime.process import run  # noqa: PLC0415 (Kafka client loads only to run)

    return run(config)


def _local_url(http: str) -> str:
    host, _, port = http.rpartition(":")
    if host in ("0.0.0.0", "", "[::]", "::"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def _status(args: argparse.Namespace) -> int:
    urls = _urls(args, "status")
    if urls is None:
        return 2
    statuses = [fetch_status(url) for url in urls]
    print(render(statuses))
    return 0 if all("unreachable" not in s for s in statuses) else 1


def _urls(args: argparse.Namespace, command: str) -> list[str] | None:
    urls: list[str] = list(args.urls)
    for path in args.config or []:
        config = _load(path)
        if config is None:
            return None
        urls.append(_local_url(config.http))
    if not urls:
        print(f"kdsync {command}: give sidecar URLs (host:port) or --config FILE", file=sys.stderr)
        return None
    return urls


def _members(args: argparse.Namespace) -> int:
    from kdsync.runtime import members_command  # noqa: PLC0415

    urls = _urls(args, f"members {args.action}")
    if urls is None:
        return 2
    try:
        if args.action == "show":
            return members_command.show(urls, print)
        if args.action == "add" and args.member_config is not None:
            if args.witness:
                print(
                    "kdsync members add: --member-config is for a data member (its backfill "
                    "needs its Kafka); a witness's sidecar runs first: drop one of the two",
                    file=sys.stderr,
                )
                return 2
            return _add_data_member(args, urls)
        if args.action == "add":
            return members_command.add(
                urls,
                args.member,
                witness=args.witness,
                peer=args.peer,
                timeout=args.timeout,
                out=print,
            )
        return members_command.remove(
            urls, args.member, timeout=args.timeout, drain=not args.no_drain, out=print
        )
    except members_command.MembersCommandError as exc:
        print(f"kdsync members {args.action}: {exc}", file=sys.stderr)
        return 1


def _add_data_member(args: argparse.Namespace, urls: list[str]) -> int:
    """``members add NAME --member-config FILE --peer HOST:PORT``: learner, backfill
    (Spark, local unless --spark-master says otherwise), start, voter."""
    from kdsync.audit.session import audit_session  # noqa: PLC0415 - Spark only here
    from kdsync.backfill.copy_job import BackfillError  # noqa: PLC0415
    from kdsync.backfill.join import Backfill  # noqa: PLC0415
    from kdsync.backfill.seeding import SeedingError  # noqa: PLC0415
    from kdsync.runtime import members_command  # noqa: PLC0415

    config = _load(args.member_config)
    if config is None:
        return 2
    if config.member != args.member or config.is_witness:
        print(
            f"kdsync members add: {args.member_config} is the config of "
            f"{'witness ' if config.is_witness else ''}{config.member}, not of data member "
            f"{args.member}",
            file=sys.stderr,
        )
        return 2
    backfill = Backfill(config, lambda: audit_session(args.spark_master, {}), print)
    try:
        return members_command.add_data_member(
            urls,
            args.member,
            # Where the others dial it: its own entry's peer, unless given.
            peer=args.peer or config.own_member.peer,
            member_url=_local_url(config.http),
            seed=backfill,
            timeout=args.timeout,
            out=print,
        )
    except (members_command.MembersCommandError, SeedingError, BackfillError) as exc:
        print(f"kdsync members add: {exc}", file=sys.stderr)
        return 1


def _check(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 2
    kafka = config.own_member.kafka
    if kafka is not None:
        # librdkafka's verdict on kafka.properties (no connection is made).
        from kdsync.kafka.client_config import check_client_properties  # noqa: PLC0415
        from kdsync.kafka.errors import InvalidClientProperties  # noqa: PLC0415

        try:
            check_client_properties(kafka.client_properties())
        except InvalidClientProperties as exc:
            print(f"{args.config}: {exc}", file=sys.stderr)
            return 2
    rdma = config.rdma_settings()
    transport = "tcp"
    if rdma is not None:
        # The device must open here as it will at start (pyverbs loads only for this).
        from kdsync.transport.rdma import RdmaUnavailable  # noqa: PLC0415
        from kdsync.transport.rdma.links import open_pyverbs_device  # noqa: PLC0415

        try:
            device = open_pyverbs_device(rdma)
        except RdmaUnavailable as exc:
            if not rdma.fallback_to_tcp:
                print(f"{args.config}: transport.type is rdma, but {exc}", file=sys.stderr)
                return 2
            transport = f"rdma unavailable, so tcp (fallbackToTcp): {exc}"
        else:
            transport = f"rdma on {device.description}"
            device.close()
    role = "witness" if config.is_witness else "data member"
    print(
        f"{args.config}: valid; group {config.group}, {role} {config.member}, "
        f"{len(config.members)} members; peer links: {transport}"
    )
    return 0


def _pki(args: argparse.Namespace) -> int:
    if args.config is not None:
        if args.group or args.members:
            print("kdsync pki: give --config, or --group with --members, not both", file=sys.stderr)
            return 2
        # The TLS files the config names are what this command is about to write.
        try:
            config = load_config(args.config, check_files=False)
        except ConfigError as exc:
            print(str(exc), file=sys.stderr)
            return 2
        group, members = config.group, [m.name for m in config.members]
    elif args.group and args.members:
        group = args.group
        members = [name.strip() for name in args.members.split(",") if name.strip()]
    else:
        print(
            "kdsync pki: name the group and its members: --group G --members a,b,c "
            "(witnesses too), or --config FILE to take them from a sidecar config",
            file=sys.stderr,
        )
        return 2
    try:
        files = make_group_pki(group, members, args.out, member_valid_days=args.member_valid_days)
    except ValueError as exc:
        print(f"kdsync pki: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"kdsync pki: cannot write under {args.out}: {exc}", file=sys.stderr)
        return 2
    out = args.out.resolve()
    print(f"group {group} CA: {out / 'ca.pem'} (its key ca-key.pem stays with you: keep it safe)")
    for member, member_files in files.items():
        print(
            f"member {member}: give it {member_files.cert.parent.resolve()}/ and ca.pem; its "
            "config's tls section:\n"
            f"  tls:\n    ca: {member_files.ca_cert.resolve()}\n"
            f"    cert: {member_files.cert.resolve()}\n    key: {member_files.key.resolve()}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "audit":
        from kdsync.audit.command import main as audit_main  # noqa: PLC0415 (loads Spark)

        code: int = audit_main(argv[1:])
        return code
    if argv and argv[0] == "failover":
        from kdsync.failover.command import main as failover_main  # noqa: PLC0415 (Kafka)

        return failover_main(argv[1:])
    parser = argparse.ArgumentParser(prog="kdsync", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a sidecar (or a witness) from a config file")
    run.add_argument("--config", type=Path, required=True, help="the sidecar's YAML config")
    run.add_argument("--log-level", default="info", help="debug, info, warning or error")
    run.set_defaults(handler=_run)
    status = commands.add_parser("status", help="print a summary of running sidecars")
    status.add_argument("urls", nargs="*", help="sidecar HTTP addresses, e.g. 127.0.0.1:8080")
    status.add_argument(
        "--config", type=Path, action="append", help="take the address from a config"
    )
    status.set_defaults(handler=_status)
    members = commands.add_parser(
        "members",
        help="show a running group's configuration, remove a member, or add one",
        description="Talks to the sidecars' HTTP ports (give every member, so the leader is "
        "found). `remove` waits until a data member has ordered every event it read (stop "
        "producing to it first), has the leader append the change, waits for its commit, "
        "and then tells you to stop the removed member's sidecar. `add NAME --witness` adds "
        "a witness whose sidecar already runs (its file names the group's members and "
        "itself) and waits until it follows the group. `add NAME --member-config FILE --peer "
        "HOST:PORT` adds a data member whose sidecar does not run yet: learner, Spark "
        "backfill of its T-global, then start it when told; it waits until it votes. A "
        "sidecar takes membership "
        "changes only with allowMembershipChanges: true, and only from its own host.",
    )
    actions = members.add_subparsers(dest="action", required=True)
    for action in ("show", "remove", "add"):
        sub = actions.add_parser(action)
        if action == "remove":
            sub.add_argument("member", help="the member to remove (data member or witness)")
            sub.add_argument(
                "--no-drain",
                action="store_true",
                help="do not wait for the member to order what it read (it is gone for good)",
            )
        if action == "add":
            sub.add_argument(
                "member",
                help="the member to add: a witness whose sidecar runs (give its address too), "
                "or a data member with --member-config",
            )
            sub.add_argument(
                "--witness",
                action="store_true",
                help="the member is a witness (its sidecar runs already)",
            )
            sub.add_argument(
                "--member-config",
                type=Path,
                help="a new data member's own config file (its sidecar must not run yet): "
                "the command adds it as a learner, seeds its T-global from a peer with "
                "Spark, then waits until it was started and votes",
            )
            sub.add_argument(
                "--spark-master",
                default="local[2]",
                help="where the backfill's Spark runs (default local[2])",
            )
            sub.add_argument(
                "--peer",
                help="host:port the others dial it at (default: what its sidecar reports; for a "
                "data member, its own entry in --member-config)",
            )
        if action != "show":
            sub.add_argument(
                "--timeout", type=float, default=120.0, help="seconds for all steps (120)"
            )
        sub.add_argument("urls", nargs="*", help="sidecar HTTP addresses, e.g. 127.0.0.1:8080")
        sub.add_argument(
            "--config", type=Path, action="append", help="take an address from a config"
        )
        sub.set_defaults(handler=_members)
    check = commands.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("--config", type=Path, required=True)
    check.set_defaults(handler=_check)
    commands.add_parser(
        "audit", help="check a group's consistency with Spark (see kdsync audit -h)"
    )
    commands.add_parser(
        "failover",
        help="move a consumer group between members at its exact position "
        "(see kdsync failover translate -h, kdsync failover apply -h)",
    )
    pki = commands.add_parser(
        "pki",
        help="issue a group CA and member certificates for the peer links (mutual TLS)",
        description="Create (or complete) a group's PKI under --out: ca.pem, ca-key.pem and "
        "members/<name>/{cert,key}.pem. Re-running keeps the CA and every certificate it "
        "signed that is not about to expire, and issues only what is missing.",
    )
    pki.add_argument("--out", type=Path, required=True, help="folder to write into")
    pki.add_argument("--group", help="the group's name")
    pki.add_argument("--members", help="comma-separated member names, witnesses included")
    pki.add_argument("--config", type=Path, help="take group and member names from a config")
    pki.add_argument(
        "--member-valid-days",
        type=int,
        default=MEMBER_VALID_DAYS,
        help=f"validity of member certificates (default {MEMBER_VALID_DAYS})",
    )
    pki.set_defaults(handler=_pki)
    args = parser.parse_args(argv)
    result: int = args.handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
