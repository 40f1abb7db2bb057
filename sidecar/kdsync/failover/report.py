"""The table ``kdsync failover translate`` prints, and the JSON form of a translation."""

from __future__ import annotations

from typing import Any

from kdsync.failover.translation import GroupTranslation, Outcome, PartitionTranslation

_HEADINGS = ("topic", "partition", "offset in {src}", "last seq read", "offset in {dst}", "status")


def _cell(value: int | None) -> str:
    return "-" if value is None else str(value)


def _status(p: PartitionTranslation) -> str:
    if p.outcome is Outcome.EXACT:
        return "exact"
    if p.outcome is Outcome.BEHIND:
        return f"behind by {p.seqs_behind} seq(s): {p.detail}"
    if p.outcome in (Outcome.DELETED_IN_TARGET, Outcome.DELETED_IN_SOURCE):
        return f"{p.outcome.value}: {p.detail}; earliest offered"
    return f"{p.outcome.value}: {p.detail}" if p.detail else p.outcome.value


def render_table(translation: GroupTranslation) -> str:
    headings = [h.format(src=translation.source, dst=translation.target) for h in _HEADINGS]
    rows = [
        [
            p.topic,
            str(p.partition),
            _cell(p.source_offset),
            _cell(p.last_read_seq),
            _cell(p.target_offset),
            _status(p),
        ]
        for p in translation.partitions
    ]
    widths = [max(len(r[i]) for r in [headings, *rows]) for i in range(len(headings) - 1)]
    lines = [
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]])
        for row in [headings, *rows]
    ]
    title = f"consumer group {translation.group}: {translation.source} -> {translation.target}"
    out = [title, *lines]
    if not translation.partitions:
        out.append("(the group has no committed offsets on any T-global topic in the source)")
    for topic in translation.skipped_topics:
        out.append(f"skipped {topic}: not a T-global topic of this group's config")
    return "\n".join(out)


def to_json(translation: GroupTranslation) -> dict[str, Any]:
    return {
        "group": translation.group,
        "from": translation.source,
        "to": translation.target,
        "skippedTopics": list(translation.skipped_topics),
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "outcome": p.outcome.value,
                "sourceOffset": p.source_offset,
                "lastReadSeq": p.last_read_seq,
                "targetOffset": p.target_offset,
                "targetLastSeq": p.target_last_seq,
                "seqsBehind": p.seqs_behind,
                "detail": p.detail,
            }
            for p in translation.partitions
        ],
    }
