"""Pass 3 of the audit, by sequence number: per member, how many distinct seqs it holds in
the range and how many carry two different events; then the detailed searches for gap runs
and colliding records, and the ``T-global`` records without kdsync's headers."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from kdsync.audit.checks.columns import _text, _violations, event_text
from kdsync.audit.checks.model import ORIGIN_KEY, Facts, SeqCounts, member_start
from kdsync.audit.report import DUPLICATE, FOREIGN, GAP


def seq_counts(ranged: DataFrame, facts: Facts) -> DataFrame:
    """Per topic: ``seqs`` (distinct seqs anyone holds in range) and, per member ``i`` of
    ``facts.members``, ``held_i`` (distinct seqs it holds) and ``collided_i`` (its seqs
    carrying records of two different events).

    A member holds no gap iff ``held_i`` equals its highest seq minus the range start plus
    one (all its seqs lie in between); only then is the costly search for gap runs skipped.
    """
    identity = F.xxhash64(*ORIGIN_KEY)
    per_member: list[Column] = []
    for index, member in enumerate(facts.members):
        mine = F.col("member") == F.lit(member)
        per_member += [
            F.count(F.when(mine, 1)).alias(f"n_{index}"),
            F.min(F.when(mine, identity)).alias(f"low_{index}"),
            F.max(F.when(mine, identity)).alias(f"high_{index}"),
        ]
    per_seq = ranged.groupBy("topic", "seq").agg(*per_member)
    totals: list[Column] = []
    for index in range(len(facts.members)):
        n, low, high = F.col(f"n_{index}"), F.col(f"low_{index}"), F.col(f"high_{index}")
        totals += [
            F.sum((n > 0).cast("long")).alias(f"held_{index}"),
            F.sum(((n > 1) & (low != high)).cast("long")).alias(f"collided_{index}"),
        ]
    return per_seq.groupBy("topic").agg(F.count(F.lit(1)).alias("seqs"), *totals)


def collect_seq_counts(ranged: DataFrame, facts: Facts) -> dict[str, SeqCounts]:
    counts: dict[str, SeqCounts] = {}
    for row in seq_counts(ranged, facts).collect():
        counts[row["topic"]] = SeqCounts(
            topic=row["topic"],
            seqs=row["seqs"],
            held={m: row[f"held_{i}"] for i, m in enumerate(facts.members)},
            collided={m: row[f"collided_{i}"] for i, m in enumerate(facts.members)},
        )
    return counts


def collisions(ranged: DataFrame) -> DataFrame:
    """Seqs at which one member holds records of different events."""
    shared = (
        ranged.groupBy("member", "topic", "seq")
        .agg(
            F.count(F.lit(1)).alias("records"),
            F.min(F.struct(*ORIGIN_KEY)).alias("low"),
            F.max(F.struct(*ORIGIN_KEY)).alias("high"),
        )
        .where((F.col("records") > 1) & (F.col("low") != F.col("high")))
    )
    return _violations(
        shared,
        DUPLICATE,
        F.col("seq"),
        F.col("member"),
        F.concat(
            F.lit("seq "),
            _text("seq"),
            F.lit(" is used by "),
            _text("records"),
            F.lit(" records of different events ("),
            event_text("low."),
            F.lit(", "),
            event_text("high."),
            F.lit(")"),
        ),
    )


def gaps(spark: SparkSession, ranged: DataFrame, facts: Facts) -> DataFrame:
    """Sequence numbers missing in a member between where it must begin (``member_start``)
    and its highest seq.

    Runs of missing numbers are found with two anti-joins (a seq without successor starts
    a gap, a seq without predecessor ends one), so no single task sorts a member's history.
    """
    keys = ["member", "topic"]
    present = ranged.select("member", "topic", "seq").distinct()
    # Where each member's seqs must begin (the range's start, or a seeded member's first
    # seq): a sentinel just below it, so that a run of missing seqs from there is found.
    start_rows = [
        (m, b.topic, member_start(facts, b, m)) for b in facts.bounds for m in facts.members
    ]
    schema = StructType(
        [
            StructField("member", StringType(), False),
            StructField("topic", StringType(), False),
            StructField("seq", LongType(), False),
        ]
    )
    member_starts = spark.createDataFrame(start_rows, schema).withColumnRenamed("seq", "start")
    sentinels = spark.createDataFrame([(m, t, s - 1) for m, t, s in start_rows], schema)
    present = (
        present.join(F.broadcast(member_starts), keys)
        .where(F.col("seq") >= F.col("start"))
        .drop("start")
    )
    seqs = present.unionByName(sentinels)
    highs = present.groupBy(*keys).agg(F.max("seq").alias("high"))
    has_next = seqs.select(*keys, (F.col("seq") - 1).alias("seq"))
    has_prev = seqs.select(*keys, (F.col("seq") + 1).alias("seq"))
    starts = (
        seqs.join(has_next, [*keys, "seq"], "left_anti")
        .join(highs, keys)
        .where(F.col("seq") < F.col("high"))
        .select(*keys, (F.col("seq") + 1).alias("first"), "high")
    )
    ends = (
        seqs.join(has_prev, [*keys, "seq"], "left_anti")
        .join(F.broadcast(member_starts), keys)
        .where(F.col("seq") >= F.col("start"))
        .select(*keys, (F.col("seq") - 1).alias("last"))
    )
    rank_starts = Window.partitionBy(*keys).orderBy("first")
    rank_ends = Window.partitionBy(*keys).orderBy("last")
    runs = starts.withColumn("n", F.row_number().over(rank_starts)).join(
        ends.withColumn("n", F.row_number().over(rank_ends)), [*keys, "n"]
    )
    count = F.col("last") - F.col("first") + 1
    return _violations(
        runs,
        GAP,
        F.col("first"),
        F.col("member"),
        F.concat(
            F.when(count == 1, F.concat(F.lit("seq "), _text("first"))).otherwise(
                F.concat(F.lit("seqs "), _text("first"), F.lit(".."), _text("last"))
            ),
            F.lit(" missing ("),
            _text(count),
            F.lit(" number(s)) below this member's seq "),
            _text("high"),
        ),
    )


def malformed(events: DataFrame) -> DataFrame:
    """``T-global`` records without kdsync's headers: not from any origin."""
    return _violations(
        events.where(~F.col("well_formed")),
        FOREIGN,
        F.lit(None),
        F.col("member"),
        F.concat(
            F.lit("record at "),
            F.col("topic"),
            F.lit("-global["),
            _text("gpartition"),
            F.lit("]@"),
            _text("goffset"),
            F.lit(" has no valid kdsync headers"),
        ),
    )
