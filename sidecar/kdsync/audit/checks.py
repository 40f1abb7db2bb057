"""The audit's checks: pure functions from DataFrames of records to DataFrames of violations.

Inputs are the frames of ``kdsync.audit.reader`` (``GLOBAL_SCHEMA`` rows of every member's
``T-global``, ``ORIGIN_SCHEMA`` rows of every origin's ``T``) and small driver-side facts
(the checked range per topic, each member's highest sequence number, where each origin
window starts, where its committed source offsets are, and up to where an earlier clean
run saw each origin partition replicated).

Shuffles are what an audit costs, so the checks share as few as possible:

1. **by event** (origin coordinates): every member's copies of one origin event meet the
   origin record in one row. From that row alone come duplicates (a second copy in one
   member), disagreement (a member holds the event at another seq, or with other content,
   than most members), fidelity (content differs from the origin record), foreign events
   (no origin record), missing events, and re-deliveries of events an earlier run audited;
2. **along each origin partition**: a window over those rows in origin-offset order finds,
   per member, an event held at a higher seq than the next event of its partition (origin
   order), without sorting any member's whole history;
3. **by sequence number**: per member, how many distinct seqs it holds in the range and
   whether a seq carries two different events. Gaps and collisions are then described in
   detail only for the members whose counts show them (see ``seq_counts``).

Every violation frame has the columns of ``VIOLATION_SCHEMA``; only violations, which are
few when the group is healthy, ever reach the driver.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

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


OriginPartition = tuple[str, str, int]  # (origin member, source topic, partition)


@dataclass(frozen=True)
class Facts:
    """Small facts the checks need, gathered on the driver from the plan and statistics.

    - ``members``: the group's data members (the ones whose ``T-global`` is checked);
    - ``highs[(topic, member)]``: the member's highest sequence number in the range
      (``from_seq - 1`` when it has none): completeness expects events up to there;
    - ``origin_starts[(origin, topic, partition)]``: first origin offset read; an event
      replicated from below it cannot be verified (retention, or checked earlier);
    - ``committed_ends[(origin, topic, partition)]``: the origin's committed source offset
      (or its visible end without one): events below it must be in the origin's T-global;
    - ``audited_ends[(origin, topic, partition)]``: from the last clean run's state, the
      first origin offset not yet replicated below this run's range: an event from below
      it that shows up again in the range was delivered twice (or out of order).
    """

    members: tuple[str, ...]
    bounds: tuple[Bounds, ...]
    highs: Mapping[tuple[str, str], int]
    origin_starts: Mapping[OriginPartition, int]
    committed_ends: Mapping[OriginPartition, int]
    audited_ends: Mapping[OriginPartition, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SeqCounts:
    """Pass 3's result for one topic: distinct seqs held in range by anyone and by each
    member, and how many seqs of each member carry two different events."""

    topic: str
    seqs: int
    held: Mapping[str, int]
    collided: Mapping[str, int]


def _violation(kind: str, topic: Column, seq: Column, member: Column, detail: Column) -> Column:
    return F.struct(
        F.lit(kind).alias("kind"),
        topic.alias("topic"),
        seq.cast("long").alias("seq"),
        member.alias("member"),
        F.concat(topic, F.lit(": "), detail).alias("detail"),
    )


def _violations(
    frame: DataFrame, kind: str, seq: Column, member: Column, detail: Column
) -> DataFrame:
    return frame.select(_violation(kind, F.col("topic"), seq, member, detail).alias("v")).select(
        "v.*"
    )


def event_text(prefix: str = "", offset: Column | None = None) -> Column:
    """``us-east/orders[0]@17``: an event by its origin coordinates."""
    return F.concat(
        F.col(f"{prefix}origin"),
        F.lit("/"),
        F.col(f"{prefix}otopic"),
        F.lit("["),
        F.col(f"{prefix}opartition").cast("string"),
        F.lit("]@"),
        (F.col(f"{prefix}ooffset") if offset is None else offset).cast("string"),
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


def _partition_map(entries: Mapping[OriginPartition, int]) -> Column:
    return _map_literal({"\u0000".join(map(str, k)): v for k, v in entries.items()})


def _partition_key() -> Column:
    return F.concat_ws(
        "\u0000", F.col("origin"), F.col("otopic"), F.col("opartition").cast("string")
    )


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


# -- pass 1: by event ---------------------------------------------------------------------


def event_copies(
    events: DataFrame, origins: DataFrame, bounds: DataFrame, members: Sequence[str]
) -> DataFrame:
    """One row per origin event: ``copies`` (every member's copies, sorted by member and
    position in its ``T-global``), ``odigest`` and ``o_present`` (the origin record), and
    per member ``i`` of ``members`` its first copy in range (``first_i``: position, seq,
    topic) and how many copies it holds in range (``copies_i``).

    ``healthy`` says, from plain aggregates alone, that nothing can be wrong with the
    event: every member holds it once, at one seq, with the origin record's content. Only
    the other rows (a handful, or the lagging tail) are examined copy by copy, because
    Spark evaluates array lambdas without code generation.
    """
    copies = (
        events.where(F.col("well_formed"))
        .join(F.broadcast(bounds), "topic")
        .select(
            *ORIGIN_KEY,
            F.struct(
                F.col("member"),
                F.col("gpartition"),
                F.col("goffset"),
                F.col("seq"),
                F.col("digest"),
                # Null when the record names its own source topic: keeps the shuffle narrow.
                F.when(F.col("topic") != F.col("otopic"), F.col("topic")).alias("topic"),
                F.col("seq").between(F.col("from_seq"), F.col("to_seq")).alias("in_range"),
                (F.col("seq") <= F.col("to_seq")).alias("upto"),
            ).alias("copy"),
            F.lit(None).cast("binary").alias("odigest"),
        )
    )
    sources = origins.select(
        *ORIGIN_KEY,
        F.lit(None).cast(copies.schema["copy"].dataType).alias("copy"),
        F.col("odigest"),
    )
    copy = F.col("copy")
    in_range = copy["in_range"]
    variant = F.when(in_range, F.struct(copy["seq"].alias("seq"), copy["digest"].alias("digest")))
    per_member: list[Column] = []
    for index, member in enumerate(members):
        mine = F.when(
            in_range & (copy["member"] == F.lit(member)),
            F.struct(
                copy["gpartition"].alias("gpartition"),
                copy["goffset"].alias("goffset"),
                copy["seq"].alias("seq"),
                copy["topic"].alias("topic"),
            ),
        )
        per_member += [F.min(mine).alias(f"first_{index}"), F.count(mine).alias(f"copies_{index}")]
    rows = (
        copies.unionByName(sources)
        .groupBy(*ORIGIN_KEY)
        .agg(
            F.sort_array(F.collect_list("copy")).alias("copies"),
            F.first("odigest", ignorenulls=True).alias("odigest"),
            F.max(F.col("odigest").isNotNull()).alias("o_present"),
            F.min(variant).alias("low"),
            F.max(variant).alias("high"),
            F.count(F.when(~in_range, 1)).alias("outside"),
            *per_member,
        )
    )
    healthy = (
        F.col("o_present")
        & (F.col("outside") == 0)
        & (F.col("low") == F.col("high"))
        & (F.col("low")["digest"] == F.col("odigest"))
    )
    for index in range(len(members)):
        healthy = healthy & (F.col(f"copies_{index}") == 1)
    return rows.withColumn("healthy", F.coalesce(healthy, F.lit(False)))


def _copy_topic(copy: Column) -> Column:
    """The source topic of the ``T-global`` holding ``copy``."""
    return F.coalesce(copy["topic"], F.col("otopic"))


@dataclass(frozen=True)
class _CopyArrays:
    """Expressions over an event row's ``copies``; built inline where they are used, so
    Spark computes them only for the rows that are not ``healthy``."""

    all: Column
    ranged: Column  # copies in range
    firsts: Column  # each member's first copy in range
    repeats: Column  # the later ones


def _copy_arrays() -> _CopyArrays:
    copies = F.col("copies")
    ranged = F.filter(copies, lambda c: c["in_range"])

    def after_same_member(c: Column, i: Column) -> Column:
        return (i > 0) & F.coalesce(F.get(ranged, i - 1)["member"] == c["member"], F.lit(False))

    return _CopyArrays(
        all=copies,
        ranged=ranged,
        firsts=F.filter(ranged, lambda c, i: ~after_same_member(c, i)),
        repeats=F.filter(ranged, after_same_member),
    )


def _duplicates(a: _CopyArrays) -> Column:
    def first_seq(member: Column) -> Column:
        return F.get(F.filter(a.firsts, lambda f: f["member"] == member), 0)["seq"]

    return F.transform(
        a.repeats,
        lambda r: _violation(
            DUPLICATE,
            _copy_topic(r),
            r["seq"],
            r["member"],
            F.concat(
                F.lit("event "),
                event_text(),
                F.lit(" appears again (first at seq "),
                _text(first_seq(r["member"])),
                F.lit(")"),
            ),
        ),
    )


def _disagreements(a: _CopyArrays) -> Column:
    """Members whose first copy sits at another seq, or has other content, than the copy
    most members hold; when the most common variants tie, every member is reported."""

    def same(a: Column, b: Column) -> Column:
        return (a["seq"] == b["seq"]) & (a["digest"] == b["digest"])

    voted = F.transform(
        a.firsts,
        lambda f: F.struct(
            F.size(F.filter(a.firsts, lambda g: same(f, g))).alias("n"),
            f["seq"].alias("seq"),
            f["digest"].alias("digest"),
            f["member"].alias("member"),
            _copy_topic(f).alias("topic"),
        ),
    )
    top = F.array_max(F.transform(voted, lambda v: v["n"]))
    variants = F.size(
        F.array_distinct(F.transform(voted, lambda v: F.struct(v["seq"], v["digest"])))
    )
    tied = F.size(
        F.array_distinct(
            F.transform(
                F.filter(voted, lambda v: v["n"] == top), lambda v: F.struct(v["seq"], v["digest"])
            )
        )
    )
    outvoted = F.filter(voted, lambda v: (variants > 1) & ((v["n"] < top) | (tied > 1)))

    def content(digest: Column) -> Column:
        return F.hex(F.substring(digest, 1, 4))

    def described(v: Column) -> Column:
        # The most common other variant (the max of (n, seq, digest) among the others).
        other = F.array_max(F.filter(voted, lambda o: ~same(o, v)))
        return _violation(
            DISAGREEMENT,
            v["topic"],
            v["seq"],
            v["member"],
            F.concat(
                F.lit("holds event "),
                event_text(),
                F.lit(" at seq "),
                _text(v["seq"]),
                F.lit(" #"),
                content(v["digest"]),
                F.lit(" while "),
                _text(other["n"]),
                F.lit(" member(s) hold it at seq "),
                _text(other["seq"]),
                F.lit(" #"),
                content(other["digest"]),
            ),
        )

    return F.transform(outvoted, described)


def _unfaithful(a: _CopyArrays) -> Column:
    return F.transform(
        F.filter(a.ranged, lambda c: F.col("o_present") & (c["digest"] != F.col("odigest"))),
        lambda c: _violation(
            FIDELITY,
            _copy_topic(c),
            c["seq"],
            c["member"],
            F.concat(
                F.lit("event "),
                event_text(),
                F.lit(" differs from its origin record (key, value, headers or timestamp)"),
            ),
        ),
    )


def _orphans(a: _CopyArrays, facts: Facts) -> Column:
    """Copies without an origin record: re-delivered, unverifiable, or foreign."""
    key = _partition_key()
    start = F.try_element_at(_partition_map(facts.origin_starts), key)
    audited_end = F.try_element_at(_partition_map(facts.audited_ends), key)
    members = F.array(*[F.lit(m) for m in facts.members]) if facts.members else F.array()
    known_origin = F.array_contains(members, F.col("origin"))

    def classified(c: Column) -> Column:
        same_topic = c["topic"].isNull()
        again = c["in_range"] & F.coalesce(F.col("ooffset") < audited_end, F.lit(False))
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
        return (
            F.when(
                again,
                _violation(
                    DUPLICATE,
                    _copy_topic(c),
                    c["seq"],
                    c["member"],
                    F.concat(
                        F.lit("event "),
                        event_text(),
                        F.lit(" appears again: an earlier audit saw its origin partition "),
                        F.lit("replicated up to offset "),
                        _text(audited_end - 1),
                        F.lit(" before this range"),
                    ),
                ),
            )
            .when(
                unverifiable,
                _violation(
                    UNVERIFIED,
                    _copy_topic(c),
                    c["seq"],
                    c["member"],
                    F.concat(F.lit("event "), event_text(), F.lit(" is below the origin window")),
                ),
            )
            .otherwise(
                _violation(
                    FOREIGN,
                    _copy_topic(c),
                    c["seq"],
                    c["member"],
                    F.concat(
                        F.lit("event "), event_text(), F.lit(" is not from any origin: "), reason
                    ),
                )
            )
        )

    return F.transform(F.filter(a.all, lambda c: ~F.col("o_present") & c["upto"]), classified)


def _missing(a: _CopyArrays, facts: Facts) -> Column:
    """Members that should hold an origin event and do not: its origin if the event is
    below the committed source offset; any member whose highest seq reaches the seq at
    which another member holds it."""
    committed = F.try_element_at(_partition_map(facts.committed_ends), _partition_key())
    highs = _map_literal({f"{t}\u0000{m}": v for (t, m), v in facts.highs.items()})
    present = F.transform(a.all, lambda c: c["member"])
    ref_seq = F.array_min(F.transform(a.all, lambda c: c["seq"]))

    def expected(member: Column) -> Column:
        high = F.try_element_at(highs, F.concat(F.col("otopic"), F.lit("\u0000"), member))
        below_commit = F.coalesce(F.col("ooffset") < committed, F.lit(False))
        reached = F.coalesce(ref_seq <= high, F.lit(False))
        return ~F.array_contains(present, member) & (
            ((member == F.col("origin")) & below_commit) | reached
        )

    members = F.array(*[F.lit(m) for m in facts.members]) if facts.members else F.array()
    absent = F.when(F.col("o_present"), F.filter(members, expected)).otherwise(
        F.array().cast("array<string>")
    )
    return F.transform(
        absent,
        lambda member: _violation(
            MISSING,
            F.col("otopic"),
            ref_seq,
            member,
            F.concat(
                F.lit("event "),
                event_text(),
                F.lit(" is not in this member's T-global"),
                F.when(
                    ref_seq.isNotNull(),
                    F.concat(F.lit(" (others hold it at seq "), _text(ref_seq), F.lit(")")),
                ).otherwise(F.lit(" (committed by its origin, replicated nowhere)")),
            ),
        ),
    )


# -- pass 2: along each origin partition --------------------------------------------------


def _order(events: DataFrame, members: Sequence[str]) -> tuple[DataFrame, Column]:
    """Adds, per member, the position of the previous event of the same origin partition
    it holds; returns the frame and the order violations as an array column.

    Origin order holds for a member iff, walking its origin partition by offset, the seqs
    of the events it holds only grow: every inversion shows up between neighbours."""
    along = (
        Window.partitionBy("origin", "otopic", "opartition")
        .orderBy("ooffset")
        .rowsBetween(Window.unboundedPreceding, -1)
    )

    def held_by(index: int) -> Column:
        held = F.col(f"first_{index}")
        return F.when(
            held.isNotNull(), F.struct(held["seq"].alias("seq"), _copy_topic(held).alias("topic"))
        )

    def previous(at: str) -> Column:
        position = F.struct(F.col(at)["seq"].alias("seq"), F.col("ooffset").alias("ooffset"))
        return F.last(F.when(F.col(at).isNotNull(), position), ignorenulls=True).over(along)

    names = [(f"held_{i}", f"before_{i}") for i in range(len(members))]
    # One select per step, so Spark evaluates every member's window in one sort.
    events = events.select("*", *(held_by(i).alias(at) for i, (at, _) in enumerate(names)))
    events = events.select("*", *(previous(at).alias(before) for at, before in names))
    found: list[Column] = []
    for member, (at, before) in zip(members, names, strict=True):
        inverted = F.col(before)["seq"] > F.col(at)["seq"]
        found.append(
            F.when(
                F.coalesce(inverted, F.lit(False)),
                _violation(
                    ORDER,
                    F.col(at)["topic"],
                    F.col(before)["seq"],
                    F.lit(member),
                    F.concat(
                        F.lit("event "),
                        event_text(offset=F.col(before)["ooffset"]),
                        F.lit(" comes after offset "),
                        _text("ooffset"),
                        F.lit(" of the same origin partition (seq "),
                        _text(F.col(at)["seq"]),
                        F.lit(")"),
                    ),
                ),
            )
        )
    if not found:
        return events, F.array().cast(ArrayType(VIOLATION_SCHEMA))
    return events, F.filter(F.array(*found), lambda v: v.isNotNull())


def event_violations(
    events: DataFrame, origins: DataFrame, bounds: DataFrame, facts: Facts
) -> DataFrame:
    """Passes 1 and 2: every violation (and unverified event) found from event rows."""
    rows = event_copies(events, origins, bounds, facts.members)
    a = _copy_arrays()
    examined = F.concat(
        _duplicates(a), _disagreements(a), _unfaithful(a), _orphans(a, facts), _missing(a, facts)
    )
    nothing = F.array().cast(ArrayType(VIOLATION_SCHEMA))
    found = rows.select(
        *ORIGIN_KEY,
        *(f"first_{i}" for i in range(len(facts.members))),
        F.when(F.col("healthy"), nothing).otherwise(examined).alias("found"),
    )
    ordered, inversions = _order(found, facts.members)
    return ordered.select(F.explode(F.concat("found", inversions)).alias("v")).select("v.*")


# -- pass 3: by sequence number -----------------------------------------------------------


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
    spark: SparkSession,
    events: DataFrame,
    origins: DataFrame,
    facts: Facts,
    counts: Mapping[str, SeqCounts],
) -> DataFrame:
    """Every violation (and every unverified event) as one frame of ``VIOLATION_SCHEMA``.

    ``counts`` (pass 3) decides which members get the detailed gap and collision searches.
    """
    bounds = bounds_frame(spark, facts.bounds)
    frames: list[DataFrame] = [event_violations(events, origins, bounds, facts), malformed(events)]
    gapped: set[str] = set()
    for b in facts.bounds:
        topic_counts = counts.get(b.topic)
        for member in facts.members:
            held = topic_counts.held.get(member, 0) if topic_counts is not None else 0
            if held < facts.highs[(b.topic, member)] - b.from_seq + 1:
                gapped.add(member)
    collided = sorted({m for c in counts.values() for m, n in c.collided.items() if n > 0})
    if gapped or collided:
        ranged = in_range(events, bounds)
        if gapped:
            mine = ranged.where(F.col("member").isin(sorted(gapped)))
            frames.append(gaps(spark, mine, bounds, replace(facts, members=tuple(sorted(gapped)))))
        if collided:
            frames.append(collisions(ranged.where(F.col("member").isin(collided))))
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result
