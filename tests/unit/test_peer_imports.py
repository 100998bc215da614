"""quire.peer's layer rule, checked on its source: it imports only
quire.protocol, quire.metadata and the leaves, never the client, the bookie,
the node or anything above them (nor quire.testing); and the modules it took
over from the client are gone from there."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

import quire.peer

ALLOWED = ("quire.peer", "quire.protocol", "quire.metadata", "quire.errors", "quire.types",
           "quire.config")


def quire_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name == "quire" or name.startswith("quire.")}


def test_peer_imports_only_protocol_metadata_and_the_leaves() -> None:
    modules = sorted(Path(quire.peer.__file__).parent.glob("*.py"))
    assert {m.name for m in modules} >= {"__init__.py", "answers.py", "config.py",
                                         "connection.py", "pool.py"}
    for module in modules:
        for name in quire_imports(module):
            assert any(name == a or name.startswith(a + ".") for a in ALLOWED), (
                f"quire/peer/{module.name} imports {name}")


@pytest.mark.parametrize("old", ["quire.client.connection", "quire.client.bookie_pool"])
def test_the_old_client_modules_are_gone(old: str) -> None:
    assert importlib.util.find_spec(old) is None
