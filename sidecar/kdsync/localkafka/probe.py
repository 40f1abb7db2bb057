"""Readiness: a broker is ready when it accepts a committed transactional produce.

Listening on a port is not enough for kdsync: the transaction coordinator and its
``__transaction_state`` topic must be up, which happens seconds later. The probe retries
each step until a deadline, checking between attempts that the broker process is alive.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

PROBE_TOPIC = "kdsync-localkafka-probe"

# librdkafka logs every refused connection while a broker boots; route it to logging
# (quiet by default) instead of the test's stderr.
_client_log = logging.getLogger("kdsync.localkafka.client")
# Without a handler anywhere, Python's last-resort handler would print warnings to stderr.
_client_log.addHandler(logging.NullHandler())

# How long one attempt may block before we look at the process and the deadline again.
_ATTEMPT_SECONDS = 10.0
_POLL_SECONDS = 0.1


class ProbeDeadlineExceeded(TimeoutError):
    """The broker did not accept a transactional produce before the deadline."""


class ProbeTargetDied(RuntimeError):
    """The broker process exited while we waited for it."""


def _remaining(deadline: float) -> float:
    return deadline - time.monotonic()


def _check(deadline: float, alive: Callable[[], bool], last_error: str) -> None:
    if not alive():
        raise ProbeTargetDied(last_error)
    if _remaining(deadline) <= 0:
        raise ProbeDeadlineExceeded(last_error)


def wait_for_port(host: str, port: int, deadline: float, alive: Callable[[], bool]) -> None:
    """Until the deadline, try to connect to ``host:port``."""
    last_error = f"nothing listening on {host}:{port} yet"
    while True:
        _check(deadline, alive, last_error)
        try:
            with socket.create_connection((host, port), timeout=min(1.0, _remaining(deadline))):
                return
        except OSError as error:
            last_error = f"connect to {host}:{port}: {error}"
        # Polling a condition: the JVM takes seconds to bind, a short pause avoids spinning.
        time.sleep(_POLL_SECONDS)


def _ensure_probe_topic(bootstrap: str, deadline: float) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=_client_log)
    timeout = max(0.1, min(_ATTEMPT_SECONDS, _remaining(deadline)))
    futures = admin.create_topics(
        [NewTopic(PROBE_TOPIC, num_partitions=1, replication_factor=1)],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    try:
        futures[PROBE_TOPIC].result(timeout=timeout)
    except KafkaException as error:
        if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def _commit_one_transaction(bootstrap: str, transactional_id: str, deadline: float) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "logger": _client_log,
            "transaction.timeout.ms": 30000,
            "message.timeout.ms": 30000,
        }
    )
    timeout = max(0.1, min(_ATTEMPT_SECONDS, _remaining(deadline)))
    producer.init_transactions(timeout)
    producer.begin_transaction()
    producer.produce(PROBE_TOPIC, key=transactional_id.encode(), value=b"ready?")
    producer.commit_transaction(max(0.1, min(_ATTEMPT_SECONDS, _remaining(deadline))))


def wait_until_transactional_produce(
    bootstrap: str,
    *,
    transactional_id: str,
    deadline: float,
    alive: Callable[[], bool],
) -> None:
    """Return once one transaction commits on ``bootstrap``; raise by ``deadline``.

    Raises :class:`ProbeTargetDied` as soon as ``alive()`` is false and
    :class:`ProbeDeadlineExceeded` at the deadline, both with the last error seen.
    """
    host, _, port = bootstrap.rpartition(":")
    wait_for_port(host, int(port), deadline, alive)
    last_error = "no attempt finished yet"
    while True:
        _check(deadline, alive, last_error)
        try:
            _ensure_probe_topic(bootstrap, deadline)
            _commit_one_transaction(bootstrap, transactional_id, deadline)
            return
        except KafkaException as error:
            last_error = f"transactional probe: {error.args[0]}"
        except Exception as error:  # a future's timeout or a client-side failure
            detail = str(error) or "no answer in time"
            last_error = f"transactional probe: {type(error).__name__}: {detail}"
        _client_log.debug("broker %s not ready: %s", bootstrap, last_error)
        time.sleep(_POLL_SECONDS)
