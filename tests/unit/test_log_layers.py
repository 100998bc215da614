"""quire.log's modules import each other in one direction only (a DAG:
position, errors, records < catalog, ledgers < writer, reader < store <
jobs), and the package leans only on the public client API and the layers
below it.  Imports made only for type checking and inside functions count."""

from __future__ import annotations

import ast
from pathlib import Path

import quire.log

PACKAGE = Path(quire.log.__file__).parent

RANK = {
    "errors": 0,
    "position": 0,
    "records": 1,
    "durable_data_log": 1,
    "catalog": 2,
    "ledgers": 2,
    "reader": 3,
    "writer": 3,
    "named_data_log": 4,
    "store": 4,
    "jobs": 5,
    "__init__": 6,
}
"""A module may import only modules of a lower rank."""

ABOVE_OR_BESIDE = ("quire.spark", "quire.cli", "quire.testing", "quire.sandbox", "quire.bookie",
                   "quire.node", "quire.peer", "pyspark")
"""Packages quire.log never imports (the client only through ``quire.client``)."""


def forbidden(name: str) -> bool:
    return name.startswith("quire.client.") or any(
        name == package or name.startswith(f"{package}.") for package in ABOVE_OR_BESIDE)


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            found.add(node.module)
            if node.module == "quire.log":  # from quire.log import records
                found.update(f"quire.log.{alias.name}" for alias in node.names
                             if (PACKAGE / f"{alias.name}.py").exists())
    return found


def test_every_module_has_a_rank() -> None:
    assert {p.stem for p in PACKAGE.glob("*.py")} == set(RANK)


def test_modules_import_only_lower_ranks() -> None:
    upward = []
    for path in sorted(PACKAGE.glob("*.py")):
        for name in imported_modules(path):
            if name.startswith("quire.log."):
                target = name.removeprefix("quire.log.")
                if RANK[target] >= RANK[path.stem]:
                    upward.append(f"{path.stem} -> {target}")
    assert upward == []


def test_the_package_imports_no_layer_above_and_only_the_public_client() -> None:
    bad = [f"{path.stem} -> {name}" for path in sorted(PACKAGE.glob("*.py"))
           for name in imported_modules(path)
           if forbidden(name)]
    assert bad == []
