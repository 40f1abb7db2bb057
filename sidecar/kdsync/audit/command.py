"""``kdsync audit``: check a group's consistency with Spark and report.

Exit status: 0 the group passed, 1 violations were found, 2 the audit could not run (bad
config or state, unreachable Kafka, Spark or its Kafka connector missing, ConfigMap not
writable): then one line on stderr says what and how to fix it.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import TextIO

from kdsync.audit.configmap import ConfigMapError, ReportConfigMap
from kdsync.audit.job import AuditOptions, run_audit
from kdsync.audit.positions import DEFAULT_KAFKA_TIMEOUT, KafkaUnreachable, plan_audit
from kdsync.audit.report import DEFAULT_VIOLATION_CAP, Report
from kdsync.audit.session import SparkSetupError, audit_session
from kdsync.audit.state import (
    AuditState,
    StateError,
    load_state_file,
    parse_state,
    write_text_atomically,
)
from kdsync.config import ConfigError, load_config

EXIT_PASSED = 0
EXIT_VIOLATIONS = 1
EXIT_CANNOT_RUN = 2
SHOWN_VIOLATIONS = 10
DEBUG_ENV = "KDSYNC_AUDIT_DEBUG"


class CannotRun(Exception):
    """The audit cannot run; the message is the one line to print."""


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def _setting(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kdsync audit",
        description="Check with Spark that every member's T-global holds the same events in "
        "the same order, exactly once, complete and unaltered.",
    )
    parser.add_argument("--config", type=Path, required=True, help="a sidecar's YAML config")
    parser.add_argument("--report", type=Path, help="write the JSON report to this file")
    parser.add_argument(
        "--state", type=Path, help="continue from, and save, where the last clean run ended"
    )
    parser.add_argument(
        "--report-configmap",
        metavar="NAMESPACE/NAME",
        help="write report.json (and state.json after a clean run) into this ConfigMap and "
        "continue from its state.json",
    )
    parser.add_argument("--from-seq", type=_non_negative, help="first global seq to check")
    parser.add_argument("--to-seq", type=_non_negative, help="last global seq to check")
    parser.add_argument(
        "--violation-cap",
        type=_non_negative,
        default=DEFAULT_VIOLATION_CAP,
        help=f"list at most N violations in the report (default {DEFAULT_VIOLATION_CAP})",
    )
    parser.add_argument("--master", help="Spark master (default local[2], or spark-submit's)")
    parser.add_argument(
        "--spark-conf",
        type=_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark setting, e.g. spark.driver.memory=4g (repeatable)",
    )
    parser.add_argument(
        "--min-partitions",
        type=_non_negative,
        help="split each Kafka partition into at least this many Spark tasks in total",
    )
    parser.add_argument(
        "--kafka-timeout",
        type=float,
        default=DEFAULT_KAFKA_TIMEOUT,
        help=f"seconds to wait for each Kafka cluster (default {DEFAULT_KAFKA_TIMEOUT:g})",
    )
    return parser


def _config_problem(error: ConfigError) -> str:
    problems = "; ".join(str(p).strip().replace("\n", " ") for p in error.problems)
    return f"bad config {error.source}: {problems}"


def print_summary(report: Report, out: TextIO) -> None:
    print(report.summary, file=out)
    for violation in report.violations[:SHOWN_VIOLATIONS]:
        seq = "-" if violation.seq is None else str(violation.seq)
        print(
            f"  {violation.kind:<12} seq {seq:<8} {violation.member:<16} {violation.detail}",
            file=out,
        )
    hidden = report.violations_total - min(len(report.violations), SHOWN_VIOLATIONS)
    if hidden > 0:
        print(f"  ... and {hidden} more (see the JSON report)", file=out)


def _run(args: argparse.Namespace, out: TextIO) -> int:
    try:
        config = load_config(args.config, check_files=False)
    except ConfigError as error:
        raise CannotRun(_config_problem(error)) from None
    if args.from_seq is not None and args.to_seq is not None and args.to_seq < args.from_seq:
        raise CannotRun(f"--to-seq {args.to_seq} is below --from-seq {args.from_seq}")
    configmap = None
    state: AuditState | None = None
    try:
        if args.report_configmap:
            configmap = ReportConfigMap(args.report_configmap)
        if args.state is not None:
            state = load_state_file(args.state, config.group)
        elif configmap is not None:
            text = configmap.read_state()
            if text is not None:
                source = f"state.json of ConfigMap {args.report_configmap}"
                state = parse_state(text, source, config.group)
        plan = plan_audit(config, state, timeout=args.kafka_timeout)
        spark = audit_session(args.master, dict(args.spark_conf))
        outcome = run_audit(
            spark,
            plan,
            state,
            AuditOptions(
                from_seq=args.from_seq,
                to_seq=args.to_seq,
                violation_cap=args.violation_cap,
                min_partitions=args.min_partitions or None,
            ),
        )
        report_json = outcome.report.to_json()
        state_json = outcome.next_state.to_json() if outcome.next_state is not None else None
        if args.report is not None:
            write_text_atomically(args.report, report_json)
        if args.state is not None and state_json is not None:
            write_text_atomically(args.state, state_json)
        if configmap is not None:
            configmap.write(report_json, state_json)
    except (StateError, KafkaUnreachable, SparkSetupError, ConfigMapError) as error:
        raise CannotRun(str(error)) from None
    except OSError as error:
        raise CannotRun(f"{error.filename or 'file'}: {error.strerror or error}") from None
    print_summary(outcome.report, out)
    return EXIT_PASSED if outcome.report.passed else EXIT_VIOLATIONS


def main(argv: list[str]) -> int:
    """Run ``kdsync audit`` with ``argv`` (without the program name); return the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return _run(args, sys.stdout)
    except CannotRun as error:
        print(f"kdsync audit: cannot run: {error}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    except Exception as error:  # a Spark job that failed midway, e.g. a broker went away
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        print(
            f"kdsync audit: cannot run: {type(error).__name__}: {first[:300]} "
            f"(set {DEBUG_ENV}=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_CANNOT_RUN
