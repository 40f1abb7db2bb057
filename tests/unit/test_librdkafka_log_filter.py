"""librdkafka's reconnect storms do not drown the sidecar's own log lines."""

from __future__ import annotations

import logging

from kdsync.kafka.client_config import RepeatedLineFilter


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("kdsync.librdkafka", logging.ERROR, __file__, 1, message, (), None)


REFUSED = (
    "FAIL [m2-global#producer-4] [thrd:127.0.0.1:19303/bootstrap]: Connect to "
    "ipv4#127.0.0.1:19303 failed: Connection refused (after {}ms in state CONNECT)"
)


def test_a_storm_of_identical_lines_passes_once_per_window_with_a_count() -> None:
    clock = _Clock()
    line_filter = RepeatedLineFilter(window=10.0, clock=clock)
    passed = [r for ms in range(500) if line_filter.filter(r := _record(REFUSED.format(ms % 7)))]
    assert len(passed) == 1
    clock.now = 10.5
    later = _record(REFUSED.format(0))
    assert line_filter.filter(later)
    assert later.getMessage().endswith("(499 identical line(s) held back)")


def test_different_lines_are_not_held_back() -> None:
    line_filter = RepeatedLineFilter(window=10.0, clock=_Clock())
    assert line_filter.filter(_record(REFUSED.format(0)))
    assert line_filter.filter(_record(REFUSED.replace("19303", "19304").format(0)))
    assert line_filter.filter(_record("sidecar stopping: could not store the ordering log"))
