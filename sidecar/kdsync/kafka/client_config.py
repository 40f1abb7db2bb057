"""Settings every Kafka client of the sidecar shares.

librdkafka prints its own log lines (``%3|...|FAIL|...``) to stderr by default; the
sidecar sends them through Python logging instead, so they carry the member name and
level like every other line. Admin clients are not polled, so they would only queue
their logs: they log critical problems only (their errors reach us as exceptions).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from kdsync.kafka.errors import InvalidClientProperties
from kdsync.kafka.produce_pacing import PACED_PRODUCER

# "... failed: Connection refused (after 0ms in state CONNECT)": the attempt's timing
# differs between otherwise identical lines.
_ATTEMPT_DETAIL = re.compile(r" \((after \d+ms in state \w+)[^)]*\)")


class RepeatedLineFilter(logging.Filter):
    """Passes the first of identical lines, then at most one per ``window`` seconds, saying
    how many were held back.

    While a broker is down, librdkafka logs a line for every reconnect attempt of every
    client and broker thread: hundreds within a millisecond in the tests' broker restarts,
    which pushed the sidecar's own explanation out of any log tail."""

    def __init__(self, window: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._window = window
        self._clock = clock
        self._seen: dict[str, list[float]] = {}  # line -> [first pass, held back since]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        line = _ATTEMPT_DETAIL.sub("", record.getMessage())
        now = self._clock()
        with self._lock:
            seen = self._seen.get(line)
            if seen is not None and now - seen[0] < self._window:
                seen[1] += 1
                return False
            if len(self._seen) > 1000:  # forget lines not seen for a window
                self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self._window}
            self._seen[line] = [now, 0]
        held = int(seen[1]) if seen is not None else 0
        if held:
            record.msg = f"{record.getMessage()} ({held} identical line(s) held back)"
            record.args = ()
        return True


LIBRDKAFKA_LOG = logging.getLogger("kdsync.librdkafka")
LIBRDKAFKA_LOG.addFilter(RepeatedLineFilter())

# librdkafka properties whose values are secrets: sasl.password, ssl.key.password,
# ssl.keystore.password, sasl.oauthbearer.client.secret, ssl.key.pem (an inline key), ...
_SECRET_PROPERTY = re.compile(r"password|secret|token|\.pem$|oauthbearer\.config")
REDACTED = "***"


def is_secret_property(name: str) -> bool:
    return _SECRET_PROPERTY.search(name) is not None


def redact(text: str, properties: Mapping[str, str]) -> str:
    """``text`` with the value of every secret property replaced by ``***``: for messages
    that may quote the client's configuration (librdkafka's verdicts, error strings)."""
    secrets = sorted(
        (v for k, v in properties.items() if is_secret_property(k) and v),
        key=len,
        reverse=True,  # a secret that contains another is replaced whole
    )
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def client_config(properties: Mapping[str, str], **settings: Any) -> dict[str, Any]:
    """Config for a producer or consumer: the user's properties, kdsync's settings."""
    return {**properties, **settings, "logger": LIBRDKAFKA_LOG}


def admin_config(properties: Mapping[str, str]) -> dict[str, str | int | float | bool]:
    return {**properties, "log_level": 2}


def check_client_properties(properties: Mapping[str, str]) -> None:
    """librdkafka's own verdict on the user's properties, before anything connects.

    Unknown names and bad values (``compression.type: zstdx``) would otherwise surface as a
    traceback from the first client built during start-up. The check builds a producer and
    a consumer without ``bootstrap.servers``, so neither connects anywhere.
    """
    user = {k: v for k, v in properties.items() if k != "bootstrap.servers"}
    quiet = {"log_level": 0, "logger": LIBRDKAFKA_LOG}
    for build in (
        lambda: Producer({**user, **PACED_PRODUCER, **quiet}),
        lambda: Consumer({**user, **quiet, "group.id": "kdsync-property-check"}),
    ):
        try:
            client = build()
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not isinstance(error, KafkaError) or error.code() != KafkaError._INVALID_ARG:
                raise
            # "from None": librdkafka's own exception may quote a secret value.
            raise InvalidClientProperties(
                f"kafka.properties is refused by the Kafka client: {redact(error.str(), user)}. "
                "Fix: correct or remove that property (librdkafka's CONFIGURATION.md lists the "
                "names and values it accepts)"
            ) from None
        if isinstance(client, Consumer):
            client.close()
