"""Entry point of the development Kafka image (docker/kafka.Dockerfile).

Writes the properties of a one-node combined broker+controller cluster with the same
function the tests' local brokers use (kdsync.localkafka.config.broker_properties),
formats the data folder on first start, then becomes the broker JVM.

Listeners: PLAINTEXT (inter-broker) and CONTROLLER on the pod IP, and CLIENT on port 9092
advertised as KAFKA_ADVERTISED_HOST (the Service's DNS name), which clients use.

Environment: POD_IP (downward API), KAFKA_ADVERTISED_HOST, KAFKA_DATA_DIR (default
/var/lib/kafka), KAFKA_HEAP (default 512m).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kdsync.localkafka import find_distribution
from kdsync.localkafka.config import BrokerPorts, broker_properties, render_properties

CLIENT_PORT = 9092


def main() -> None:
    pod_ip = os.environ["POD_IP"]
    advertised = os.environ["KAFKA_ADVERTISED_HOST"]
    data = Path(os.environ.get("KAFKA_DATA_DIR", "/var/lib/kafka"))
    config = Path("/tmp/server.properties")
    distribution = find_distribution(Path("/opt/kafka/libs"))
    properties = broker_properties(
        host=pod_ip,
        ports=BrokerPorts(broker=9094, controller=9093, extra=(("CLIENT", CLIENT_PORT),)),
        data_dir=data / "data",
        extra_listeners={"CLIENT": "PLAINTEXT"},
        advertised={"CLIENT": f"{advertised}:{CLIENT_PORT}"},
    )
    config.write_text(render_properties(properties, header="Written by kafka-broker.py."))
    if not (data / "data" / "meta.properties").exists():
        uuid = subprocess.run(
            distribution.java_command("kafka.tools.StorageTool", ["random-uuid"]),
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        subprocess.run(
            distribution.java_command(
                "kafka.tools.StorageTool",
                ["format", "--standalone", "-t", uuid, "-c", str(config)],
            ),
            check=True,
        )
    heap = os.environ.get("KAFKA_HEAP", "512m")
    argv = distribution.java_command(
        "kafka.Kafka",
        [str(config)],
        jvm_options=[f"-Xmx{heap}", "-Xms128m", "-XX:+UseSerialGC", "-XX:-UsePerfData"],
    )
    sys.stdout.flush()
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
