"""The audit's checks: pure functions from DataFrames of records to DataFrames of violations.

Inputs are the frames of ``kdsync.audit.reader`` (``GLOBAL_SCHEMA`` rows of every member's
``T-global``, ``ORIGIN_SCHEMA`` rows of every origin's ``T``) and small driver-side facts
(the checked range per topic, each member's highest sequence number, where each origin
window starts and where its committed source offsets are). Every output frame has the
columns of ``VIOLATION_SCHEMA``; the heavy work (aggregations, joins, windows over origin
partitions) stays in Spark, and only violations, which are few when the group is healthy,
ever reach the driver.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from kdsync.audit.report import (
    DISAGREEMENT,
    DUPLICATE,
    FIDELITY,
    FOREIGN,
    GAP,
    MISSING,
    ORDER,
    UNVERIFIED,
)

ORIGIN_KEY = ["origin", "otopic", "opartition", "ooffset"]
VIOLATION_SCHEMA = StructType(
    [
        StructField("kind", StringType(), False),
        StructField("topic", StringType(), False),
        StructField("seq", LongType(), True),
        StructField("member", StringType(), False),
        StructField("detail", StringType(), False),
    ]
)
BOUNDS_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("from_seq", LongType(), False),
        StructField("to_seq", LongType(), False),
    ]
)


@dataclass(frozen=True)
class Bounds:
    """The range of sequence numbers checked for one source topic, inclusive."""

    topic: str
    from_seq: int
    to_seq: int


@dataclass(frozen=True)
class Facts:
    """Small facts the checks need, gathered on the driver from the plan and statistics.

    - ``members``: the group's data members (the ones whose ``T-global`` is checked);
    - ``highs[(topic, member)]``: the member's highest sequence number in the range
      (``from_seq - 1`` when it has none): completeness expects events up to there;
    - ``origin_starts[(origin, topic, partition)]``: first origin offset read; an event
      replicated from below it cannot be verified (retention, or checked earlier);
    - ``committed_ends[(origin, topic, partition)]``: the origin's committed source offset
      (or its visible end without one): events below it must be in the origin's T-global.
    """

    members: tuple[str, ...]
    bounds: tuple[Bounds, ...]
    highs: Mapping[tuple[str, str], int]
    origin_starts: Mapping[tuple[str, str, int], int]
    committed_ends: Mapping[tuple[str, str, int], int]


def _violations(
    frame: DataFrame, kind: str, seq: Column, member: Column, detail: Column
) -> DataFrame:
    return frame.select(
        F.lit(kind).alias("kind"),
        F.col("topic"),
        seq.cast("long").alias("seq"),
        member.alias("member"),
        F.concat(F.col("topic"), F.lit(": "), detail).alias("detail"),
    )


def event_text(prefix: str = "") -> Column:
    """``us-east/orders[0]@17``: an event by its origin coordinates."""
    return F.concat(
        F.col(f"{prefix}origin"),
        F.lit("/"),
        F.col(f"{prefix}otopic"),
        F.lit("["),
        F.col(f"{prefix}opartition").cast("string"),
        F.lit("]@"),
        F.col(f"{prefix}ooffset").cast("string"),
    )


def _text(column: Column | str) -> Column:
    return (F.col(column) if isinstance(column, str) else column).cast("string")


def _map_literal(entries: Mapping[str, int]) -> Column:
    if not entries:
        return F.lit(None).cast("map<string,bigint>")
    parts: list[Column] = []
    for key, value in sorted(entries.items()):
        parts.extend((F.lit(key), F.lit(value).cast("long")))
    return F.create_map(*parts)


def _partition_key(origin: Column, topic: Column, partition: Column) -> Column:
    return F.concat_ws("\u0000", origin, topic, partition.cast("string"))


def bounds_frame(spark: SparkSession, bounds: Iterable[Bounds]) -> DataFrame:
    rows = [(b.topic, b.from_seq, b.to_seq) for b in bounds]
    return spark.createDataFrame(rows, BOUNDS_SCHEMA)


def in_range(events: DataFrame, bounds: DataFrame) -> DataFrame:
    """Well-formed ``T-global`` rows whose sequence number is in their topic's range."""
    return (
        events.where(F.col("well_formed"))
        .join(F.broadcast(bounds), "topic")
        .where(F.col("seq").between(F.col("from_seq"), F.col("to_seq")))
    )


def repeated_copies(ranged: DataFrame) -> DataFrame:
    """Rows that repeat an event the same member already holds at an earlier position."""
    keys = ["member", "topic", *ORIGIN_KEY]
    twice = ranged.groupBy(*keys).count().where(F.col("count") > 1).drop("count")
    copies = ranged.join(twice, keys, "left_semi")
    by_position = Window.partitionBy(*keys).orderBy("gpartition", "goffset")
    return (
        copies.withColumn("copy", F.row_number().over(by_position))
        .withColumn("first_seq", F.first("seq").over(by_position))
        .where(F.col("copy") > 1)
    )


