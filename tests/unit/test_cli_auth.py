"""``quire auth user add|passwd|acl|list|delete`` through click's runner on
SQLite metadata: passwords from stdin or a file, never an argument; the
users it makes are the ones servers authenticate."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from quire.auth import UserDatabase
from quire.cli.main import cli
from quire.errors import AuthenticationError
from quire.metadata import open_store
from quire.security import Acl, Principal, write_secret


@pytest.fixture
def metadata(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'meta.db'}"


def run(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=stdin, catch_exceptions=False)


def login(metadata: str, name: str, password: str) -> Principal:
    async def go() -> Principal:
        store = await open_store(metadata)
        try:
            return await UserDatabase(store).authenticate(name, password)
        finally:
            await store.close()

    return asyncio.run(go())


def test_a_user_round_trips_with_the_password_on_stdin(metadata: str) -> None:
    m = ("--metadata", metadata)
    added = run("auth", "user", "add", "alice", "--acl", "prn::/,READ", *m, stdin="first pw\n")
    assert added.exit_code == 0, added.output
    assert "user alice added" in added.stdout
    assert login(metadata, "alice", "first pw") == Principal("alice", Acl.parse("prn::/,READ"))
    listed = json.loads(run("auth", "user", "list", *m, "--json").stdout)
    assert listed == [{"name": "alice", "acl": "prn::/,READ", "version": 0}]
    assert "alice" in run("auth", "user", "list", *m).stdout

    changed = run("auth", "user", "passwd", "alice", *m, "--json", stdin="second pw\n")
    assert changed.exit_code == 0 and json.loads(changed.stdout)["version"] == 1
    assert login(metadata, "alice", "second pw").name == "alice"
    with pytest.raises(AuthenticationError):
        login(metadata, "alice", "first pw")

    acl = run("auth", "user", "acl", "alice", "--acl", "prn::*,READ_UPDATE", *m)
    assert acl.exit_code == 0 and "prn::*,READ_UPDATE" in acl.stdout
    assert login(metadata, "alice", "second pw").acl == Acl.parse("prn::*,READ_UPDATE")

    assert run("auth", "user", "delete", "alice", *m).exit_code == 0
    assert json.loads(run("auth", "user", "list", *m, "--json").stdout) == []
    again = run("auth", "user", "delete", "alice", *m)
    assert again.exit_code == 1 and "error: no user alice" in again.stderr


def test_a_password_argument_is_refused_saying_why(metadata: str) -> None:
    for command in (("add", "bob", "--acl", ""), ("passwd", "bob")):
        refused = run("auth", "user", *command, "--password", "hunter2", "--metadata", metadata,
                      stdin="hunter2\n")
        assert refused.exit_code == 2
        assert "not taken on the command line" in refused.stderr
        assert "--password-file" in refused.stderr
    # nothing was added: not even the store was created (reading never creates)
    assert json.loads(run("auth", "user", "list", "--metadata", metadata, "--json").stdout) == {
        "error": f"no Quire metadata at {metadata}"}


def test_a_password_file_must_be_the_owners_alone(metadata: str, tmp_path: Path) -> None:
    path = write_secret(tmp_path / "pw", "from a file\n")
    made = run("auth", "user", "add", "carol", "--acl", "", "--password-file", str(path),
               "--metadata", metadata)
    assert made.exit_code == 0, made.output
    assert login(metadata, "carol", "from a file").acl == Acl()
    path.chmod(0o644)
    refused = run("auth", "user", "passwd", "carol", "--password-file", str(path),
                  "--metadata", metadata)
    assert refused.exit_code == 1 and "chmod 600" in refused.stderr


def test_bad_input_is_refused(metadata: str) -> None:
    m = ("--metadata", metadata)
    bad_acl = run("auth", "user", "add", "dave", "--acl", "prn::/scop:S,READ", *m, stdin="pw\n")
    assert bad_acl.exit_code == 2 and "'scop:S'" in bad_acl.stderr
    bad_name = run("auth", "user", "add", "_internal", "--acl", "", *m, stdin="pw\n")
    assert bad_name.exit_code == 2 and "invalid user name" in bad_name.stderr
    empty = run("auth", "user", "add", "dave", "--acl", "", *m, stdin="\n")
    assert empty.exit_code == 2 and "may not be empty" in empty.stderr
    assert run("auth", "user", "add", "dave", "--acl", "", *m, stdin="pw").exit_code == 0
    twice = run("auth", "user", "add", "dave", "--acl", "", *m, "--json", stdin="pw\n")
    assert twice.exit_code == 1 and "exists already" in json.loads(twice.stdout)["error"]
    missing = run("auth", "user", "passwd", "erin", *m, stdin="pw\n")
    assert missing.exit_code == 1 and "no user erin" in missing.stderr
