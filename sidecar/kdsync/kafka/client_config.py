"""Settings every Kafka client of the sidecar shares.

librdkafka prints its own log lines (``%3|...|FAIL|...``) to stderr by default; the
sidecar sends them through Python logging instead, so they carry the member name and
level like every other line. Admin clients are not polled, so they would only queue
their logs: they log critical problems only (their errors reach us as exceptions).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

LIBRDKAFKA_LOG = logging.getLogger("kdsync.librdkafka")


def client_config(properties: Mapping[str, str], **settings: Any) -> dict[str, Any]:
    """Config for a producer or consumer: the user's properties, kdsync's settings."""
    return {**properties, **settings, "logger": LIBRDKAFKA_LOG}


def admin_config(properties: Mapping[str, str]) -> dict[str, str | int | float | bool]:
    return {**properties, "log_level": 2}
