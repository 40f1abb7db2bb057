"""Column expressions the checks share: a violation row of ``VIOLATION_SCHEMA``, an
event's text by its origin coordinates, and driver-side maps turned into literal columns."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kdsync.audit.checks.model import OriginPartition


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
