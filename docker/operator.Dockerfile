# The kdsync operator image: kopf running kdsync_operator.handlers.
#
# Build it with hack/build-images (it stages a small build context, adds pip's certificate
# bundle if pip has one configured, and tags kdsync-operator:dev). By hand, from the
# repository root:
#   docker build -f docker/operator.Dockerfile -t kdsync-operator:dev .
#
# BASE_IMAGE: any Debian-based image with python3 (>= 3.11) and its venv module. Users with
# Docker Hub keep the default; hack/build-images passes a Debian base it made itself
# (debootstrap + docker import) where no image registry is reachable.
#
# The operator imports the sidecar's config model (kdsync.config) to validate what it
# renders, so the image installs the whole kdsync distribution, without pyspark (the
# operator never imports it; the sidecar image carries Spark).
ARG BASE_IMAGE=python:3.12-slim-bookworm

# The dependency list, read from pyproject.toml in a stage of its own: the install layer
# below is then reused until the list itself changes (not at every pyproject.toml edit).
FROM ${BASE_IMAGE} AS requirements
COPY pyproject.toml docker/requirements.py /src/
RUN python3 /src/requirements.py /src/pyproject.toml --without pyspark >/requirements.txt

FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/kdsync/venv \
    PATH=/opt/kdsync/venv/bin:$PATH

# Dependencies first, in their own layer: a source change rebuilds only the layers below.
COPY docker/build-ca/ /tmp/build-ca/
COPY --from=requirements /requirements.txt /tmp/requirements.txt
RUN set -eu; \
    if [ -f /tmp/build-ca/pip-ca.pem ]; then export PIP_CERT=/tmp/build-ca/pip-ca.pem; fi; \
    python3 -m venv "$VIRTUAL_ENV"; \
    pip install --no-cache-dir --upgrade pip setuptools wheel; \
    pip install --no-cache-dir -r /tmp/requirements.txt; \
    rm -rf /tmp/build-ca /tmp/requirements.txt

COPY README.md /tmp/src/
COPY pyproject.toml /tmp/src/
COPY sidecar /tmp/src/sidecar
COPY operator /tmp/src/operator
# --no-deps: pyspark stays out; --no-build-isolation: setuptools is already in the venv,
# so this step needs no network.
RUN set -eu; \
    pip install --no-cache-dir --no-deps --no-build-isolation /tmp/src; \
    rm -rf /tmp/src; \
    python -c "import kdsync_operator.handlers"; \
    useradd --uid 10001 --user-group --no-create-home --home-dir /tmp kdsync

USER 10001
WORKDIR /tmp
EXPOSE 8081 9443
ENTRYPOINT ["kopf"]
CMD ["run", "--standalone", "--all-namespaces", "--liveness=http://0.0.0.0:8081/healthz", "-m", "kdsync_operator.handlers"]
