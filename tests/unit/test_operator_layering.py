"""Operator layering: kopf handlers are thin; everything else is pure.

``kdsync_operator.handlers`` is the only module that may import kopf (or the Kubernetes
client); every other module of the package imports neither, so the builders and the
status logic are testable without a cluster and cannot do I/O behind the handlers' back.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = REPO_ROOT / "operator" / "kdsync_operator"
SHELL = "handlers.py"
FRAMEWORKS = ("kopf", "kubernetes")
# Beyond frameworks, pure modules also stay away from the network and processes.
IO_MODULES = ("socket", "subprocess", "urllib", "http", "aiohttp", "requests", "threading")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "__import__"
        ):
            found.append((node.lineno, "<dynamic import>"))
    return found


def top(module: str) -> str:
    return module.split(".", 1)[0]


def test_the_rule_sees_imports() -> None:
    modules = {top(m) for _, m in imported_modules(PACKAGE / SHELL)}
    assert {"kopf", "kubernetes", "kdsync_operator"} <= modules


def test_only_handlers_imports_kopf_or_kubernetes() -> None:
    offenders = []
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) >= 8, files
    for path in files:
        if path.name == SHELL:
            continue
        for line, module in imported_modules(path):
            if top(module) in FRAMEWORKS + IO_MODULES or module == "<dynamic import>":
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{line}: {module}")
    assert not offenders, "pure operator modules must not import these:\n" + "\n".join(offenders)


def _loaded_roots(
    modules: list[str], roots: tuple[str, ...], timeout: float, check: str = ""
) -> str:
    """In a fresh interpreter, import ``kdsync_operator.<m>`` for each of ``modules`` (then
    run ``check``) and return the sorted loaded modules under ``roots``, as printed."""
    program = (
        "import sys\n"
        + "".join(f"import kdsync_operator.{name}\n" for name in modules)
        + check
        + f"print(sorted(m for m in sys.modules if m.split('.')[0] in {roots!r}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={"PYTHONPATH": f"{REPO_ROOT / 'sidecar'}:{REPO_ROOT / 'operator'}"},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_importing_the_pure_modules_loads_no_framework() -> None:
    pure = [p.stem for p in sorted(PACKAGE.glob("*.py")) if p.name not in (SHELL, "__init__.py")]
    assert _loaded_roots(pure, FRAMEWORKS, timeout=60) == "[]"


def test_the_operator_never_loads_spark() -> None:
    """docker/operator.Dockerfile leaves pyspark and py4j out of the operator image: what
    the operator shares with the audit (kdsync.audit.spark_conf) must not pull them in."""
    modules = [p.stem for p in sorted(PACKAGE.glob("*.py")) if p.name != "__init__.py"]
    shared = "assert 'kdsync.audit.spark_conf' in sys.modules, 'the rule checks nothing'\n"
    assert _loaded_roots(modules, ("pyspark", "py4j"), timeout=120, check=shared) == "[]"
