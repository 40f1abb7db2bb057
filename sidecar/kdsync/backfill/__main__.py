"""``python -m kdsync.backfill``: see ``kdsync.backfill.command``."""

import sys

from kdsync.backfill.command import main

sys.exit(main())
