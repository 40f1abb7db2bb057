"""``kdsync status``: what a member's /status document shows in the table."""

from __future__ import annotations

from kdsync.runtime.status_report import render


def _line_of(member: str, table: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(member))


def test_a_member_that_fell_back_from_rdma_to_tcp_says_so_and_why() -> None:
    reason = "no RDMA device in /sys/class/infiniband"
    statuses = [
        {"member": "m1", "ready": True, "transport": {"type": "rdma", "fallbackReason": None}},
        {"member": "m2", "ready": True, "transport": {"type": "rdma", "fallbackReason": reason}},
        {"member": "m3", "ready": True, "transport": {"type": "tcp"}},
    ]
    table = render(statuses)
    assert f"RDMA FELL BACK TO TCP: {reason}" in _line_of("m2", table)
    assert "FELL BACK" not in _line_of("m1", table)
    assert "FELL BACK" not in _line_of("m3", table)
