"""Passes 1 and 2 of the audit: every member's copies of one origin event meet the origin
record in one row (duplicates, disagreement, fidelity, foreign, missing and re-delivered
events), then a window along each origin partition finds order violations."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType

from kdsync.audit.checks.columns import (
    _map_literal,
    _partition_key,
    _partition_map,
    _text,
    _violation,
    event_text,
)
from kdsync.audit.checks.model import ORIGIN_KEY, VIOLATION_SCHEMA, Facts
from kdsync.audit.report import (
    DISAGREEMENT,
    DUPLICATE,
    FIDELITY,
    FOREIGN,
    MISSING,
    ORDER,
    UNVERIFIED,
)


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


def _names(names: Sequence[str]) -> Column:
    """An array literal of member names (typed, also when empty)."""
    return F.array(*[F.lit(n) for n in names]).cast("array<string>")


def _orphans(a: _CopyArrays, facts: Facts) -> Column:
    """Copies without an origin record: re-delivered, unverifiable, or foreign."""
    key = _partition_key()
    start = F.try_element_at(_partition_map(facts.origin_starts), key)
    audited_end = F.try_element_at(_partition_map(facts.audited_ends), key)
    origins = (*facts.members, *facts.departed)
    known_origin = F.array_contains(_names(origins), F.col("origin"))
    unread_origin = F.array_contains(_names(facts.unread), F.col("origin"))

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
            .when(
                unread_origin & same_topic,
                _violation(
                    UNVERIFIED,
                    _copy_topic(c),
                    c["seq"],
                    c["member"],
                    F.concat(
                        F.lit("event "),
                        event_text(),
                        F.lit(" comes from a member that left the group; its topic was not read"),
                    ),
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
    firsts = _map_literal({f"{t}\u0000{m}": v for (t, m), v in facts.first_seqs.items()})
    present = F.transform(a.all, lambda c: c["member"])
    ref_seq = F.array_min(F.transform(a.all, lambda c: c["seq"]))

    def expected(member: Column) -> Column:
        key = F.concat(F.col("otopic"), F.lit("\u0000"), member)
        high = F.try_element_at(highs, key)
        below_commit = F.coalesce(F.col("ooffset") < committed, F.lit(False))
        # A member seeded from a trimmed donor is expected to hold nothing below its start.
        started = F.coalesce(ref_seq >= F.try_element_at(firsts, key), F.lit(True))
        reached = F.coalesce(ref_seq <= high, F.lit(False))
        return (
            ~F.array_contains(present, member)
            & started
            & (((member == F.col("origin")) & below_commit) | reached)
        )

    members = _names(facts.members)
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
