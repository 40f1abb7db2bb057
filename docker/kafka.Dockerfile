# A development Kafka: one single-node KRaft cluster (broker and controller in one JVM) per
# pod, for hack/kind-up and the e2e tests (examples/dev-kafka.yaml runs two of them). Not a
# production Kafka: no replication, data in an emptyDir.
#
# Built by hack/build-images on the kdsync sidecar image (it has Java 17 and the
# kdsync.localkafka module that writes the broker configuration), plus the Kafka broker
# classpath hack/fetch-kafka gets from Maven Central (staged as kafka/ in the context).
ARG SIDECAR_IMAGE=kdsync-sidecar:dev
FROM ${SIDECAR_IMAGE}
COPY kafka/ /opt/kafka/
COPY docker/kafka-broker.py /opt/kafka/kafka-broker.py
EXPOSE 9092
ENTRYPOINT ["/usr/bin/tini", "--", "python", "/opt/kafka/kafka-broker.py"]
