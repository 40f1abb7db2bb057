"""Spark DataFrames of kdsync records, read with Spark's Kafka source (spark-sql-kafka-0-10).

Every read is a batch read of planned offsets (``assign`` + explicit ``startingOffsets`` /
``endingOffsets``, end exclusive) with ``includeHeaders=true`` and ``read_committed``.
Parsing is done with Spark's built-in functions (no Python UDFs):

- ``global_events``: one row per ``T-global`` record with its kdsync headers parsed (taken
  from the end, as ``docs/record-format.md`` says) and a digest of what the user wrote;
- ``origin_events``: one row per origin ``T`` record with the same digest.

The digest covers key, value (null distinct from empty), the user's headers (names,
values, order, null values) and the timestamp in milliseconds. It is SHA-256, cut to 16
bytes: collisions are not a practical concern for an audit.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from kdsync.audit.kafka_options import java_kafka_options
from kdsync.audit.positions import TopicPlan, TopicRange
from kdsync.record_format import KDSYNC_HEADERS

GLOBAL_SCHEMA = StructType(
    [
        StructField("member", StringType(), False),
        StructField("topic", StringType(), False),
        StructField("gpartition", IntegerType(), False),
        StructField("goffset", LongType(), False),
        StructField("well_formed", BooleanType(), False),
        StructField("seq", LongType(), True),
        StructField("origin", StringType(), True),
        StructField("otopic", StringType(), True),
        StructField("opartition", IntegerType(), True),
        StructField("ooffset", LongType(), True),
        StructField("digest", BinaryType(), True),
    ]
)
ORIGIN_SCHEMA = StructType(
    [
        StructField("origin", StringType(), False),
        StructField("otopic", StringType(), False),
        StructField("opartition", IntegerType(), False),
        StructField("ooffset", LongType(), False),
        StructField("odigest", BinaryType(), True),
    ]
)


def read_range(
    spark: SparkSession, rng: TopicRange, min_partitions: int | None = None
) -> DataFrame:
    """The raw Kafka source rows of ``rng`` (key, value, partition, offset, timestamp, headers)."""
    partitions = sorted(rng.end)
    offsets = {rng.topic: {str(p): rng.start[p] for p in partitions}}
    ends = {rng.topic: {str(p): rng.end[p] for p in partitions}}
    options, _ = java_kafka_options(rng.properties)
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", rng.bootstrap)
        .option("kafka.isolation.level", "read_committed")
        .option("assign", json.dumps({rng.topic: partitions}))
        .option("startingOffsets", json.dumps(offsets))
        .option("endingOffsets", json.dumps(ends))
        .option("includeHeaders", "true")
        # Spark pools executor consumers by group id and topic partition, and every member
        # has a partition T-global-0: a group id naming the member keeps them apart, and
        # shows in the brokers' logs which audit read what.
        .option("groupIdPrefix", f"kdsync-audit-{rng.member}-{uuid.uuid4().hex[:8]}")
        # A range that cannot be read completely (retention racing the read, a broker gone)
        # fails the run (exit 2) rather than silently checking less than planned.
        .option("failOnDataLoss", "true")
    )
    for name, value in options.items():
        reader = reader.option(f"kafka.{name}", value)
    if min_partitions is not None:
        reader = reader.option("minPartitions", str(min_partitions))
    return reader.load()


def record_digest(headers: Column) -> Column:
    """16 bytes identifying key, value, the given user ``headers`` and the timestamp (ms)."""
    header_text = F.array_join(
        F.transform(
            headers,
            lambda h: F.concat(
                F.length(h["key"]).cast("string"),
                F.lit(":"),
                h["key"],
                F.lit("="),
                F.coalesce(F.base64(h["value"]), F.lit("~")),
            ),
        ),
        ",",
    )
    text = F.concat_ws(
        "|",
        F.coalesce(F.sha2(F.col("key"), 256), F.lit("~")),
        F.coalesce(F.sha2(F.col("value"), 256), F.lit("~")),
        header_text,
        F.unix_millis(F.col("timestamp")).cast("string"),
    )
    return F.substring(F.unhex(F.sha2(text.cast("binary"), 256)), 1, 16)


def parse_global(raw: DataFrame, member: str, topic: str) -> DataFrame:
    """``T-global`` rows of one member: kdsync headers from the end, digest of the rest.

    Built in stages (headers, then their checks, then the values) so that Spark computes
    each check once per row instead of inlining it into every column that depends on it.
    """
    count = len(KDSYNC_HEADERS)
    empty = F.array().cast(raw.schema["headers"].dataType)
    staged = raw.select(
        F.col("key"),
        F.col("value"),
        F.col("timestamp"),
        F.col("partition").alias("gpartition"),
        F.col("offset").alias("goffset"),
        F.coalesce(F.col("headers"), empty).alias("headers"),
    )
    tail = [F.element_at(F.col("headers"), index - count) for index in range(count)]
    names_ok = F.size("headers") >= count
    for element, name in zip(tail, KDSYNC_HEADERS, strict=True):
        names_ok = names_ok & F.coalesce(element["key"] == F.lit(name), F.lit(False))
    texts = [F.when(F.col("names_ok"), element["value"].cast("string")) for element in tail]
    parsed = staged.withColumn("names_ok", names_ok).select(
        "*",
        texts[0].try_cast("bigint").alias("p_seq"),
        texts[1].alias("p_origin"),
        texts[2].alias("p_otopic"),
        texts[3].try_cast("int").alias("p_opartition"),
        texts[4].try_cast("bigint").alias("p_ooffset"),
    )
    well_formed = (
        F.col("names_ok")
        & F.col("p_seq").isNotNull()
        & F.col("p_opartition").isNotNull()
        & F.col("p_ooffset").isNotNull()
        & F.coalesce(F.length("p_origin") > 0, F.lit(False))
        & F.coalesce(F.length("p_otopic") > 0, F.lit(False))
    )
    user_headers = F.when(
        F.col("names_ok"), F.slice("headers", 1, F.size("headers") - count)
    ).otherwise(F.col("headers"))
    checked = parsed.withColumn("well_formed", well_formed)
    return checked.select(
        F.lit(member).alias("member"),
        F.lit(topic).alias("topic"),
        F.col("gpartition"),
        F.col("goffset"),
        F.col("well_formed"),
        *(
            F.when(F.col("well_formed"), F.col(f"p_{name}")).alias(name)
            for name in ("seq", "origin", "otopic", "opartition", "ooffset")
        ),
        record_digest(user_headers).alias("digest"),
    )


def parse_origin(raw: DataFrame, member: str, topic: str) -> DataFrame:
    """Origin ``T`` rows of one member with the digest of what the user wrote."""
    headers = F.coalesce(F.col("headers"), F.array().cast(raw.schema["headers"].dataType))
    return raw.select(
        F.lit(member).alias("origin"),
        F.lit(topic).alias("otopic"),
        F.col("partition").alias("opartition"),
        F.col("offset").alias("ooffset"),
        record_digest(headers).alias("odigest"),
    )


def _union(spark: SparkSession, frames: Sequence[DataFrame], schema: StructType) -> DataFrame:
    if not frames:
        return spark.createDataFrame([], schema)
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def global_events(
    spark: SparkSession, plans: Sequence[TopicPlan], min_partitions: int | None = None
) -> DataFrame:
    """Every planned ``T-global`` record of every member (columns: ``GLOBAL_SCHEMA``)."""
    frames = [
        parse_global(read_range(spark, rng, min_partitions), rng.member, plan.topic)
        for plan in plans
        for rng in plan.globals
        if rng.records > 0
    ]
    return _union(spark, frames, GLOBAL_SCHEMA)


def origin_events(
    spark: SparkSession, plans: Sequence[TopicPlan], min_partitions: int | None = None
) -> DataFrame:
    """Every planned origin ``T`` record (columns: ``ORIGIN_SCHEMA``)."""
    frames = [
        parse_origin(read_range(spark, rng, min_partitions), rng.member, plan.topic)
        for plan in plans
        for rng in plan.origins
        if rng.records > 0
    ]
    return _union(spark, frames, ORIGIN_SCHEMA)
