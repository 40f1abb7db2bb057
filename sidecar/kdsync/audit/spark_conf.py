"""Spark settings every audit needs wherever its session is made, without pyspark.

:mod:`kdsync.audit.session` applies them to the sessions it starts (``kdsync audit``,
tests); under ``spark-submit`` the session is made before the audit runs, so the operator
puts the same settings into the SparkApplication's ``sparkConf``. The operator image has no
pyspark, hence this module of constants, which imports nothing from Spark.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# Spark's default redaction pattern plus the client-certificate key that kafka_options
# passes inline (option kafka.ssl.keystore.key, a PEM "PRIVATE KEY"): Spark then redacts
# it in its Kafka parameter logs, in SQL plan options and in its UI's environment page.
REDACTION_REGEX = r"(?i)secret|password|token|access[.]?key|keystore[.]key|private key"

AUDIT_SPARK_CONF: Mapping[str, str] = MappingProxyType(
    {
        "spark.redaction.regex": REDACTION_REGEX,
        # The checks compare instants (unix_millis), which no time zone changes; UTC keeps
        # anything Spark renders as local time the same in every run, wherever it runs.
        "spark.sql.session.timeZone": "UTC",
    }
)
