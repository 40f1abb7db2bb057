# The Kubeflow spark-operator, for clusters that cannot pull its published image
# (ghcr.io/kubeflow/spark-operator/controller): the e2e tests here, which reach no image
# registry, and hack/kind-up, which uses the same images as the e2e. With a registry,
# install the spark-operator chart with its own image instead.
#
# The operator runs spark-submit from $SPARK_HOME, so it is built on the kdsync sidecar
# image (Java, PySpark's Spark distribution) plus the spark-operator binary that
# hack/fetch-k8s builds from the Go module proxy. hack/build-images stages the binary as
# spark-operator in the build context and passes SIDECAR_IMAGE.
ARG SIDECAR_IMAGE=kdsync-sidecar:dev
FROM ${SIDECAR_IMAGE}
COPY spark-operator /usr/bin/spark-operator
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/bin/spark-operator"]
CMD ["--help"]
