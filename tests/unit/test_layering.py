"""The layering of ``src/quire``: each layer imports only the layers below it.

ARCHITECTURE.md draws the layers; this test holds the code to them.  Every
import counts, including those under ``if TYPE_CHECKING:`` and inside
functions: a type-only import still ties a module to the one it names, and a
deferred import is still a dependency.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

# Rank of each top-level part of quire.  A module may import its own part and
# any part of a lower rank; parts of equal rank never import each other.
RANKS: dict[str, int] = {
    "quire.errors": 0,
    "quire.types": 0,
    # wall-clock seam and the event loop thread of blocking callers
    "quire.clock": 0,
    "quire.loop_thread": 0,
    "quire.config": 1,
    # TLS, secrets, passwords, ACLs, tokens: what every server's security is made of
    "quire.security": 1,
    "quire.protocol": 2,
    "quire.metadata": 2,
    "quire.pravega_wire": 2,
    # generated gRPC code of the Pravega controller's interface, nothing else
    "quire.controller_api": 2,
    # the one HTTP server of every process (/metrics, /health, admin requests)
    "quire.http": 2,
    "quire.peer": 3,
    # the user database (in the metadata store) and the authenticator over it
    "quire.auth": 3,
    "quire.bookie": 4,
    "quire.client": 4,
    # the package itself re-exports the client's public API
    "quire": 5,
    "quire.node": 6,
    "quire.log": 6,
    "quire.bench": 6,
    "quire.tier2": 6,
    "quire.segmentstore": 7,
    # the secure sandbox's files and settings, below the sandbox that takes them
    "quire.sandbox_security": 7,
    "quire.sandbox": 8,
    "quire.segmentserver": 8,
    "quire.controller": 8,
    "quire.streams": 8,
    # process assembly of the stream tier: segment store and controller hosts
    "quire.hosts": 9,
    # a stream's history read from tier-2 alone (no process of the cluster running)
    "quire.history": 9,
    "quire.spark": 10,
    "quire.cli": 10,
    "pyspark_quire": 11,
}
TEST_ONLY = ("quire.testing", "quire.simulation")
"""Parts only tests use: they may import any part, and no other part imports them."""


def part_of(module: str) -> str:
    """The part of the tree a dotted module name belongs to."""
    for part in TEST_ONLY:
        if module == part or module.startswith(part + "."):
            return part
    pieces = module.split(".")
    if pieces[0] == "pyspark_quire":
        return "pyspark_quire"
    if len(pieces) == 1:
        return "quire"
    return ".".join(pieces[:2])


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def imports_of(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every quire import in one file."""
    tree = parsed(path)
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:  # "from quire import log" names a part too
                yield node.lineno, f"{target}.{alias.name}"


def quire_modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def layering_violations(files: list[Path]) -> list[str]:
    found: list[str] = []
    seen: set[tuple[Path, int, str]] = set()
    for path in files:
        source = part_of(module_name(path))
        if source in TEST_ONLY:
            continue
        assert source in RANKS, f"{path}: part {source} has no rank in RANKS"
        for line, target in imports_of(path):
            if not (target == "quire" or target.startswith(("quire.", "pyspark_quire"))):
                continue
            dest = part_of(target)
            if dest == source or (path, line, dest) in seen:
                continue
            seen.add((path, line, dest))
            where = f"{path.relative_to(SRC)}:{line} imports {target}"
            if dest in TEST_ONLY:
                found.append(f"{where}: the product never imports {dest}")
            elif dest in RANKS and RANKS[dest] >= RANKS[source]:
                found.append(f"{where}: {source} sits at or below {dest}")
    return found


def test_every_import_points_down() -> None:
    assert layering_violations(quire_modules()) == []


# Parts that may use another part only through its package's public names
# (``from quire.client import WriteHandle``), never its modules.
PUBLIC_ONLY = {"quire.log": ("quire.client",)}


def test_public_api_only() -> None:
    found = []
    for path in quire_modules():
        source = part_of(module_name(path))
        for line, target in imports_of(path):
            for package in PUBLIC_ONLY.get(source, ()):
                if target.startswith(package + ".") and part_of(target) == package \
                        and (SRC / Path(*target.split("."))).with_suffix(".py").exists():
                    found.append(f"{path.relative_to(SRC)}:{line} imports {target}")
    assert found == []


def module_graph() -> dict[str, set[str]]:
    """Module -> the quire modules it imports (a name that is a symbol counts as its module)."""
    files = {module_name(p): p for p in quire_modules()}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges = set()
        for _line, target in imports_of(path):
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle, each found once from its first module (depth-first)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


@pytest.mark.parametrize("package", ["quire.log", "quire.peer", "quire.node", "quire.bookie",
                                     "quire.client"])
def test_no_import_cycle_inside(package: str) -> None:
    """Inside these packages modules form a DAG (type-checking imports included)."""
    graph = {name: {t for t in edges if t.startswith(package + ".")}
             for name, edges in module_graph().items() if name.startswith(package + ".")}
    # a package's __init__ re-exports its modules: edges into it are not a cycle
    for edges in graph.values():
        edges.discard(package)
    assert cycles(graph) == []


# --- the checks themselves can fail -----------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> list[Path]:
    paths = []
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        paths.append(path)
    return paths


def test_an_upward_import_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(__import__(__name__, fromlist=["SRC"]), "SRC", tmp_path)
    files = _tree(tmp_path, {
        "quire/protocol/codec.py": "from quire.bookie import server\n",
        "quire/bookie/server.py": "from ..client import ledger\n",
        "quire/client/ledger.py": "from typing import TYPE_CHECKING\n"
                                  "if TYPE_CHECKING:\n    from quire.node import boot\n",
        "quire/log/store.py": "def f():\n    import quire.spark.source\n",
        "quire/peer/pool.py": "from quire.testing import fakes\n",
        "quire/bookie/handlers.py": "import quire.simulation.loop\n",
        "quire/simulation/run.py": "from quire.cli import main\nfrom quire.testing import x\n",
        "quire/node/boot.py": "from quire import bookie, client\nimport quire.peer\n",
    })
    found = "\n".join(layering_violations(files))
    assert "codec.py:1 imports quire.bookie" in found
    assert "server.py:1 imports quire.client" in found
    assert "ledger.py:3 imports quire.node" in found
    assert "store.py:2 imports quire.spark.source" in found
    assert "pool.py:1 imports quire.testing: the product never imports quire.testing" in found
    assert "handlers.py:1 imports quire.simulation.loop: the product never imports " \
           "quire.simulation" in found
    assert "run.py" not in found  # a test-only part may import anything
    assert "boot.py" not in found


def test_a_cycle_is_caught() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
