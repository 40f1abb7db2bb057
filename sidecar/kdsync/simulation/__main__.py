"""``python -m kdsync.simulation``: replay one seed, or run a campaign of many."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from kdsync.simulation.campaign import run_campaign
from kdsync.simulation.runner import run_scenario
from kdsync.simulation.scenario import make_scenario


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kdsync.simulation")
    parser.add_argument("--seed", type=int, help="replay one scenario and print its outcome")
    parser.add_argument("--scenarios", type=int, default=1000, help="campaign size")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=0, help="processes (default: all cores)")
    parser.add_argument(
        "--product-links",
        action="store_true",
        help="with --seed: members link as the sidecar's peer links do (see docs/ordering.md)",
    )
    args = parser.parse_args(argv)
    if args.product_links and args.seed is None:
        parser.error("--product-links replays one scenario: give --seed too")
    if args.seed is not None:
        outcome = run_scenario(replace(make_scenario(args.seed), product_links=args.product_links))
        print(outcome.report())
        return 0 if outcome.ok else 1
    result = run_campaign(args.first_seed, args.scenarios, args.workers or None, progress=True)
    print(result.summary())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
