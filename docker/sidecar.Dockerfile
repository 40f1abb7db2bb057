# The kdsync sidecar image: `kdsync run --config /etc/kdsync/config.yaml`, and also the
# image of the consistency audit's Spark driver and executors (spark-operator
# SparkApplication, mainApplicationFile local:///opt/kdsync/audit/spark_main.py).
#
# Build from the repository root (needs a Docker engine; none runs on the CI machines):
#   docker build -f docker/sidecar.Dockerfile -t kdsync-sidecar:dev .
#
# PySpark comes from the wheel (with Spark's jars, including the Kubernetes backend);
# Spark's Kubernetes pods start with `driver` / `executor` arguments, which
# docker/spark-entrypoint.sh handles like the entrypoint of Apache Spark's own images.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini procps \
 && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    PYTHONUNBUFFERED=1 \
    PYSPARK_PYTHON=python3
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
 && python -c "import pyspark, kdsync.audit" \
 && ln -s "$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" /opt/spark
ENV SPARK_HOME=/opt/spark
COPY sidecar/kdsync/audit/spark_main.py /opt/kdsync/audit/spark_main.py
COPY docker/spark-entrypoint.sh /opt/kdsync/entrypoint.sh
RUN chmod 0755 /opt/kdsync/entrypoint.sh \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp kdsync
USER 10001
WORKDIR /tmp
EXPOSE 7070 8080
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/kdsync/entrypoint.sh"]
CMD ["kdsync", "--help"]
