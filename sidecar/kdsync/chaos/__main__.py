"""``python -m kdsync.chaos``: run one fault campaign (hack/chaos wraps this)."""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

from kdsync.chaos.campaign import MEMBERS, Campaign, CampaignSettings, write_report
from kdsync.chaos.schedule import ScheduleSettings, generate_schedule, parse_kinds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hack/chaos",
        description="A seeded fault campaign against three local sidecars under traffic.",
    )
    parser.add_argument("--seed", type=int, default=None, help="default: from the clock")
    parser.add_argument("--faults", type=int, default=12, help="how many faults, one at a time")
    parser.add_argument("--kinds", default="all", help="comma-separated fault kinds, or all")
    parser.add_argument("--min-hold", type=float, default=3.0, help="shortest fault, seconds")
    parser.add_argument("--max-hold", type=float, default=12.0, help="longest fault, seconds")
    parser.add_argument("--rate", type=float, default=20.0, help="events/s into each origin")
    parser.add_argument("--run-dir", type=Path, default=None, help="logs and data (default: tmp)")
    parser.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    parser.add_argument(
        "--no-audit", action="store_true", help="skip the Spark audit after the final check"
    )
    parser.add_argument("--print-schedule", action="store_true", help="print the schedule and exit")
    args = parser.parse_args(argv)
    try:
        kinds = parse_kinds(args.kinds)
        schedule = ScheduleSettings(
            members=MEMBERS,
            faults=args.faults,
            kinds=kinds,
            min_hold_s=args.min_hold,
            max_hold_s=args.max_hold,
        )
    except ValueError as error:
        parser.error(str(error))
    seed = args.seed if args.seed is not None else int(time.time())
    if args.print_schedule:
        for fault in generate_schedule(seed, schedule):
            print(fault.describe())
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix=f"kdsync-chaos-{seed}-"))
    print(f"seed {seed}; logs in {run_dir}", flush=True)
    campaign = Campaign(
        CampaignSettings(
            seed=seed,
            faults=args.faults,
            run_dir=run_dir,
            schedule=schedule,
            rate_per_origin=args.rate,
            audit=not args.no_audit,
        )
    )
    report = campaign.run(progress=lambda line: print(line, flush=True))
    if args.report is not None:
        write_report(report, args.report)
    print(report.summary())
    return 0 if not report.violations else 1


if __name__ == "__main__":
    sys.exit(main())
