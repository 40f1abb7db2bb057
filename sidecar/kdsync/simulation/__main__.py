"""``python -m kdsync.simulation``: replay one seed, or run a campaign of many."""

from __future__ import annotations

import argparse
import logging
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
    links = parser.add_mutually_exclusive_group()
    links.add_argument(
        "--product-links",
        action="store_true",
        help="with --seed: members link as the sidecar's peer links do, whatever the seed "
        "draws (see docs/ordering.md, The simulator)",
    )
    links.add_argument(
        "--every-pair-links",
        action="store_true",
        help="with --seed: every pair of members is linked, whatever the seed draws",
    )
    args = parser.parse_args(argv)
    if (args.product_links or args.every_pair_links) and args.seed is None:
        parser.error("--product-links and --every-pair-links replay one scenario: give --seed")
    if args.seed is not None:
        scenario = make_scenario(args.seed)
        if args.product_links or args.every_pair_links:
            scenario = replace(scenario, product_links=args.product_links)
        outcome = run_scenario(scenario)
        print(outcome.report())
        return 0 if outcome.ok else 1
    # The simulated members' own logs (a link refused, an address missing) say nothing
    # over thousands of scenarios; a failing seed replays with them.
    logging.getLogger("kdsync").setLevel(logging.CRITICAL)
    result = run_campaign(args.first_seed, args.scenarios, args.workers or None, progress=True)
    print(result.summary())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
