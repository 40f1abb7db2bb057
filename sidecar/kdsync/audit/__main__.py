"""``python -m kdsync.audit ...``: the audit command (also ``kdsync audit``)."""

from __future__ import annotations

import sys

from kdsync.audit.command import main

sys.exit(main(sys.argv[1:]))
