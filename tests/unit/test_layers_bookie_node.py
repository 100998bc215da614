"""Import rules of the bookie and node layers, read from the source: the
bookie is a library under the node, and shipped code never imports the
test helpers."""

from __future__ import annotations

import ast
from pathlib import Path

import quire

SRC = Path(quire.__file__).parent


def imports_of(package: str) -> dict[str, set[str]]:
    """Every module under ``quire.<package>`` and the quire modules it imports
    (type-checking imports included)."""
    out: dict[str, set[str]] = {}
    root = SRC.joinpath(*package.split(".")) if package else SRC
    for path in root.rglob("*.py"):
        module = ".".join(("quire", *path.relative_to(SRC).with_suffix("").parts))
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        out[module] = {name for name in found if name.split(".")[0] == "quire"}
    return out


def offenders(package: str, forbidden: tuple[str, ...]) -> dict[str, set[str]]:
    return {module: bad for module, names in imports_of(package).items()
            if (bad := {n for n in names if n.startswith(forbidden)})}


def test_the_bookie_imports_neither_client_nor_node() -> None:
    assert offenders("bookie", ("quire.client", "quire.node", "quire.peer", "quire.log",
                                "quire.spark", "quire.cli", "quire.sandbox")) == {}


def test_the_node_is_below_the_cli_and_spark() -> None:
    assert offenders("node", ("quire.cli", "quire.spark", "quire.sandbox")) == {}


def test_shipped_code_never_imports_the_test_helpers() -> None:
    shipped = {m: names for m, names in imports_of("").items()
               if not m.startswith("quire.testing")}
    assert {m: bad for m, names in shipped.items()
            if (bad := {n for n in names if n.startswith("quire.testing")})} == {}
