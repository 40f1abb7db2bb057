"""The first contact with a member's cluster: reachable, TLS accepted, login accepted.

librdkafka retries a refused login or TLS handshake forever and reports each attempt
through the error callback (``_AUTHENTICATION``, ``_SSL``); a metadata request only times
out with "broker transport failure". Without this check a sidecar with a wrong password
would wait out its timeouts and then report an unreachable cluster. Here the first such
report ends the wait with one line that names the user, the broker and the fix.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from kdsync.kafka.client_config import admin_config, redact
from kdsync.kafka.errors import KafkaAuthenticationFailed, KafkaUnavailable

# One metadata request at a time this long, so a refusal reported meanwhile is seen soon.
_ATTEMPT_SECONDS = 1.0
# librdkafka prefixes errors with the broker ("sasl_ssl://host:port/bootstrap: ...") and
# ends them with its connection state ("(after 316ms in state AUTH_REQ)").
_BROKER_PREFIX = re.compile(r"^(?:[a-z_]+://)?(?P<broker>[^\s/]+)(?:/\S*)?: ")
_STATE_SUFFIX = re.compile(r"\s*\(after \d+ms in state [A-Z_]+\)\s*$")
_SASL_PREFIX = re.compile(r"^SASL authentication error: ")


def _where_and_what(text: str, servers: str) -> tuple[str, str]:
    """The broker an error is about (else the bootstrap servers) and its detail."""
    match = _BROKER_PREFIX.match(text)
    broker = match.group("broker") if match else servers
    detail = text[match.end() :] if match else text
    return broker, _STATE_SUFFIX.sub("", detail)


def refusal_error(properties: Mapping[str, str], error: KafkaError) -> KafkaAuthenticationFailed:
    servers = properties.get("bootstrap.servers", "?")
    broker, detail = _where_and_what(redact(error.str(), properties), servers)
    if error.code() == KafkaError._AUTHENTICATION:
        user = properties.get("sasl.username")
        who = f"user {user!r}" if user else "the configured credentials"
        mechanism = properties.get("sasl.mechanism", "GSSAPI")
        return KafkaAuthenticationFailed(
            f"authentication failed for {who} at broker {broker} (SASL {mechanism}: "
            f"{_SASL_PREFIX.sub('', detail)}); nothing was read or written. Fix: check "
            "sasl.username and sasl.password in kafka.properties (or the Secret named by "
            "propertiesSecretRef) and that the user exists in that cluster"
        )
    return KafkaAuthenticationFailed(
        f"the TLS handshake with broker {broker} failed ({detail}); nothing was read or "
        "written. Fix: check ssl.ca.location (the CA that signed the brokers' certificates) "
        "and any client certificate in kafka.properties"
    )


def check_connection(properties: Mapping[str, str], timeout: float = 30.0) -> None:
    """Return once the cluster answers a metadata request; raise
    :class:`KafkaAuthenticationFailed` as soon as a broker refuses the login or the TLS
    handshake, :class:`KafkaUnavailable` if nothing answers within ``timeout`` seconds."""
    refusals: list[KafkaError] = []
    lock = threading.Lock()

    def on_error(error: KafkaError) -> None:
        if error.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL):
            with lock:
                refusals.append(error)

    config: dict[str, Any] = {**admin_config(properties), "error_cb": on_error}
    admin = AdminClient(config)
    deadline = time.monotonic() + timeout
    last: KafkaException | None = None
    while True:
        try:
            admin.list_topics(timeout=max(0.1, min(_ATTEMPT_SECONDS, deadline - time.monotonic())))
            return
        except KafkaException as exc:
            last = exc
        admin.poll(0)  # serves the error callback
        with lock:
            refusal = refusals[0] if refusals else None
        if refusal is not None:
            raise refusal_error(properties, refusal)
        if time.monotonic() >= deadline:
            servers = properties.get("bootstrap.servers", "?")
            raise KafkaUnavailable(
                f"cannot reach Kafka at {servers} within {timeout:.0f}s "
                f"({redact(str(last), properties)}). Fix: check kafka.bootstrapServers and "
                "that the brokers are up and reachable from here, and the security properties "
                "(SSL/SASL)"
            )
