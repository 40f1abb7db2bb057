"""``kdsync failover translate|apply``: move a consumer group between members exactly.

Exit codes: 0 done (translate: every partition translated exactly), 1 refused or not
exact (the output says why; apply wrote nothing), 2 bad arguments, config or cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kdsync.config import ConfigError, load_config
from kdsync.failover.report import render_table, to_json
from kdsync.failover.service import Failover, FailoverRefused
from kdsync.failover.translation import GroupTranslation
from kdsync.kafka.errors import KafkaUnavailable
from kdsync.record_format import RecordFormatError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="failover_command", required=True)
    for name, text in (
        ("translate", "print a consumer group's exact offsets in another member"),
        ("apply", "write a consumer group's translated offsets in another member"),
    ):
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument(
            "--config",
            type=Path,
            required=True,
            help="a sidecar config of the group (any member's: it lists every cluster)",
        )
        sub.add_argument("--group", required=True, help="the consumer group to move")
        sub.add_argument("--from", dest="source", required=True, help="member it reads now")
        sub.add_argument("--to", dest="target", required=True, help="member it moves to")
        sub.add_argument(
            "--wait",
            type=float,
            default=30.0,
            help="seconds to wait for the target to deliver what the group has read "
            "(default 30; 0: do not wait)",
        )
        sub.add_argument(
            "--timeout", type=float, default=30.0, help="seconds per Kafka request (default 30)"
        )
        sub.add_argument("--json", action="store_true", help="print JSON instead of a table")
        if name == "apply":
            sub.add_argument(
                "--earliest-if-deleted",
                action="store_true",
                help="where retention deleted records the group has not read, start at the "
                "earliest record kept (the deleted ones are skipped)",
            )
        sub.set_defaults(handler=run)


def _print(translation: GroupTranslation, as_json: bool, extra: dict[str, object]) -> None:
    if as_json:
        print(json.dumps({**to_json(translation), **extra}, indent=2))
    else:
        print(render_table(translation))


def _waiting(translation: GroupTranslation) -> None:
    worst = max(p.seqs_behind or 0 for p in translation.behind())
    print(f"waiting: {translation.target} is behind by up to {worst} seq(s)...", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, check_files=False)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    try:
        with Failover(config, args.source, args.target, timeout=args.timeout) as failover:
            if args.failover_command == "translate":
                translation = failover.translate(args.group, args.wait, _waiting)
                _print(translation, args.json, {})
                return 0 if not translation.blocking(accept_earliest=False) else 1
            applied = failover.apply(args.group, args.wait, args.earliest_if_deleted, _waiting)
            _print(
                applied.translation,
                args.json,
                {"written": len(applied.written), "seconds": round(applied.seconds, 3)},
            )
            if not args.json:
                print(
                    f"wrote {len(applied.written)} offset(s) for consumer group {args.group} "
                    f"in {args.target} ({applied.seconds:.2f}s); start its consumers there"
                )
            return 0
    except FailoverRefused as exc:
        print(f"kdsync failover {args.failover_command}: {exc}", file=sys.stderr)
        return 1
    except (KafkaUnavailable, RecordFormatError) as exc:
        print(f"kdsync failover {args.failover_command}: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kdsync failover", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args)
