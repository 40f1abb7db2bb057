"""The backfill on its own: seed a new data member's cluster from a peer, for a member the
group already counts as a learner. The operator runs it as a SparkApplication (its main
file is ``spark_main.py``); ``kdsync members add --member-config`` runs the same
``Backfill`` in its own process, between the learner's addition and its start.

Arguments: ``--config`` (the new member's own config file, which lists every member's
Kafka), ``--status-url`` once per member (its HTTP endpoint, for ``/status``), and
``--timeout``. Exit 0 when the cluster is seeded (now or by an earlier run, so a rerun is
harmless), 1 with a message naming the problem otherwise, 2 for a bad config.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kdsync.audit.session import audit_session
from kdsync.backfill.copy_job import BackfillError
from kdsync.backfill.join import Backfill
from kdsync.backfill.seeding import SeedingError
from kdsync.config import ConfigError, load_config
from kdsync.runtime.members_command import MembersCommandError, look


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kdsync.backfill", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="the new member's config")
    parser.add_argument(
        "--status-url", action="append", required=True, help="a member's HTTP endpoint"
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds (default 3600)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if config.is_witness:
        print(f"{args.config}: {config.member} is a witness: it has no T-global", file=sys.stderr)
        return 2
    urls = list(args.status_url)

    def statuses() -> Mapping[str, Mapping[str, Any]]:
        return look(urls).statuses

    backfill = Backfill(config, lambda: audit_session(None, {}), print)
    try:
        seeded = backfill(statuses, time.monotonic() + args.timeout)
    except (MembersCommandError, SeedingError, BackfillError) as exc:
        print(f"backfill of {config.member}: {exc}", file=sys.stderr)
        return 1
    print(f"backfill of {config.member}: {'done' if seeded else 'it was seeded already'}")
    return 0
