"""The audit's machine-readable report and its one-line human summary.

The JSON shape is a contract: the operator reads it from a ConfigMap and records the
outcome on the KdsyncGroup status. Keys are camelCase; ``version`` changes only when a key
changes meaning or disappears.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

REPORT_VERSION = 1
DEFAULT_VIOLATION_CAP = 100

DUPLICATE = "duplicate"
GAP = "gap"
DISAGREEMENT = "disagreement"
ORDER = "order"
MISSING = "missing"
FIDELITY = "fidelity"
FOREIGN = "foreign"
# Every kind of violation, in the order the summary lists them.
VIOLATION_KINDS: tuple[str, ...] = (
    DUPLICATE,
    GAP,
    DISAGREEMENT,
    ORDER,
    MISSING,
    FIDELITY,
    FOREIGN,
)
# Counted, but not a violation: T-global events whose origin record could not be read
# (removed from T by retention, or checked by an earlier run).
UNVERIFIED = "unverified"


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class Checked(_Model):
    """The range of global sequence numbers checked, inclusive, and how many events it held."""

    from_seq: int
    to_seq: int
    events: int


class Violation(_Model):
    """One broken property: ``seq`` is the global sequence number concerned (None when the
    event has none, e.g. an origin event that was never replicated)."""

    kind: str
    seq: int | None
    member: str
    detail: str


class ReportMembership(_Model):
    """Whose ``T-global`` was checked: the data members in force, from the ledger of
    ``source`` (None: no membership change, the config file's members) at log index
    ``config_index``; ``departed`` left the group and were read as origins only, or not at
    all (``not_read``: their cluster did not answer); ``seeded``, members in force that a
    backfill seeded, with their hand-over records."""

    checked: list[str]
    departed: list[str] = Field(default_factory=list)
    not_read: list[str] = Field(default_factory=list)
    config_index: int = 0
    source: str | None = None
    # Members seeded by a backfill -> their hand-over record (donor, appliedIndex, nextSeq,
    # firstSeq per source topic, ...), as written into their ledger topic.
    seeded: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # Learners whose backfill has not finished: not read.
    joining: list[str] = Field(default_factory=list)


class Report(_Model):
    """The outcome of one audit run."""

    version: int = REPORT_VERSION
    group: str
    passed: bool
    checked: Checked
    counts: dict[str, int]
    lag: dict[str, int]
    violations_total: int
    violations: list[Violation] = Field(default_factory=list)
    summary: str
    started_at: str
    finished_at: str
    membership: ReportMembership | None = None

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2) + "\n"


def rfc3339(moment: datetime) -> str:
    """``2026-11-22T05:17:54.123Z`` (UTC, milliseconds)."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def summarize(
    group: str,
    checked: Checked,
    counts: dict[str, int],
    lag: dict[str, int],
    members: int,
    membership: ReportMembership | None = None,
) -> str:
    """One line for humans (and the KdsyncGroup status)."""
    total = sum(counts.get(kind, 0) for kind in VIOLATION_KINDS)
    if checked.events == 0:
        span = f"no new events after seq {checked.from_seq - 1}"
    else:
        span = f"seqs {checked.from_seq}..{checked.to_seq} ({checked.events} events)"
    lagging = ", ".join(f"{member} {behind} behind" for member, behind in lag.items() if behind)
    behind = f"; lag: {lagging}" if lagging else ""
    if membership is not None and membership.departed:
        left = ", ".join(
            f"{m} (not read)" if m in membership.not_read else m for m in membership.departed
        )
        behind += f"; left the group: {left}"
    if membership is not None and membership.joining:
        behind += f"; joining (backfill under way, not read): {', '.join(membership.joining)}"
    if total == 0:
        return f"PASS group {group}: {span} consistent across {members} member(s){behind}"
    found = ", ".join(
        f"{counts[kind]} {kind}" for kind in VIOLATION_KINDS if counts.get(kind, 0) > 0
    )
    return f"FAIL group {group}: {total} violation(s) ({found}) in {span}{behind}"


def build_report(
    *,
    group: str,
    checked: Checked,
    counts: dict[str, int],
    lag: dict[str, int],
    violations: list[Violation],
    members: int,
    started_at: datetime,
    finished_at: datetime,
    membership: ReportMembership | None = None,
) -> Report:
    """The report: ``counts`` has every kind (0 when absent); ``violations`` is capped."""
    full_counts = {kind: counts.get(kind, 0) for kind in (*VIOLATION_KINDS, UNVERIFIED)}
    total = sum(full_counts[kind] for kind in VIOLATION_KINDS)
    return Report(
        group=group,
        passed=total == 0,
        checked=checked,
        counts=full_counts,
        lag=dict(lag),
        violations_total=total,
        violations=violations,
        summary=summarize(group, checked, full_counts, lag, members, membership),
        started_at=rfc3339(started_at),
        finished_at=rfc3339(finished_at),
        membership=membership,
    )
