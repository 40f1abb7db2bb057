"""An import-linter contract type the built-in ones lack: an allow-list.

``forbidden`` names what a package may not import; the ordering core's rule is the
reverse, "these modules and nothing else", so that a new import of anything not yet
judged pure (a clock, a socket, a new library) fails until someone adds it on purpose.
Registered in pyproject.toml (``contract_types``) and configured like the built-in
contracts::

    [[tool.importlinter.contracts]]
    type = "allowed_imports"
    source_modules = ["kdsync.ordering"]
    allowed_modules = ["kdsync.ordering", "dataclasses", ...]

Checks the direct imports of every module in ``source_modules`` (and their
submodules): each imported module must be one of ``allowed_modules`` or inside one.
External modules are seen by their top-level name (``collections.abc`` is
``collections``), so the configuration needs ``include_external_packages = true``.
"""

from __future__ import annotations

from typing import Any

import grimp
from importlinter import Contract, ContractCheck, fields, output


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


class AllowedImportsContract(Contract):
    type_name = "allowed_imports"

    source_modules = fields.ListField(subfield=fields.StringField())
    allowed_modules = fields.ListField(subfield=fields.StringField())
    broken_contract_guidance = fields.TextField(required=False)

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        sources: list[str] = list(self.source_modules)  # type: ignore[call-overload]
        allowed: list[str] = list(self.allowed_modules)  # type: ignore[call-overload]
        missing = [s for s in sources if s not in graph.modules]
        if missing:
            raise ValueError(f"source modules not found in the import graph: {missing}")
        importers = sorted({m for s in sources for m in (s, *graph.find_descendants(s))})
        illegal: list[dict[str, Any]] = []
        for importer in importers:
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                if any(_within(imported, a) for a in allowed):
                    continue
                details = graph.get_import_details(importer=importer, imported=imported)
                lines = sorted({d["line_number"] for d in details})
                illegal.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(kept=not illegal, metadata={"illegal": illegal})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for item in check.metadata["illegal"]:
            lines = ", ".join(map(str, item["lines"]))
            output.print_error(
                f"{item['importer']} -> {item['imported']} (l.{lines}): not on the allow-list",
                bold=False,
            )
            output.new_line()
        guidance = self.broken_contract_guidance
        if guidance:
            output.print(str(guidance))
            output.new_line()
