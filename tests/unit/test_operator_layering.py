"""Operator layering, as loaded: kopf handlers are thin; everything else is pure.

The import rules themselves are contracts in pyproject.toml (``operator-thin-handlers``:
only the shell (``handlers``, ``kube_api``, ``membership_io``) imports kopf, the
Kubernetes client or network and process modules; ``operator-not-sidecar-runtime``: no
sidecar runtime, Kafka I/O, peer transport or Spark), checked by lint-imports and by
tests/unit/test_layering.py. These tests check what importing the operator actually loads.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.fresh_imports import REPO_ROOT, loaded_modules

PACKAGE = REPO_ROOT / "operator" / "kdsync_operator"
SHELL = {"handlers.py", "kube_api.py", "membership_io.py"}


def operator_modules(*, shell: bool) -> list[str]:
    files = [p for p in sorted(PACKAGE.glob("*.py")) if p.name != "__init__.py"]
    assert len(files) >= 8, files  # the tests below would check next to nothing
    return [f"kdsync_operator.{Path(p).stem}" for p in files if shell or p.name not in SHELL]


def test_importing_the_pure_modules_loads_no_framework() -> None:
    assert loaded_modules(operator_modules(shell=False), ("kopf", "kubernetes")) == []


def test_importing_the_pure_modules_loads_none_of_the_sidecars_io() -> None:
    """The operator validates the sidecar configs it renders with kdsync.config: that
    must not bring asyncio, the peer transport, the Kafka client or the runtime along."""
    banned = (
        "asyncio",
        "confluent_kafka",
        "kdsync.transport.tcp",
        "kdsync.transport.tls",
        "kdsync.kafka",
        "kdsync.runtime",
    )
    shared = "assert 'kdsync.config' in sys.modules, 'the rule checks nothing'\n"
    assert loaded_modules(operator_modules(shell=False), banned, check=shared) == []


def test_the_operator_never_loads_spark() -> None:
    """docker/operator.Dockerfile leaves pyspark and py4j out of the operator image: what
    the operator shares with the audit (kdsync.audit.spark_conf) must not pull them in."""
    shared = "assert 'kdsync.audit.spark_conf' in sys.modules, 'the rule checks nothing'\n"
    loaded = loaded_modules(operator_modules(shell=True), ("pyspark", "py4j"), check=shared)
    assert loaded == []
