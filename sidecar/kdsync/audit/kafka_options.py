"""Spark's Kafka source speaks the Java client's settings; members are configured for librdkafka.

``java_kafka_options`` translates one member's librdkafka ``properties`` (the ones a sidecar
uses) into the Java client's names, so the audit reads each cluster the way its sidecar does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

_SASL_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# librdkafka names that mean the same in the Java client.
_SAME_IN_JAVA = {
    "client.rack",
    "sasl.kerberos.service.name",
    "ssl.endpoint.identification.algorithm",
}


def java_kafka_options(properties: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Translate a member's librdkafka ``properties`` to Java client settings for Spark.

    Returns the settings (without the ``kafka.`` prefix) and the names it cannot translate
    (the caller warns: such a cluster may still be readable, or fail with Kafka's message).
    """
    options: dict[str, str] = {}
    unsupported: list[str] = []
    props = dict(properties)
    mechanism = props.pop("sasl.mechanisms", None) or props.pop("sasl.mechanism", None)
    username = props.pop("sasl.username", None)
    password = props.pop("sasl.password", None)
    if "security.protocol" in props:
        options["security.protocol"] = props.pop("security.protocol").upper()
    if mechanism is not None:
        options["sasl.mechanism"] = mechanism.upper()
    if username is not None or password is not None:
        module = _SASL_MODULES.get((mechanism or "PLAIN").upper())
        if module is None:
            unsupported.append("sasl.username")
        else:
            user = json.dumps(username or "")
            secret = json.dumps(password or "")
            options["sasl.jaas.config"] = f"{module} required username={user} password={secret};"
    if "ssl.ca.location" in props:
        options["ssl.truststore.type"] = "PEM"
        options["ssl.truststore.location"] = props.pop("ssl.ca.location")
    for name in sorted(props):
        if name in _SAME_IN_JAVA:
            value = props[name]
            if name == "ssl.endpoint.identification.algorithm" and value == "none":
                value = ""
            options[name] = value
        else:
            unsupported.append(name)
    return options, unsupported
