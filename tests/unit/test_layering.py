"""Import layering: the contracts hold, bite on violations, and match what loads.

The rules are import-linter contracts in pyproject.toml (``[tool.importlinter]``): the
layers of ``kdsync`` (exhaustive: a new top-level module must be given a layer), the
sans-I/O ordering core (a forbidden list and an allow-list), the deterministic
simulator, a config the operator can import without asyncio or TLS, and the operator's
thin handlers. ``hack/test`` runs ``lint-imports`` on the tree; the tests here run it
too, then plant one violation per contract in a copy of the tree and require that
contract to fail naming the import. Last, fresh interpreters check what importing a
package actually loads (package ``__init__`` modules, imports by name at run time),
which no static rule sees.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.fresh_imports import REPO_ROOT, loaded_modules

PYPROJECT = REPO_ROOT / "pyproject.toml"
# What the `lint-imports` script runs, started with this interpreter.
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"


def contract_ids() -> set[str]:
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]
    return {contract["id"] for contract in config["contracts"]}


def lint_imports(root: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """Run lint-imports on the tree at ``root`` (only ``contracts``, if given)."""
    args = [arg for contract in contracts for arg in ("--contract", contract)]
    return subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=root,
        timeout=120,
        # The copy's packages shadow this checkout's; a wide console keeps lines whole.
        env={
            **os.environ,
            "PYTHONPATH": f"{root / 'sidecar'}:{root / 'operator'}",
            "COLUMNS": "250",
        },
    )


def contract(contract_id: str) -> dict[str, Any]:
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]
    (found,) = [c for c in config["contracts"] if c["id"] == contract_id]
    return dict(found)


def test_the_cores_allow_list_and_forbidden_list_do_not_overlap() -> None:
    allowed = contract("pure-ordering-allow-list")["allowed_modules"]
    forbidden = contract("pure-ordering")["forbidden_modules"]
    overlap = [f for f in forbidden if any(f == a or f.startswith(a + ".") for a in allowed)]
    assert overlap == [], "a module cannot be both pure and forbidden"


def test_the_tree_keeps_every_contract() -> None:
    result = lint_imports(REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(contract_ids())} kept, 0 broken." in result.stdout, result.stdout


# ---------------------------------------------------------------- planted violations


@dataclass(frozen=True)
class Plant:
    contract: str
    file: str  # relative to the repository root
    code: str  # appended to the file (created if missing)
    names: str  # the import the failure must name, as lint-imports prints it

    def into(self, root: Path) -> None:
        path = root / self.file
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        path.write_text(f"{text}\n{self.code}\n", encoding="utf-8")


CLOCK_IN_A_FUNCTION = "def _planted() -> float:\n    import time\n\n    return time.monotonic()"
PLANTS = {
    "ordering reads the clock in a function": Plant(
        "pure-ordering",
        "sidecar/kdsync/ordering/node.py",
        CLOCK_IN_A_FUNCTION,
        "kdsync.ordering.node -> time",
    ),
    "ordering reaches the transport by a relative import": Plant(
        "pure-ordering",
        "sidecar/kdsync/ordering/ledger.py",
        "from .. import transport",
        "kdsync.ordering.ledger -> kdsync.transport",
    ),
    "ordering imports a module nobody has judged pure": Plant(
        "pure-ordering-allow-list",
        "sidecar/kdsync/ordering/log.py",
        "import json",
        "kdsync.ordering.log -> json",
    ),
    "ordering's allow-list also sees the clock": Plant(
        "pure-ordering-allow-list",
        "sidecar/kdsync/ordering/node.py",
        CLOCK_IN_A_FUNCTION,
        "kdsync.ordering.node -> time",
    ),
    "the simulator uses asyncio": Plant(
        "pure-simulation",
        "sidecar/kdsync/simulation/network.py",
        "import asyncio",
        "kdsync.simulation.network -> asyncio",
    ),
    "the simulator imports Kafka I/O": Plant(
        "pure-simulation",
        "sidecar/kdsync/simulation/runner.py",
        "from kdsync.kafka import topics",
        "kdsync.simulation.runner -> kdsync.kafka.topics",
    ),
    "a scenario run imports the campaign driver": Plant(
        "simulation-runs-skip-the-driver",
        "sidecar/kdsync/simulation/scenario.py",
        "from kdsync.simulation import campaign",
        "kdsync.simulation.scenario -> kdsync.simulation.campaign",
    ),
    "the chaos schedule reads the clock": Plant(
        "pure-chaos-schedule",
        "sidecar/kdsync/chaos/schedule.py",
        CLOCK_IN_A_FUNCTION,
        "kdsync.chaos.schedule -> time",
    ),
    "the audit's schemas import the column helpers above them": Plant(
        "audit-checks-layers",
        "sidecar/kdsync/audit/checks/model.py",
        "from kdsync.audit.checks import columns",
        "kdsync.audit.checks.model -> kdsync.audit.checks.columns",
    ),
    "an audit check reads Kafka itself": Plant(
        "pure-audit-checks",
        "sidecar/kdsync/audit/checks/by_seq.py",
        "from kdsync.audit import reader",
        "kdsync.audit.checks.by_seq -> kdsync.audit.reader",
    ),
    "Kafka I/O imports the runtime above it": Plant(
        "kdsync-layers",
        "sidecar/kdsync/kafka/topics.py",
        "from kdsync.runtime import metrics",
        "kdsync.kafka.topics -> kdsync.runtime.metrics",
    ),
    "the audit imports the runtime": Plant(
        "kdsync-layers",
        "sidecar/kdsync/audit/report.py",
        "from kdsync.runtime import metrics",
        "kdsync.audit.report -> kdsync.runtime.metrics",
    ),
    "a new top-level module has no layer": Plant(
        "kdsync-layers",
        "sidecar/kdsync/newcomer.py",
        "from kdsync import ordering",
        "kdsync.newcomer",
    ),
    "the backfill point reads a ledger from Kafka": Plant(
        "pure-backfill-point",
        "sidecar/kdsync/backfill_point.py",
        "from kdsync.kafka import ledger_reader",
        "kdsync.backfill_point -> kdsync.kafka.ledger_reader",
    ),
    "the driver uses asyncio": Plant(
        "pure-driver",
        "sidecar/kdsync/driver/member_driver.py",
        "import asyncio",
        "kdsync.driver.member_driver -> asyncio",
    ),
    "the driver reaches Kafka I/O": Plant(
        "pure-driver",
        "sidecar/kdsync/driver/ports.py",
        "from kdsync.kafka import errors",
        "kdsync.driver.ports -> kdsync.kafka.errors",
    ),
    "offset translation reads Kafka": Plant(
        "pure-failover-translation",
        "sidecar/kdsync/failover/translation.py",
        "from kdsync.kafka import partition_reader",
        "kdsync.failover.translation -> kdsync.kafka.partition_reader",
    ),
    "the T-global config rule talks to Kafka": Plant(
        "pure-global-topic-rule",
        "sidecar/kdsync/kafka/global_topic_rule.py",
        "from confluent_kafka.admin import AdminClient",
        "kdsync.kafka.global_topic_rule -> confluent_kafka",
    ),
    "the failover table imports the command": Plant(
        "failover-layers",
        "sidecar/kdsync/failover/report.py",
        "from kdsync.failover import command",
        "kdsync.failover.report -> kdsync.failover.command",
    ),
    "the config imports the TCP transport": Plant(
        "pure-config",
        "sidecar/kdsync/config/sections.py",
        "from kdsync.transport import tcp",
        "kdsync.config.sections -> kdsync.transport.tcp",
    ),
    "the transport settings import asyncio": Plant(
        "pure-transport-settings",
        "sidecar/kdsync/transport/tcp_config.py",
        "import asyncio",
        "kdsync.transport.tcp_config -> asyncio",
    ),
    "the RDMA frame stream imports the device module": Plant(
        "rdma-layers",
        "sidecar/kdsync/transport/rdma/stream.py",
        "from kdsync.transport.rdma import pyverbs_device",
        "kdsync.transport.rdma.stream -> kdsync.transport.rdma.pyverbs_device",
    ),
    "the RDMA device interface opens files": Plant(
        "pure-rdma-stream",
        "sidecar/kdsync/transport/rdma/verbs.py",
        "import os",
        "kdsync.transport.rdma.verbs -> os",
    ),
    "the wire format uses asyncio": Plant(
        "pure-formats",
        "sidecar/kdsync/wire_format/batches.py",
        "import asyncio",
        "kdsync.wire_format.batches -> asyncio",
    ),
    "Kafka I/O reaches the peer transport": Plant(
        "kafka-not-transport",
        "sidecar/kdsync/kafka/errors.py",
        "from kdsync.transport import base",
        "kdsync.kafka.errors -> kdsync.transport.base",
    ),
    "the sidecar imports the local Kafka launcher": Plant(
        "production-not-dev-tooling",
        "sidecar/kdsync/runtime/process.py",
        "from kdsync.localkafka import distribution",
        "kdsync.runtime.process -> kdsync.localkafka.distribution",
    ),
    "the replica check imports the sidecar's naming": Plant(
        "verification-independent",
        "sidecar/kdsync/verification/replica_check.py",
        "from kdsync import naming",
        "kdsync.verification.replica_check -> kdsync.naming",
    ),
    "the admin client imports aiohttp": Plant(
        "admin-client-light",
        "sidecar/kdsync/admin_client.py",
        "import aiohttp",
        "kdsync.admin_client -> aiohttp",
    ),
    "the admin client imports the peer transport's TLS": Plant(
        "admin-client-light",
        "sidecar/kdsync/admin_client.py",
        "from kdsync.transport import tls",
        "kdsync.admin_client -> kdsync.transport.tls",
    ),
    "the operator reaches Spark through the audit": Plant(
        "operator-not-sidecar-runtime",
        "operator/kdsync_operator/status.py",
        "from kdsync.audit import session",
        "kdsync.audit.session -> pyspark",
    ),
    "a pure operator module calls Kubernetes": Plant(
        "operator-thin-handlers",
        "operator/kdsync_operator/rollout.py",
        "import kubernetes",
        "kdsync_operator.rollout -> kubernetes",
    ),
    "a pure operator module imports the handlers": Plant(
        "operator-thin-handlers",
        "operator/kdsync_operator/children.py",
        "from kdsync_operator import handlers",
        "kdsync_operator.children -> kdsync_operator.handlers",
    ),
    "the membership plan reads the members itself": Plant(
        "operator-thin-handlers",
        "operator/kdsync_operator/membership.py",
        "from kdsync_operator import membership_io",
        "kdsync_operator.membership -> kdsync_operator.membership_io",
    ),
}


def copy_of_the_tree(root: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("sidecar/kdsync", "operator/kdsync_operator"):
        shutil.copytree(REPO_ROOT / folder, root / folder, ignore=ignore)
    (root / "hack").mkdir()
    shutil.copy2(REPO_ROOT / "hack" / "import_contracts.py", root / "hack")
    shutil.copy2(PYPROJECT, root)
    return root


def test_every_contract_has_a_planted_violation() -> None:
    """A contract nobody has seen fail might check nothing (a typo in a module name)."""
    assert contract_ids() == {plant.contract for plant in PLANTS.values()}


@pytest.mark.parametrize("case", list(PLANTS))
def test_a_planted_violation_breaks_its_contract(case: str, tmp_path: Path) -> None:
    plant = PLANTS[case]
    root = copy_of_the_tree(tmp_path)
    plant.into(root)
    broken = lint_imports(root, plant.contract)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "Contracts: 0 kept, 1 broken." in broken.stdout, broken.stdout + broken.stderr
    assert plant.names in broken.stdout, broken.stdout


# ---------------------------------------------------------------- what imports load

ORDERING_BANNED = (
    "socket",
    "asyncio",
    "threading",
    "random",
    "os",
    "selectors",
    "ssl",
    "subprocess",
    "datetime",
    "confluent_kafka",
    "kdsync.transport",
    "kdsync.localkafka",
    "kdsync.simulation",
)  # not `time`: CPython loads it itself


def test_importing_the_core_loads_no_io_modules() -> None:
    """What the contracts cannot see: the parent package ``kdsync/__init__.py`` runs too."""
    before = loaded_modules([], ORDERING_BANNED)
    loaded = [m for m in loaded_modules(["kdsync.ordering"], ORDERING_BANNED) if m not in before]
    assert loaded == [], f"`import kdsync.ordering` loads I/O modules: {loaded}"


def test_config_and_transport_settings_load_no_io_implementation() -> None:
    """The sidecar config (which the operator imports to validate what it renders) and
    the transport's addresses, identities and settings load neither asyncio nor the TCP
    and TLS implementation."""
    banned = (
        "asyncio",
        "kdsync.transport.tcp",
        "kdsync.transport.tls",
        "kdsync.transport.rdma",
        "pyverbs",
        "kdsync.runtime",
    )
    probe = (
        "assert 'kdsync.transport.tcp_config' in sys.modules, 'the rule checks nothing'\n"
        "assert 'kdsync.config.transport_section' in sys.modules, 'the rule checks nothing'\n"
    )
    loaded = loaded_modules(
        ["kdsync.config", "kdsync.transport", "kdsync.pki"], banned, check=probe
    )
    assert loaded == [], f"importing the config loads I/O implementation modules: {loaded}"


def test_the_admin_client_loads_only_the_standard_library_and_identities() -> None:
    """The operator imports kdsync.admin_client: what that loads, package ``__init__``
    modules included, must stay clear of the sidecar's I/O stack."""
    banned = (
        "aiohttp",
        "asyncio",
        "confluent_kafka",
        "prometheus_client",
        "kdsync.kafka",
        "kdsync.transport.tcp",
        "kdsync.transport.tls",
        "kdsync.runtime",
    )
    probe = "assert 'kdsync.transport.identity' in sys.modules, 'the rule checks nothing'\n"
    loaded = loaded_modules(["kdsync.admin_client"], banned, check=probe)
    assert loaded == [], f"importing the admin client loads the sidecar's I/O: {loaded}"
