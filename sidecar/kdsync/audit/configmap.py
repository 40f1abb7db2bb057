"""The report and the incremental state in a Kubernetes ConfigMap.

This is how a report gets from a SparkApplication's driver to the operator: the driver
writes ``report.json`` (the full report) into a ConfigMap the operator names on the command
line (``--report-configmap NAMESPACE/NAME``), and the operator reads it when the
application reaches COMPLETED. ``state.json`` in the same ConfigMap is where the last clean
run ended; the next scheduled run continues from it. The driver's service account needs
get, create and update on that ConfigMap.
"""

from __future__ import annotations

from typing import Any

REPORT_KEY = "report.json"
STATE_KEY = "state.json"


class ConfigMapError(RuntimeError):
    """The ConfigMap could not be read or written (the message names it and why)."""


def parse_reference(text: str) -> tuple[str, str]:
    """``"NAMESPACE/NAME"`` -> ``(namespace, name)``."""
    namespace, slash, name = text.partition("/")
    if not slash or not namespace or not name or "/" in name:
        raise ConfigMapError(f"--report-configmap wants NAMESPACE/NAME, got {text!r}")
    return namespace, name


def _core_api() -> Any:
    from kubernetes import client, config  # noqa: PLC0415 - only needed with a ConfigMap

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        try:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as error:
            raise ConfigMapError(
                "no Kubernetes credentials: not in a pod (no service account) and no "
                f"usable kubeconfig ({error})"
            ) from None
    return client.CoreV1Api()


class ReportConfigMap:
    """Reads the previous state from, and writes the report (and new state) to, one ConfigMap."""

    def __init__(self, reference: str, api: Any | None = None) -> None:
        self.namespace, self.name = parse_reference(reference)
        self._api = api

    @property
    def api(self) -> Any:
        if self._api is None:
            self._api = _core_api()
        return self._api

    def _describe(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    def _get(self) -> Any | None:
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

        try:
            return self.api.read_namespaced_config_map(self.name, self.namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise ConfigMapError(
                f"cannot read {self._describe()}: {error.status} {error.reason}"
            ) from None

    def read_state(self) -> str | None:
        """The saved ``state.json``, or None when there is no ConfigMap or no state yet."""
        found = self._get()
        if found is None or not found.data:
            return None
        value = found.data.get(STATE_KEY)
        return str(value) if value is not None else None

    def write(self, report_json: str, state_json: str | None, attempts: int = 5) -> None:
        """Create or replace the ConfigMap's ``report.json`` (and ``state.json`` if given);
        other keys are kept. Retries when someone else updated it in between."""
        from kubernetes import client  # noqa: PLC0415
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

        data = {REPORT_KEY: report_json}
        if state_json is not None:
            data[STATE_KEY] = state_json
        for _ in range(attempts):
            current = self._get()
            try:
                if current is None:
                    body = client.V1ConfigMap(
                        metadata=client.V1ObjectMeta(
                            name=self.name,
                            namespace=self.namespace,
                            labels={"app.kubernetes.io/managed-by": "kdsync-audit"},
                        ),
                        data=data,
                    )
                    self.api.create_namespaced_config_map(self.namespace, body)
                else:
                    current.data = {**(current.data or {}), **data}
                    # resourceVersion is kept: a concurrent update makes this fail (409).
                    self.api.replace_namespaced_config_map(self.name, self.namespace, current)
                return
            except ApiException as error:
                if error.status == 409:
                    continue  # created or updated meanwhile: read again and retry
                raise ConfigMapError(
                    f"cannot write {self._describe()}: {error.status} {error.reason}"
                ) from None
        raise ConfigMapError(f"cannot write {self._describe()}: it kept changing underneath")
