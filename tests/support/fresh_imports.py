"""What importing some modules actually loads, seen from a fresh interpreter.

The import contracts (pyproject.toml, ``[tool.importlinter]``) judge import statements;
this sees what they cannot: package ``__init__`` modules that run on the way, imports
made by name at run time, and everything a library pulls in.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCE_PATH = f"{REPO_ROOT / 'sidecar'}:{REPO_ROOT / 'operator'}"


def loaded_modules(
    imports: Sequence[str], within: Sequence[str], *, check: str = "", timeout: float = 60
) -> list[str]:
    """Import each of ``imports`` in a fresh interpreter (then run the Python statements
    ``check``, e.g. asserts that the probe imported what it should) and return, sorted,
    the modules loaded by then that are one of ``within`` or inside one."""
    program = (
        "import sys\n"
        + "".join(f"import {name}\n" for name in imports)
        + check
        + f"within = {tuple(within)!r}\n"
        + "print('\\n'.join(sorted(m for m in sys.modules "
        + "if any(m == w or m.startswith(w + '.') for w in within))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO_ROOT,
        timeout=timeout,
        env={"PYTHONPATH": SOURCE_PATH},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()
