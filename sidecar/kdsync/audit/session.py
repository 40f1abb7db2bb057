"""The Spark session the audit runs in.

Locally (``kdsync audit``, tests, the benchmark) the audit starts Spark in local mode and
hands it the Kafka connector jars that ``hack/fetch-spark`` cached: nothing is resolved
and nothing is downloaded when an audit runs. Under ``spark-submit`` (a SparkApplication
of the spark-operator) the session already exists with the connector on its classpath,
and the audit uses it as it is.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from kdsync.audit.spark_conf import AUDIT_SPARK_CONF
from kdsync.localkafka.distribution import cache_dir

JARS_ENV = "KDSYNC_SPARK_JARS"
DEFAULT_MASTER = "local[2]"
DEFAULT_SETTINGS: Mapping[str, str] = {
    # Few cores, small data per shuffle in tests; the benchmark raises it.
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "2g",
    "spark.ui.showConsoleProgress": "false",
    # What every audit session needs (the operator sets these in the SparkApplication):
    # spark.redaction.regex (spark_conf.REDACTION_REGEX), spark.sql.session.timeZone=UTC.
    **AUDIT_SPARK_CONF,
}


class SparkSetupError(RuntimeError):
    """Spark cannot start, or its Kafka connector is not provisioned (message has the fix)."""


def spark_version() -> str:
    import pyspark  # noqa: PLC0415 - only to read its version

    return str(pyspark.__version__)


def connector_jars(environ: Mapping[str, str] | None = None) -> list[str]:
    """The jars of ``spark-sql-kafka-0-10`` for the installed pyspark (from ``hack/fetch-spark``).

    ``$KDSYNC_SPARK_JARS`` may name another folder holding them.
    """
    env = os.environ if environ is None else environ
    version = spark_version()
    configured = env.get(JARS_ENV)
    folder = Path(configured) if configured else cache_dir(env) / "spark" / version / "jars"
    jars = sorted(str(jar) for jar in folder.glob("*.jar")) if folder.is_dir() else []
    connector = f"spark-sql-kafka-0-10_2.13-{version}.jar"
    if not any(Path(jar).name == connector for jar in jars):
        raise SparkSetupError(
            f"Spark's Kafka connector {connector} is not in {folder}; run hack/fetch-spark "
            f"(or hack/bootstrap) to fetch it for pyspark {version}"
        )
    return jars


def under_spark_submit(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this Python was started by ``spark-submit`` (which owns the session)."""
    env = os.environ if environ is None else environ
    return "PYSPARK_GATEWAY_PORT" in env


# Local Spark logs only errors, from its first line on: setLogLevel comes too late for
# the start-up chatter, which buries the audit's summary in the demo's output.
_QUIET_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
"""


def _quiet_logging(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Settings that start a local Spark with the quiet log4j2 configuration above."""
    path = cache_dir(environ) / "spark" / "log4j2-audit.properties"
    if not path.exists() or path.read_text(encoding="utf-8") != _QUIET_LOG4J2:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_QUIET_LOG4J2, encoding="utf-8")
    return {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{path}"}


def audit_session(
    master: str | None = None, settings: Mapping[str, str] | None = None
) -> SparkSession:
    """The active session if there is one, else a new one (local unless under spark-submit)."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.appName("kdsync-audit")
    if under_spark_submit() and master is None:
        for key, value in (settings or {}).items():
            builder = builder.config(key, value)
    else:
        jars = connector_jars()
        # A local session listens on loopback only (and Spark stops warning that the host
        # name resolves to it).
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Python tasks (the backfill's writers) run in this interpreter, not in whatever
        # `python3` is on PATH, which may lack kdsync and confluent-kafka (PySpark takes
        # the workers' interpreter from this variable only).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = builder.master(master or DEFAULT_MASTER).config("spark.jars", ",".join(jars))
        local = {**DEFAULT_SETTINGS, **_quiet_logging(), **(settings or {})}
        for key, value in local.items():
            builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as error:  # Java missing, bad settings, port clash: all end here
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise SparkSetupError(
            f"Spark did not start ({first}); PySpark needs Java 17 or 21 on PATH or JAVA_HOME"
        ) from None
    spark.sparkContext.setLogLevel("ERROR")
    return spark
