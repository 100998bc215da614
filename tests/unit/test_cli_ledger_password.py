"""A ledger password reaches ``quire`` from ``--password-file`` (a secret
file, mode 0600), else ``$QUIRE_LEDGER_PASSWORD``, else the command's
default; ``--password VALUE`` still works, hidden, with one warning.  Every
command that opens or creates ledgers reads it before it touches a store."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from quire.cli.common import QuireGroup, ledger_password, ledger_password_options
from quire.cli.main import cli
from quire.security import write_secret

ENV = "QUIRE_LEDGER_PASSWORD"


@click.group(cls=QuireGroup)
def probe_cli() -> None:
    """A root like ``quire``'s, with two commands that show what they got."""


@probe_cli.command("show")
@ledger_password_options("the empty password")
def show() -> None:
    click.echo(ledger_password(b"").hex())


@probe_cli.command("show-or-none")
@ledger_password_options("none")
def show_or_none() -> None:
    click.echo(repr(ledger_password(None)))


def probe(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(probe_cli, list(args), env={ENV: "", **(env or {})})


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    return write_secret(tmp_path / "ledger-password", "from the file\n")


def test_the_file_gives_the_password_with_its_newline_stripped(secret_file: Path) -> None:
    result = probe("show", "--password-file", str(secret_file))
    assert result.exit_code == 0, result.output
    assert bytes.fromhex(result.stdout.strip()) == b"from the file"
    assert result.stderr == ""


def test_the_environment_gives_the_password_and_the_file_overrides_it(
        secret_file: Path) -> None:
    from_env = probe("show", env={ENV: "from the env"})
    assert from_env.exit_code == 0, from_env.output
    assert bytes.fromhex(from_env.stdout.strip()) == b"from the env"
    both = probe("show", "--password-file", str(secret_file), env={ENV: "from the env"})
    assert bytes.fromhex(both.stdout.strip()) == b"from the file"


def test_with_neither_the_command_has_its_default() -> None:
    assert probe("show").stdout.strip() == ""  # the empty password
    assert probe("show-or-none").stdout.strip() == "None"
    assert probe("show-or-none", env={ENV: "x"}).stdout.strip() == "b'x'"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620])
def test_a_file_others_may_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    path = write_secret(tmp_path / "pw", "secret")
    path.chmod(mode)
    result = probe("show", "--password-file", str(path))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: secret file {path} is readable or writable by group or others "
        f"(mode {mode:04o}); run: chmod 600 {path}"]


def test_a_missing_or_empty_file_is_an_error(tmp_path: Path) -> None:
    missing = probe("show", "--password-file", str(tmp_path / "none"))
    assert missing.exit_code == 1 and "cannot read secret file" in missing.stderr
    empty = probe("show", "--password-file", str(write_secret(tmp_path / "empty", "\n")))
    assert empty.exit_code == 1 and "is empty" in empty.stderr


def test_the_deprecated_argument_still_works_with_one_warning(secret_file: Path) -> None:
    result = probe("show", "--password", "old script", env={ENV: "from the env"})
    assert result.exit_code == 0, result.output
    assert bytes.fromhex(result.stdout.strip()) == b"old script"
    warning, = result.stderr.splitlines()
    assert warning.startswith("warning: --password is deprecated: other users of this host "
                              "see it in ps and /proc")
    assert "--password-file PATH" in warning and "$QUIRE_LEDGER_PASSWORD" in warning
    both = probe("show", "--password", "x", "--password-file", str(secret_file))
    assert both.exit_code == 2
    assert "give --password-file or --password, not both" in both.stderr


def test_the_deprecated_argument_is_not_in_the_help() -> None:
    shown = probe("show", "--help").stdout
    assert "--password-file" in shown and "$QUIRE_LEDGER_PASSWORD" in shown
    assert "--password " not in shown and "--password\n" not in shown


LEDGER_COMMANDS = [
    ["ledger", "create"],
    ["ledger", "append", "x"],
    ["ledger", "read", "1"],
    ["ledger", "recover", "1"],
    ["ledger", "sync", "1"],
    ["log", "append", "x", "y"],
    ["log", "cat", "x"],
    ["log", "tail", "x"],
    ["log", "truncate", "x", "--before", "0:0"],
    ["log", "delete", "x"],
    ["bench", "read", "1"],
]


@pytest.mark.parametrize("command", LEDGER_COMMANDS, ids=" ".join)
def test_every_ledger_command_reads_the_file_before_it_opens_a_store(
        tmp_path: Path, command: list[str]) -> None:
    path = write_secret(tmp_path / "pw", "secret")
    path.chmod(0o644)
    uri = f"sqlite:///{tmp_path}/none/m.db"
    result = CliRunner().invoke(cli, [*command, "--password-file", str(path),
                                      "--metadata", uri, "--json"])
    assert result.exit_code == 1, result.output
    message = (f"secret file {path} is readable or writable by group or others "
               f"(mode 0644); run: chmod 600 {path}")
    assert json.loads(result.stdout) == {"error": message}
    assert result.stderr.strip() == f"error: {message}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pw"]
