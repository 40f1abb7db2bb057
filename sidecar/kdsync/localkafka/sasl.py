"""Local clusters that also listen SASL_SSL with SCRAM-SHA-512, as secured production
clusters commonly do, and the librdkafka properties of a client that logs in there.

The launcher's PLAINTEXT listener stays (inter-broker traffic and the readiness probe use
it); the SASL_SSL listener is an extra client listener on a port of its own, with TLS from
:mod:`kdsync.localkafka.tls` and the SCRAM users formatted into the cluster. No
authorizer is configured: any authenticated user may do anything.
"""

from __future__ import annotations

from collections.abc import Sequence

from kdsync.localkafka.broker import LocalKafkaBroker
from kdsync.localkafka.config import SCRAM_MECHANISM, ScramUser
from kdsync.localkafka.fleet import ClusterSpec
from kdsync.localkafka.tls import BrokerTlsFiles

SASL_SSL_LISTENER = "SASL_SSL"
_SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


def sasl_ssl_cluster(
    name: str,
    tls: BrokerTlsFiles,
    users: Sequence[ScramUser],
    *,
    listener: str = SASL_SSL_LISTENER,
) -> ClusterSpec:
    """A cluster with an extra ``listener`` speaking SASL_SSL: TLS with ``tls``'s key
    store, SCRAM-SHA-512 logins of ``users``."""
    if not users:
        raise ValueError(f"cluster {name}: a SASL_SSL listener needs at least one SCRAM user")
    prefix = f"listener.name.{listener.lower()}."
    mechanism = SCRAM_MECHANISM.lower()
    return ClusterSpec(
        name,
        overrides={
            f"{prefix}sasl.enabled.mechanisms": SCRAM_MECHANISM,
            f"{prefix}{mechanism}.sasl.jaas.config": _SCRAM_LOGIN,
            f"{prefix}ssl.keystore.type": "PEM",
            f"{prefix}ssl.keystore.location": str(tls.keystore),
        },
        extra_listeners={listener: "SASL_SSL"},
        scram_users=tuple(users),
    )


def sasl_ssl_client_properties(
    broker: LocalKafkaBroker,
    user: ScramUser,
    tls: BrokerTlsFiles,
    *,
    listener: str = SASL_SSL_LISTENER,
) -> dict[str, str]:
    """librdkafka properties (``bootstrap.servers`` included) that log ``user`` in at
    ``broker``'s SASL_SSL listener, verifying the broker against ``tls.ca``."""
    return {
        "bootstrap.servers": broker.listener_address(listener),
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": SCRAM_MECHANISM,
        "sasl.username": user.name,
        "sasl.password": user.password,
        "ssl.ca.location": str(tls.ca),
    }
