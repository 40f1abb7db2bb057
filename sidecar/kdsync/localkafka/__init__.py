"""Real Apache Kafka 4.x clusters on this machine, for tests and the local demo mode.

The broker classpath comes from Maven Central via ``hack/fetch-kafka``; see
:mod:`kdsync.localkafka.distribution`. Each cluster is one JVM running broker and KRaft
controller together on loopback ports (:class:`LocalKafkaBroker`); a
:class:`LocalKafkaFleet` runs several independent ones and always cleans them up.
"""

from kdsync.localkafka.broker import (
    BrokerError,
    BrokerStartupError,
    LocalKafkaBroker,
)
from kdsync.localkafka.config import (
    SCRAM_MECHANISM,
    BrokerPorts,
    ScramUser,
    allocate_ports,
    broker_properties,
)
from kdsync.localkafka.distribution import (
    KAFKA_VERSION,
    KafkaDistribution,
    KafkaNotProvisioned,
    find_distribution,
)
from kdsync.localkafka.fleet import (
    ClusterSpec,
    FleetStartupError,
    LocalKafkaFleet,
    reap_stale_runs,
)
from kdsync.localkafka.process import ProcessIdentity
from kdsync.localkafka.sasl import SASL_SSL_LISTENER, sasl_ssl_client_properties, sasl_ssl_cluster
from kdsync.localkafka.tls import BrokerTlsFiles, LocalCa, write_broker_tls

__all__ = [
    "KAFKA_VERSION",
    "SASL_SSL_LISTENER",
    "SCRAM_MECHANISM",
    "BrokerError",
    "BrokerPorts",
    "BrokerStartupError",
    "BrokerTlsFiles",
    "ClusterSpec",
    "FleetStartupError",
    "KafkaDistribution",
    "KafkaNotProvisioned",
    "LocalCa",
    "LocalKafkaBroker",
    "LocalKafkaFleet",
    "ProcessIdentity",
    "ScramUser",
    "allocate_ports",
    "broker_properties",
    "find_distribution",
    "reap_stale_runs",
    "sasl_ssl_client_properties",
    "sasl_ssl_cluster",
    "write_broker_tls",
]
