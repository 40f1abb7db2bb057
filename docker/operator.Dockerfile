# The kdsync operator image: kopf running kdsync_operator.handlers.
#
# Build from the repository root (needs a Docker engine; none runs on the CI machines):
#   docker build -f docker/operator.Dockerfile -t kdsync-operator:dev .
#
# The operator imports the sidecar's config model (kdsync.config) to validate what it
# renders, so the image installs the whole kdsync distribution (without Java/Spark).
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
# pyspark is a dependency of the distribution but never imported by the operator: skip
# its 300 MB wheel.
RUN pip install --no-cache-dir --no-deps /wheels/kdsync-*.whl \
 && pip install --no-cache-dir $(ls /wheels/*.whl | grep -v -e '/kdsync-' -e '/pyspark-' -e '/py4j-') \
 && rm -rf /wheels \
 && python -c "import kdsync_operator.handlers" \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp kdsync
USER 10001
WORKDIR /tmp
EXPOSE 8081 9443
ENTRYPOINT ["kopf"]
CMD ["run", "--standalone", "--all-namespaces", "--liveness=http://0.0.0.0:8081/healthz", "-m", "kdsync_operator.handlers"]
