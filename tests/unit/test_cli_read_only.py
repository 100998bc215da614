"""Reading never creates: every command that only reads answers ``error: no
Quire metadata at URI`` (exit 1) for a URI that names no store, and leaves
nothing behind; a command that creates things initialises it and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from quire.cli.main import cli

READERS = [
    ["bookie", "list"],
    ["ledger", "list"],
    ["ledger", "info", "1"],
    ["ledger", "read", "1"],
    ["log", "list"],
    ["log", "info", "x"],
    ["log", "cat", "x"],
    ["cookie", "list"],
    ["autorecovery", "status"],
    ["ledger", "underreplicated"],
    ["auth", "user", "list"],
]


@pytest.mark.parametrize("command", READERS, ids=" ".join)
def test_a_reading_command_refuses_a_uri_that_names_nothing(tmp_path: Path,
                                                            command: list[str]) -> None:
    uri = f"sqlite:///{tmp_path}/nonexistent-dir/none/m.db"
    result = CliRunner().invoke(cli, [*command, "--metadata", uri, "--json"])
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout) == {"error": f"no Quire metadata at {uri}"}
    assert result.stderr.strip() == f"error: no Quire metadata at {uri}"
    assert list(tmp_path.iterdir()) == []


def test_a_creating_command_initialises_the_store_and_says_so(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/new/m.db"
    result = CliRunner().invoke(cli, ["auth", "user", "add", "alice", "--acl", "prn::/,READ",
                                      "--metadata", uri], input="a password\n")
    assert result.exit_code == 0, result.output
    assert f"initialised a new Quire metadata store at {uri}" in result.stderr
    listed = CliRunner().invoke(cli, ["bookie", "list", "--metadata", uri, "--json"])
    assert listed.exit_code == 0 and json.loads(listed.stdout) == []
    assert "initialised" not in listed.stderr
