# The kdsync sidecar image: `kdsync run --config /etc/kdsync/config.yaml`, and also the
# image of the consistency audit's Spark driver and executors (spark-operator
# SparkApplication, mainApplicationFile local:///opt/kdsync/audit/spark_main.py).
#
# Build it with hack/build-images: it stages the build context, including spark-jars/
# (Spark's Kafka connector and its runtime jars from Maven Central, via hack/fetch-spark),
# and tags kdsync-sidecar:dev. A plain `docker build` needs that folder in its context.
#
# BASE_IMAGE: any Debian bookworm-based image with python3 (>= 3.11) and its venv module.
# Users with Docker Hub keep the default; hack/build-images passes a Debian base it made
# itself (debootstrap + docker import) where no image registry is reachable.
#
# PySpark comes from the wheel (with Spark's jars, including the Kubernetes backend); the
# Kafka connector jars are added to its jars/ folder, so driver and executors load the
# Kafka source without resolving anything at run time. Spark's Kubernetes pods start with
# `driver` / `executor` arguments, which docker/spark-entrypoint.sh handles like the
# entrypoint of Apache Spark's own images.
ARG BASE_IMAGE=python:3.12-slim-bookworm

# The dependency list, read from pyproject.toml in a stage of its own: the install layer
# below is then reused until the list itself changes (not at every pyproject.toml edit).
FROM ${BASE_IMAGE} AS requirements
COPY pyproject.toml docker/requirements.py /src/
RUN python3 /src/requirements.py /src/pyproject.toml >/requirements.txt

FROM ${BASE_IMAGE}

# Java for Spark. JAVA_HOME points at a link to whatever JVM the package installed, so
# the image builds for any architecture (the folder is java-17-openjdk-<arch>).
RUN set -eu; \
    apt-get update; \
    apt-get install -y --no-install-recommends openjdk-17-jre-headless tini procps; \
    rm -rf /var/lib/apt/lists/*; \
    ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /opt/java; \
    /opt/java/bin/java -version

ENV JAVA_HOME=/opt/java \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYSPARK_PYTHON=python3 \
    VIRTUAL_ENV=/opt/kdsync/venv \
    PATH=/opt/kdsync/venv/bin:$PATH \
    SPARK_HOME=/opt/spark

# Dependencies first, in their own layer: a source change rebuilds only the layers below.
COPY docker/build-ca/ /tmp/build-ca/
COPY --from=requirements /requirements.txt /tmp/requirements.txt
RUN set -eu; \
    if [ -f /tmp/build-ca/pip-ca.pem ]; then export PIP_CERT=/tmp/build-ca/pip-ca.pem; fi; \
    python3 -m venv "$VIRTUAL_ENV"; \
    pip install --no-cache-dir --upgrade pip setuptools wheel; \
    pip install --no-cache-dir -r /tmp/requirements.txt; \
    rm -rf /tmp/build-ca /tmp/requirements.txt; \
    ln -s "$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" "$SPARK_HOME"

# Spark's Kafka source: the connector and the jars it needs that pyspark lacks (jars
# pyspark already ships, e.g. spark-tags, are kept as they are).
COPY spark-jars/ /tmp/spark-jars/
RUN set -eu; \
    cp -n /tmp/spark-jars/*.jar "$SPARK_HOME/jars/"; \
    rm -rf /tmp/spark-jars; \
    ls "$SPARK_HOME"/jars/spark-sql-kafka-0-10_*.jar

# RDMA peer links (transport.type: rdma): rdma-core's user-space drivers and its Python
# bindings, pyverbs, which are not on PyPI as wheels. Debian builds python3-pyverbs for its
# own python3; the venv sees it only when it runs that same Python version (the Debian
# base of hack/build-images does; a python:3.12 base does not, and an RDMA member then
# stops at start with "pyverbs is not importable", or falls back to TCP if allowed).
RUN set -eu; \
    apt-get update; \
    apt-get install -y --no-install-recommends rdma-core ibverbs-providers python3-pyverbs; \
    rm -rf /var/lib/apt/lists/*; \
    if [ "$(/usr/bin/python3 -c 'import sys; print(sys.version_info[:2])')" = \
         "$(python -c 'import sys; print(sys.version_info[:2])')" ]; then \
      debian=$(/usr/bin/python3 -c 'import os, pyverbs; print(os.path.dirname(os.path.dirname(pyverbs.__file__)))'); \
      site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
      echo "$debian" >"$site/debian-pyverbs.pth"; \
      python -c "import pyverbs.device"; \
      echo "pyverbs: importable in the venv ($debian)"; \
    else \
      echo "pyverbs: not for this venv's Python; RDMA members need another base image"; \
    fi

COPY README.md pyproject.toml /tmp/src/
COPY sidecar /tmp/src/sidecar
COPY operator /tmp/src/operator
COPY sidecar/kdsync/audit/spark_main.py /opt/kdsync/audit/spark_main.py
COPY sidecar/kdsync/backfill/spark_main.py /opt/kdsync/backfill/spark_main.py
COPY docker/spark-entrypoint.sh /opt/kdsync/entrypoint.sh
# --no-build-isolation: setuptools is already in the venv, so this step needs no network.
RUN set -eu; \
    pip install --no-cache-dir --no-deps --no-build-isolation /tmp/src; \
    rm -rf /tmp/src; \
    python -c "import pyspark, kdsync.audit, kdsync.runtime"; \
    chmod 0755 /opt/kdsync/entrypoint.sh; \
    useradd --uid 10001 --user-group --no-create-home --home-dir /tmp kdsync

USER 10001
WORKDIR /tmp
EXPOSE 7070 8080
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/kdsync/entrypoint.sh"]
CMD ["kdsync", "--help"]
