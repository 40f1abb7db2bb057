"""Main file of the backfill's SparkApplication (type Python, ``mainApplicationFile``):
``spark-submit`` runs it as a script with ``kdsync.backfill.command``'s arguments."""

from __future__ import annotations

import sys

from kdsync.backfill.command import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
