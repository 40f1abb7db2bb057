"""Shared pytest setup: test helpers import as ``tests.support.<module>``.

The repository root goes on ``sys.path`` so that works however pytest is started
(``pytest`` or ``python -m pytest``, from any folder); ``tests/`` too, so the shorter
``support.<module>`` also works.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
for entry in (str(REPO_ROOT), str(TESTS_DIR)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

# Local Spark (the audit's and backfill's tests, the chaos campaign's audit, and the
# ``kdsync members add`` these tests start) runs its JVM with the client compiler only. On
# test-sized data the optimising compiler costs more CPU than it wins back: an audit of
# 6,000 events took 17 against 32 CPU seconds, the data-member join test 259 against 347.
# On audits past a few hundred thousand events it is the other way round, so this is set
# for tests only. SPARK_SUBMIT_OPTS is Spark's own variable for the options of the JVM
# that ``spark-submit`` starts (the driver, for a local session); a value set outside wins.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")
