"""Shared pytest setup: test helpers import as ``tests.support.<module>``.

The repository root goes on ``sys.path`` so that works however pytest is started
(``pytest`` or ``python -m pytest``, from any folder); ``tests/`` too, so the shorter
``support.<module>`` also works.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
for entry in (str(REPO_ROOT), str(TESTS_DIR)):
    if entry not in sys.path:
        sys.path.insert(0, entry)
