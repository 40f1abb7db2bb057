"""``kdsync audit`` run inside another command (the demo and the fault campaigns end with
it). Importing this module loads nothing of Spark; calling it does."""

from __future__ import annotations

from pathlib import Path


class AuditUnavailable(Exception):
    """This build has no Spark audit (PySpark or what it needs cannot be imported)."""


def audit_to_report(config: Path, report: Path) -> int:
    """``kdsync audit --config CONFIG --report REPORT`` in this process; its exit status
    (0 passed, 1 violations found, 2 could not run: its stderr line says why)."""
    try:
        from kdsync.audit.command import main  # noqa: PLC0415 (loads Spark)
    except ImportError as error:
        raise AuditUnavailable(str(error)) from error
    return main(["--config", str(config), "--report", str(report)])
