"""Main file of the audit's SparkApplication (type Python, ``mainApplicationFile``).

``spark-submit`` runs this file as a script; its arguments are the audit's, e.g.
``--config /etc/kdsync/config.yaml --report-configmap kdsync/orders-audit``.
"""

from __future__ import annotations

import sys

from kdsync.audit.command import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
