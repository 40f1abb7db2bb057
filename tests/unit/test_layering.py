"""Import rules that keep the ordering core sans-I/O and the simulator deterministic.

The ordering core (``kdsync.ordering``) is a pure state machine: no sockets, clocks,
threads, randomness, files or Kafka. The rules are checked on the source (every import
statement, at any depth, including relative imports and ``__import__``) and once at run
time (what importing the package actually loads).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SIDECAR = REPO_ROOT / "sidecar"
ORDERING_DIR = SIDECAR / "kdsync" / "ordering"
SIMULATION_DIR = SIDECAR / "kdsync" / "simulation"

ORDERING_STDLIB_ALLOWED = frozenset(
    {
        "__future__",
        "collections",
        "dataclasses",
        "enum",
        "typing",
        "zlib",
        "heapq",
        "bisect",
        "itertools",
        "functools",
        "math",
    }
)
ORDERING_FORBIDDEN = (
    "socket",
    "asyncio",
    "threading",
    "time",
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
)
# The simulator is deterministic: a run is a function of its seed. It may use `random`
# because it seeds every generator itself.
SIMULATION_FORBIDDEN = ("confluent_kafka", "asyncio", "socket", "time", "threading")
# The campaign driver fans seeds out over processes and reports a wall-clock rate; it is
# not part of any scenario run, so it alone may read the clock. Nothing that a scenario
# run executes may import it (checked below).
SIMULATION_DRIVERS = {"campaign.py": frozenset({"time"}), "__main__.py": frozenset()}


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    module: str  # absolute dotted name
    statement: str  # the source text, for messages
    # For ``from module import a, b``: ``module.a``, ``module.b`` (each may be a submodule).
    submodules: tuple[str, ...] = ()

    def names(self) -> tuple[str, ...]:
        """Every module this import may load."""
        return (self.module, *self.submodules)

    def where(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}: {self.statement}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SIDECAR).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[Import]:
    """Every module ``path`` imports, resolved to absolute dotted names.

    ``from pkg import name`` also records ``pkg.name`` (the name may be a submodule);
    calls to ``__import__`` or ``importlib.import_module`` with a constant
    name count as imports too.
    """
    return imports_in(path.read_text(encoding="utf-8"), path)


def imports_in(source: str, path: Path) -> list[Import]:
    """``imports_of`` for ``source`` as though it were the file at ``path``."""
    tree = ast.parse(source, filename=str(path))
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found: list[Import] = []

    def add(node: ast.AST, module: str, submodules: tuple[str, ...] = ()) -> None:
        text = ast.get_source_segment(source, node) or ast.dump(node)
        line = getattr(node, "lineno", 0)
        found.append(Import(path, line, module, " ".join(text.split()), submodules))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base)
                module = f"{prefix}.{node.module}" if node.module else prefix
            else:
                module = node.module or ""
            names = tuple(f"{module}.{a.name}" for a in node.names if a.name != "*")
            add(node, module, names)
        elif isinstance(node, ast.Call):
            func = node.func
            dynamic = (isinstance(func, ast.Name) and func.id == "__import__") or (
                isinstance(func, ast.Attribute) and func.attr == "import_module"
            )
            if dynamic:
                arg = node.args[0] if node.args else None
                name = arg.value if isinstance(arg, ast.Constant) else None
                add(node, name if isinstance(name, str) else "<dynamic import>")
    return found


def is_within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def python_files(folder: Path) -> list[Path]:
    files = sorted(folder.rglob("*.py"))
    assert files, f"no Python files under {folder}: the layering rules would check nothing"
    return files


def fail(rule: str, offenders: list[str]) -> None:
    if offenders:
        listing = "\n  ".join(offenders)
        pytest.fail(f"{rule}:\n  {listing}", pytrace=False)


# ---------------------------------------------------------------- the ordering core


def ordering_imports() -> list[Import]:
    return [i for path in python_files(ORDERING_DIR) for i in imports_of(path)]


def modules_by_file(found: list[Import]) -> dict[str, set[str]]:
    by_file: dict[str, set[str]] = {}
    for item in found:
        by_file.setdefault(item.path.name, set()).update(item.names())
    return by_file


def banned_names(item: Import, banned: tuple[str, ...]) -> list[str]:
    """The modules of ``item`` within one of ``banned`` (plus unresolvable dynamic imports)."""
    return [
        name
        for name in item.names()
        if name == "<dynamic import>" or any(is_within(name, b) for b in banned)
    ]


def allowed_in_core(module: str) -> bool:
    return (
        is_within(module, "kdsync.ordering") or module.partition(".")[0] in ORDERING_STDLIB_ALLOWED
    )


def test_rule_sees_the_imports_it_checks() -> None:
    """Guards the guard: if parsing found nothing, every rule below would pass vacuously."""
    files = {p.name for p in python_files(ORDERING_DIR)}
    assert {"__init__.py", "node.py", "ledger.py", "log.py"} <= files, files
    by_file = modules_by_file(ordering_imports())
    assert "kdsync.ordering.log" in by_file["node.py"], by_file.get("node.py")
    assert "kdsync.ordering.ledger" in by_file["node.py"], by_file.get("node.py")
    assert "dataclasses" in by_file["log.py"], by_file.get("log.py")
    assert "kdsync.ordering.node" in by_file["__init__.py"], by_file.get("__init__.py")


def test_import_parser_resolves_every_form() -> None:
    # Parsed as though it were a module of the ordering package (it is not on disk).
    probe = ORDERING_DIR / "_layering_probe.py"
    source = (
        "import os.path as p, socket\n"
        "from . import log\n"
        "from .node import Ready\n"
        "from .. import transport\n"
        "from collections.abc import Callable\n"
        "def f() -> None:\n"
        "    import time\n"
        "    __import__('random')\n"
        "    importlib.import_module('ssl')\n"
        "    __import__(name)\n"
    )
    found = imports_in(source, probe)
    modules = {name for item in found for name in item.names()}
    expected = {
        "os.path",
        "socket",
        "kdsync.ordering",
        "kdsync.ordering.log",
        "kdsync.ordering.node",
        "kdsync.ordering.node.Ready",
        "kdsync",
        "kdsync.transport",
        "collections.abc",
        "collections.abc.Callable",
        "time",
        "random",
        "ssl",
        "<dynamic import>",
    }
    assert modules == expected, modules ^ expected
    assert [i.line for i in found if i.module == "time"] == [7]
    assert found[0].where() == (
        "sidecar/kdsync/ordering/_layering_probe.py:1: import os.path as p, socket"
    )
    # And the rules judge these forms as intended.
    verdicts = {i.statement: (bool(banned_names(i, ORDERING_FORBIDDEN)), allowed(i)) for i in found}
    assert verdicts["from . import log"] == (False, True)
    assert verdicts["from .. import transport"] == (True, False)
    assert verdicts["from collections.abc import Callable"] == (False, True)
    assert verdicts["__import__('random')"] == (True, False)
    assert verdicts["__import__(name)"] == (True, False)


def allowed(item: Import) -> bool:
    """``from pkg import sub`` is fine when ``pkg`` is, or when every ``pkg.sub`` is."""
    if allowed_in_core(item.module):
        return True
    return bool(item.submodules) and all(allowed_in_core(m) for m in item.submodules)


def test_ordering_core_imports_nothing_forbidden() -> None:
    offenders = [
        f"{item.where()}  -> imports {names}, forbidden in the sans-I/O core"
        for item in ordering_imports()
        if (names := banned_names(item, ORDERING_FORBIDDEN))
    ]
    fail(
        "kdsync.ordering must stay sans-I/O (no sockets, clocks, threads, randomness, "
        "files or Kafka); the shells (kdsync.sidecar, kdsync.simulation) do the I/O",
        offenders,
    )


def test_ordering_core_imports_only_itself_and_a_few_pure_stdlib_modules() -> None:
    offenders = [
        f"{item.where()}  -> {item.module!r} is not on the allow-list"
        for item in ordering_imports()
        if not allowed(item)
    ]
    fail(
        "kdsync.ordering may import only kdsync.ordering.* and "
        f"{sorted(ORDERING_STDLIB_ALLOWED)} (extend the allow-list in "
        "tests/unit/test_layering.py only with pure, deterministic modules)",
        offenders,
    )


def test_allow_list_and_forbidden_list_do_not_overlap() -> None:
    overlap = {m for m in ORDERING_FORBIDDEN if allowed_in_core(m)}
    assert not overlap, overlap


def test_importing_the_core_loads_no_io_modules() -> None:
    """What the AST cannot see: the parent package ``kdsync/__init__.py`` runs too."""
    banned = [m for m in ORDERING_FORBIDDEN if m != "time"]  # CPython itself loads `time`
    program = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import kdsync.ordering\n"
        "loaded = set(sys.modules) - before\n"
        f"banned = {banned!r}\n"
        "print('\\n'.join(sorted(m for m in loaded "
        "if any(m == b or m.startswith(b + '.') for b in banned))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO_ROOT,
        timeout=60,
        env={"PYTHONPATH": str(SIDECAR)},
    )
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.split()
    assert not loaded, f"`import kdsync.ordering` loads I/O modules: {loaded}"


def test_config_and_transport_settings_load_no_io_implementation() -> None:
    """The sidecar config (which the operator imports to validate what it renders) and
    the transport's addresses, identities and settings load neither asyncio nor the TCP
    and TLS implementation."""
    banned = ["asyncio", "kdsync.transport.tcp", "kdsync.transport.tls", "kdsync.runtime"]
    program = (
        "import sys\n"
        "import kdsync.config, kdsync.transport, kdsync.pki\n"
        "assert 'kdsync.transport.tcp_config' in sys.modules, 'the rule checks nothing'\n"
        f"banned = {banned!r}\n"
        "print('\\n'.join(sorted(m for m in sys.modules "
        "if any(m == b or m.startswith(b + '.') for b in banned))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO_ROOT,
        timeout=60,
        env={"PYTHONPATH": str(SIDECAR)},
    )
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.split()
    assert not loaded, f"importing the config loads I/O implementation modules: {loaded}"


# ---------------------------------------------------------------- the simulator


def test_simulation_rule_sees_the_imports_it_checks() -> None:
    by_file = modules_by_file([i for p in python_files(SIMULATION_DIR) for i in imports_of(p)])
    assert "random" in by_file["member.py"], by_file.get("member.py")
    assert "kdsync.ordering" in by_file["member.py"], by_file.get("member.py")
    assert "time" in by_file["campaign.py"], "the driver exemption below is still needed"


def test_simulation_is_deterministic() -> None:
    offenders = []
    for path in python_files(SIMULATION_DIR):
        exempt = SIMULATION_DRIVERS.get(path.name, frozenset())
        for item in imports_of(path):
            names = [
                n
                for n in banned_names(item, SIMULATION_FORBIDDEN)
                if n.partition(".")[0] not in exempt
            ]
            if names:
                offenders.append(f"{item.where()}  -> imports {names}")
    fail(
        "kdsync.simulation must be deterministic (a run is a function of its seed): "
        f"it may not import {list(SIMULATION_FORBIDDEN)}",
        offenders,
    )


def test_scenario_runs_do_not_reach_the_campaign_driver() -> None:
    """The clock the campaign driver reads must stay out of every scenario run."""
    drivers = [f"kdsync.simulation.{Path(name).stem}" for name in SIMULATION_DRIVERS]
    offenders = [
        f"{item.where()}  -> imports the driver {item.names()}"
        for path in python_files(SIMULATION_DIR)
        if path.name not in SIMULATION_DRIVERS
        for item in imports_of(path)
        if any(is_within(n, d) for n in item.names() for d in drivers)
    ]
    fail("simulation modules used by a scenario run must not import the driver", offenders)
