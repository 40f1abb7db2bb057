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

Modules: ``model`` (schemas and facts), ``columns`` (shared column expressions),
``by_event`` (passes 1 and 2), ``by_seq`` (pass 3); ``all_violations`` here ties them
together.

Every violation frame has the columns of ``VIOLATION_SCHEMA``; only violations, which are
few when the group is healthy, ever reach the driver.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kdsync.audit.checks.by_event import event_violations
from kdsync.audit.checks.by_seq import collisions, gaps, malformed
from kdsync.audit.checks.model import Facts, SeqCounts, bounds_frame, in_range, member_start


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
            if held < facts.highs[(b.topic, member)] - member_start(facts, b, member) + 1:
                gapped.add(member)
    collided = sorted({m for c in counts.values() for m, n in c.collided.items() if n > 0})
    if gapped or collided:
        ranged = in_range(events, bounds)
        if gapped:
            mine = ranged.where(F.col("member").isin(sorted(gapped)))
            frames.append(gaps(spark, mine, replace(facts, members=tuple(sorted(gapped)))))
        if collided:
            frames.append(collisions(ranged.where(F.col("member").isin(collided))))
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result
