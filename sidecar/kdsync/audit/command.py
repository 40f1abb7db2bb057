"""``kdsync audit``: check a group's consistency with Spark and report.

Exit status: 0 the group passed, 1 violations were found, 2 the audit could not run (bad
config or state, TLS settings Spark's Kafka client cannot use, unreachable
Kafka, Spark or its Kafka connector missing, a Spark job that failed, ConfigMap not
writable): then one line on stderr says what and how to fix it. A Spark job's failure is
named by its Java exceptions (e.g. Kafka's ``SslAuthenticationException`` and its cause),
not by the Py4J call that reported it. Before that, one warning line per member lists the
Kafka properties that Spark's Kafka client does not get.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from py4j.protocol import Py4JJavaError
from pyspark.errors.exceptions.captured import CapturedException

from kdsync.audit.configmap import ConfigMapError, ReportConfigMap
from kdsync.audit.job import AuditOptions, run_audit
from kdsync.audit.kafka_options import KafkaOptionsError, java_kafka_options
from kdsync.audit.membership import MembershipProblem
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
from kdsync.config import ConfigError, MemberConfig, SidecarConfig, load_config

EXIT_PASSED = 0
EXIT_VIOLATIONS = 1
EXIT_CANNOT_RUN = 2
SHOWN_VIOLATIONS = 10
DEBUG_ENV = "KDSYNC_AUDIT_DEBUG"
# How much of a Java exception chain the one line shows.
JAVA_CAUSES_SHOWN = 3
JAVA_CAUSE_CHARS = 300
JAVA_CHAIN_LIMIT = 32


class CannotRun(Exception):
    """The audit cannot run; the message is the one line to print."""


class SparkJobFailed(Exception):
    """A Spark job failed (a Java exception); the message is the one line to print, the
    ``__cause__`` the Python error with the Java stack trace (shown with the debug flag)."""


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
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log how long each Spark phase takes"
    )
    return parser


def _config_problem(error: ConfigError) -> str:
    problems = "; ".join(str(p) for p in error.problems)
    return f"bad config {error.source}: {problems}"


def check_kafka_options(config: SidecarConfig, err: TextIO) -> None:
    """Translate every data member's Kafka properties for Spark's (Java) Kafka client now,
    before anything connects: a ``KafkaOptionsError`` becomes ``CannotRun`` naming the
    member, and properties the translation leaves out are listed once per member on
    ``err`` (such a cluster may still be readable, or Spark fails with Kafka's error)."""
    for member in config.data_members:
        assert member.kafka is not None
        try:
            _, unsupported = java_kafka_options(member.kafka.properties)
        except KafkaOptionsError as error:
            raise CannotRun(
                f"member {member.name}: members[].kafka.properties for Spark's Kafka client: "
                f"{error}"
            ) from None
        if unsupported:
            print(
                f"kdsync audit: warning: member {member.name}: not passed to Spark's Kafka "
                f"client: {', '.join(unsupported)} (librdkafka-only or not translated; see "
                "docs/audit.md, Kafka security)",
                file=err,
            )


def _java_throwable(error: BaseException) -> Any | None:
    """The Java exception behind ``error``: a ``Py4JJavaError``'s, or the origin of one of
    pyspark's captured exceptions (``AnalysisException``, ``SparkRuntimeException``, ...)."""
    candidates: tuple[BaseException | None, ...] = (error,)
    if isinstance(error, CapturedException):  # pyspark raises these from the Py4JJavaError
        candidates += (error.__cause__, error.__context__)
    for candidate in candidates:
        if isinstance(candidate, Py4JJavaError):
            return candidate.java_exception
        if isinstance(candidate, CapturedException):
            origin = getattr(candidate, "_origin", None)
            if origin is not None:
                return origin
    return None


def _java_chain(throwable: Any) -> list[tuple[str, str]]:
    """``(class name, toString())`` of ``throwable`` and its causes, outermost first."""
    chain: list[tuple[str, str]] = []
    current = throwable
    while current is not None and len(chain) < JAVA_CHAIN_LIMIT:
        chain.append((str(current.getClass().getName()), str(current.toString())))
        current = current.getCause()
    return chain


def _first_line(text: str) -> str:
    stripped = text.strip()
    return stripped.splitlines()[0].strip() if stripped else ""


def java_failure(chain: Sequence[tuple[str, str]], members: Sequence[MemberConfig]) -> str:
    """One line naming the Java exceptions of ``chain`` (from :func:`_java_chain`) that say
    what happened, and the member if the exceptions name exactly one.

    Wrappers whose message only repeats their cause (``ExecutionException``, Spark's
    ``Job aborted ...: <cause>``) or is empty are left out; of the rest, at most
    ``JAVA_CAUSES_SHOWN`` are joined by "caused by" (the first ones and the root).
    """
    lines = [_first_line(text) or name for name, text in chain]
    kept: list[str] = []
    for index, line in enumerate(lines):
        following = lines[index + 1] if index + 1 < len(lines) else None
        if following is not None and (following in line or line == chain[index][0]):
            continue
        kept.append(line[:JAVA_CAUSE_CHARS])
    causes = "; caused by ".join(kept)
    if len(kept) > JAVA_CAUSES_SHOWN:
        causes = "; caused by ".join(kept[: JAVA_CAUSES_SHOWN - 1])
        causes += f"; ...; caused by {kept[-1]}"
    kafka = any(name.startswith("org.apache.kafka.") for name, _ in chain)
    what = "Spark's Kafka client failed" if kafka else "Spark failed"
    text = f"{what}: {causes}"
    member = _member_named(" ".join(t for _, t in chain), members)
    return f"member {member}: {text}" if member is not None else text


def _member_named(text: str, members: Sequence[MemberConfig]) -> str | None:
    """The one member whose read (its consumer group ``kdsync-audit-<member>-<8 hex>``,
    set by the reader) or whose brokers ``text`` mentions; None if none or several."""
    named = set()
    for member in members:
        group = re.escape(f"kdsync-audit-{member.name}-") + r"[0-9a-f]{8}\b"
        servers = member.kafka.bootstrap_servers.split(",") if member.kafka else []
        if re.search(group, text) or any(server in text for server in servers):
            named.add(member.name)
    return named.pop() if len(named) == 1 else None


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
    check_kafka_options(config, sys.stderr)
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
    except (
        StateError,
        KafkaUnreachable,
        MembershipProblem,
        SparkSetupError,
        ConfigMapError,
    ) as error:
        raise CannotRun(str(error)) from None
    except KafkaOptionsError as error:  # a certificate file changed since check_kafka_options
        raise CannotRun(f"Kafka properties for Spark's Kafka client: {error}") from None
    except OSError as error:
        raise CannotRun(f"{error.filename or 'file'}: {error.strerror or error}") from None
    except Exception as error:  # a Spark job that failed midway, e.g. a broker refused it
        throwable = _java_throwable(error)
        if throwable is None:
            raise
        try:
            chain = _java_chain(throwable)
        except Exception:  # the JVM is gone: nothing more to learn than the error itself
            raise error from None
        raise SparkJobFailed(java_failure(chain, config.data_members)) from error
    print_summary(outcome.report, out)
    return EXIT_PASSED if outcome.report.passed else EXIT_VIOLATIONS


def main(argv: list[str]) -> int:
    """Run ``kdsync audit`` with ``argv`` (without the program name); return the exit status."""
    args = build_parser().parse_args(argv)
    if args.verbose:
        phases = logging.getLogger("kdsync.audit")
        phases.setLevel(logging.INFO)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("kdsync audit: %(message)s"))
        phases.addHandler(handler)
    try:
        return _run(args, sys.stdout)
    except CannotRun as error:
        print(f"kdsync audit: cannot run: {error}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    except Exception as error:  # a Spark job that failed midway, e.g. a broker went away
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        if isinstance(error, SparkJobFailed):
            line = str(error)
        else:
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            line = f"{type(error).__name__}: {first[:300]}"
        print(
            f"kdsync audit: cannot run: {line} (set {DEBUG_ENV}=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_CANNOT_RUN