def duplicates(ranged: DataFrame, repeats: DataFrame) -> DataFrame:
    """The same origin event twice in one member; or one seq carrying different events."""
    again = _violations(
        repeats,
        DUPLICATE,
        F.col("seq"),
        F.col("member"),
        F.concat(
            F.lit("event "),
            event_text(),
            F.lit(" appears again (first at seq "),
            _text("first_seq"),
            F.lit(")"),
        ),
    )
    shared = (
        ranged.groupBy("member", "topic", "seq")
        .agg(
            F.count(F.lit(1)).alias("records"),
            F.min(F.struct(*ORIGIN_KEY)).alias("low"),
            F.max(F.struct(*ORIGIN_KEY)).alias("high"),
        )
        .where((F.col("records") > 1) & (F.col("low") != F.col("high")))
    )
    collisions = _violations(
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
    return again.unionByName(collisions)


def gaps(spark: SparkSession, ranged: DataFrame, bounds: DataFrame, facts: Facts) -> DataFrame:
    """Sequence numbers missing in a member between the range start and its highest seq.

    Runs of missing numbers are found with two anti-joins (a seq without successor starts
    a gap, a seq without predecessor ends one), so no single task sorts a member's history.
    """
    keys = ["member", "topic"]
    present = ranged.select("member", "topic", "seq").distinct()
    sentinel_rows = [(m, b.topic, b.from_seq - 1) for b in facts.bounds for m in facts.members]
    sentinels = spark.createDataFrame(
        sentinel_rows,
        StructType(
            [
                StructField("member", StringType(), False),
                StructField("topic", StringType(), False),
                StructField("seq", LongType(), False),
            ]
        ),
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
        .join(F.broadcast(bounds), "topic")
        .where(F.col("seq") >= F.col("from_seq"))
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


def disagreements(ranged: DataFrame) -> DataFrame:
    """Members holding different events (or different content) at the same seq.

    The variant most members hold is taken as the reference; every member holding another
    variant is reported. When the top variants tie, every member is reported.
    """
    variants = ranged.groupBy("topic", "seq", *ORIGIN_KEY, "digest").agg(
        F.collect_set("member").alias("members")
    )
    per_seq = (
        variants.groupBy("topic", "seq")
        .agg(
            F.count(F.lit(1)).alias("variants"),
            F.sort_array(
                F.collect_list(
                    F.struct(
                        F.size("members").alias("n"),
                        event_text().alias("event"),
                        F.hex(F.substring("digest", 1, 4)).alias("content"),
                        F.col("members"),
                    )
                ),
                asc=False,
            ).alias("all"),
        )
        .where(F.col("variants") > 1)
    )
    top = F.col("all")[0]["n"]
    ties = F.size(F.filter("all", lambda v: v["n"] == top))
    exploded = per_seq.select(
        "topic", "seq", "all", F.explode("all").alias("v"), top.alias("top"), ties.alias("ties")
    ).where((F.col("v")["n"] < F.col("top")) | (F.col("ties") > 1))
    other = F.filter(
        "all",
        lambda o: (o["event"] != F.col("v")["event"]) | (o["content"] != F.col("v")["content"]),
    )[0]
    described = exploded.select(
        "topic",
        "seq",
        F.explode(F.col("v")["members"]).alias("member"),
        F.col("v")["event"].alias("event"),
        F.col("v")["content"].alias("content"),
        other["event"].alias("other_event"),
        other["content"].alias("other_content"),
        other["n"].alias("other_n"),
    )
    return _violations(
        described,
        DISAGREEMENT,
        F.col("seq"),
        F.col("member"),
        F.concat(
            F.lit("holds "),
            F.col("event"),
            F.lit(" #"),
            F.col("content"),
            F.lit(" while "),
            _text("other_n"),
            F.lit(" member(s) hold "),
            F.col("other_event"),
            F.lit(" #"),
            F.col("other_content"),
        ),
    )


def order(ranged: DataFrame, repeats: DataFrame) -> DataFrame:
    """Events of one origin partition whose offsets do not increase with seq, per member."""
    positions = ["member", "gpartition", "goffset"]
    firsts = ranged.join(F.broadcast(repeats.select(*positions)), positions, "left_anti")
    along = Window.partitionBy("member", "topic", "origin", "otopic", "opartition").orderBy("seq")
    stepped = (
        firsts.withColumn("prev_offset", F.lag("ooffset").over(along))
        .withColumn("prev_seq", F.lag("seq").over(along))
        .where(F.col("ooffset") < F.col("prev_offset"))
    )
    return _violations(
        stepped,
        ORDER,
        F.col("seq"),
        F.col("member"),
        F.concat(
            F.lit("event "),
            event_text(),
            F.lit(" comes after offset "),
            _text("prev_offset"),
            F.lit(" of the same origin partition (seq "),
            _text("prev_seq"),
            F.lit(")"),
        ),
    )


def against_origins(
    events: DataFrame, origins: DataFrame, bounds: DataFrame, facts: Facts
) -> DataFrame:
    """Completeness (missing), fidelity, foreign events, and unverifiable events.

    One full outer join of ``T-global`` rows with origin records by origin coordinates:
    a copy whose digest differs is a fidelity violation; a copy without origin record is
    foreign unless its origin offset lies below the origin window (unverified: counted, not
    a violation); an origin record is missing from a member that should have it: its origin
    member if it is below the committed source offset, and every member whose highest seq
    reaches the seq at which other members hold it.
    """
    copies = events.where(F.col("well_formed")).withColumn("g_present", F.lit(True))
    sources = origins.withColumn("o_present", F.lit(True))
    joined = copies.join(sources, ORIGIN_KEY, "full_outer")

    key = _partition_key(F.col("origin"), F.col("otopic"), F.col("opartition"))
    starts = _map_literal({"\u0000".join(map(str, k)): v for k, v in facts.origin_starts.items()})
    committed = _map_literal(
        {"\u0000".join(map(str, k)): v for k, v in facts.committed_ends.items()}
    )
    highs = _map_literal({f"{t}\u0000{m}": v for (t, m), v in facts.highs.items()})

    matched = joined.where(F.col("g_present") & F.col("o_present")).join(
        F.broadcast(bounds), "topic"
    )
    fidelity = _violations(
        matched.where(
            (F.col("digest") != F.col("odigest"))
            & F.col("seq").between(F.col("from_seq"), F.col("to_seq"))
        ),
        FIDELITY,
        F.col("seq"),
        F.col("member"),
        F.concat(
            F.lit("event "),
            event_text(),
            F.lit(" differs from its origin record (key, value, headers or timestamp)"),
        ),
    )

    orphans = (
        joined.where(F.col("g_present") & F.col("o_present").isNull())
        .join(F.broadcast(bounds), "topic")
        .where(F.col("seq") <= F.col("to_seq"))
    )
    start = F.try_element_at(starts, key)
    members = F.array(*[F.lit(m) for m in facts.members]) if facts.members else F.array()
    known_origin = F.array_contains(members, F.col("origin"))
    same_topic = F.col("otopic") == F.col("topic")
    unverifiable = known_origin & same_topic & start.isNotNull() & (F.col("ooffset") < start)
    reason = (
        F.when(
            ~known_origin,
            F.concat(F.lit("origin "), F.col("origin"), F.lit(" is not a data member")),
        )
        .when(~same_topic, F.concat(F.lit("it names source topic "), F.col("otopic")))
        .when(start.isNull(), F.lit("the origin has no such partition"))
        .otherwise(F.lit("no such record in the origin's topic"))
    )
    foreign = _violations(
        orphans.where(~unverifiable),
        FOREIGN,
        F.col("seq"),
        F.col("member"),
        F.concat(F.lit("event "), event_text(), F.lit(" is not from any origin: "), reason),
    )
    unverified = _violations(
        orphans.where(unverifiable),
        UNVERIFIED,
        F.col("seq"),
        F.col("member"),
        F.concat(F.lit("event "), event_text(), F.lit(" is below the origin window")),
    )

    presence = (
        joined.where(F.col("o_present"))
        .groupBy(*ORIGIN_KEY)
        .agg(F.collect_set("member").alias("present"), F.min("seq").alias("ref_seq"))
        .withColumn("topic", F.col("otopic"))
    )
    commit_end = F.try_element_at(committed, key)

    def expected(member: Column) -> Column:
        high = F.try_element_at(highs, F.concat(F.col("topic"), F.lit("\u0000"), member))
        below_commit = F.coalesce(F.col("ooffset") < commit_end, F.lit(False))
        reached = F.coalesce(F.col("ref_seq") <= high, F.lit(False))
        return ~F.array_contains(F.col("present"), member) & (
            ((member == F.col("origin")) & below_commit) | reached
        )

    absent = presence.select("*", F.explode(F.filter(members, expected)).alias("member"))
    missing = _violations(
        absent,
        MISSING,
        F.col("ref_seq"),
        F.col("member"),
        F.concat(
            F.lit("event "),
            event_text(),
            F.lit(" is not in this member's T-global"),
            F.when(
                F.col("ref_seq").isNotNull(),
                F.concat(F.lit(" (others hold it at seq "), _text("ref_seq"), F.lit(")")),
            ).otherwise(F.lit(" (committed by its origin, replicated nowhere)")),
        ),
    )
    return fidelity.unionByName(foreign).unionByName(unverified).unionByName(missing)


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


def all_violations(
    spark: SparkSession, events: DataFrame, origins: DataFrame, facts: Facts
) -> DataFrame:
    """Every violation (and every unverified event) as one frame of ``VIOLATION_SCHEMA``."""
    bounds = bounds_frame(spark, facts.bounds)
    ranged = in_range(events, bounds)
    repeats = repeated_copies(ranged)
    frames: Sequence[DataFrame] = (
        duplicates(ranged, repeats),
        gaps(spark, ranged, bounds, facts),
        disagreements(ranged),
        order(ranged, repeats),
        against_origins(events, origins, bounds, facts),
        malformed(events),
    )
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result
