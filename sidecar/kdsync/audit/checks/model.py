"""What the audit's checks share: the violation and bounds schemas, the driver-side facts
(``Bounds``, ``Facts``), pass 3's per-topic ``SeqCounts``, and the frames every pass starts
from (``bounds_frame``, ``in_range``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

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
      it that shows up again in the range was delivered twice (or out of order);
    - ``departed``: data members that left the group: origins whose ``T-global`` is not
      checked; ``unread``: those of them whose topic could not be read (their cluster is
      gone), so their events cannot be verified;
    - ``first_seqs[(topic, member)]``: a member seeded by a backfill from a trimmed donor
      holds nothing below this seq (its hand-over record): nothing below is expected of it.
    """

    members: tuple[str, ...]
    bounds: tuple[Bounds, ...]
    highs: Mapping[tuple[str, str], int]
    origin_starts: Mapping[OriginPartition, int]
    committed_ends: Mapping[OriginPartition, int]
    audited_ends: Mapping[OriginPartition, int] = field(default_factory=dict)
    departed: tuple[str, ...] = ()
    unread: tuple[str, ...] = ()
    first_seqs: Mapping[tuple[str, str], int] = field(default_factory=dict)


def member_start(facts: Facts, bounds: Bounds, member: str) -> int:
    """The first seq of ``bounds`` that ``member`` must hold: the range's start, or later
    for a member seeded by a backfill from a trimmed donor."""
    return max(bounds.from_seq, facts.first_seqs.get((bounds.topic, member), 0))


@dataclass(frozen=True)
class SeqCounts:
    """Pass 3's result for one topic: distinct seqs held in range by anyone and by each
    member, and how many seqs of each member carry two different events."""

    topic: str
    seqs: int
    held: Mapping[str, int]
    collided: Mapping[str, int]


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
