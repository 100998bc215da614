"""No ``quire`` command prints a traceback for a user error.

Every command of click's tree (so a new one is covered without a change
here) is driven with an unknown option, a metadata URI that is not a store
or cannot exist, and unknown ids on a cluster with no bookies; then a few
known errors on 3 real bookies (a wrong password, a striped VD ledger,
unknown ids).  An error is one ``error: ...`` line on stderr, exit status 1
(2 for usage errors), and with ``--json``, ``{"error": ...}`` on stdout.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from quire.cli.main import cli
from quire.security import write_secret
from tests.support.cluster import Cluster


def leaf_commands(group: click.Group = cli, path: tuple[str, ...] = ()
                  ) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from leaf_commands(command, (*path, name))
        else:
            yield (*path, name), command


COMMANDS = dict(leaf_commands())

RUN_UNTIL_STOPPED = {("sandbox",), ("bookie", "start"), ("autorecovery", "start"),
                     ("segmentstore", "start"), ("controller", "start"), ("stream", "tail")}
"""Commands that serve until Ctrl-C when nothing is wrong: left out of the
no-bookies sweep, where they could start and keep running."""


def required_arguments(command: click.Command) -> list[str]:
    """Values for the required parameters: ids no store holds."""
    out: list[str] = []
    for param in command.params:
        if not param.required:
            continue
        value = "987654" if isinstance(param.type, click.types.IntParamType) else "no-such-id"
        if isinstance(param, click.Option):
            out += [param.opts[0], value]
        else:
            out.append(value)
    return out


def metadata_flag(command: click.Command) -> str | None:
    return next((p.opts[0] for p in command.params
                 if isinstance(p, click.Option) and p.name == "metadata_uri"), None)


def takes_json(command: click.Command) -> bool:
    return any(isinstance(p, click.Option) and "--json" in p.opts for p in command.params)


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args)


def assert_error(result: Result, exit_code: int | set[int], as_json: bool) -> str:
    """The error convention; returns the message."""
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert result.exit_code in (exit_code if isinstance(exit_code, set) else {exit_code}), output
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit), output
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1, output
    message = error_lines[0].removeprefix("error: ")
    assert message.strip(), output
    if as_json:
        assert json.loads(result.stdout) == {"error": message}, output
    return message


@pytest.fixture
def empty_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory (default sandbox dir, bookie dirs) and
    $QUIRE_METADATA: an empty store, a cluster with no bookies."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUIRE_METADATA", f"sqlite:///{tmp_path / 'empty.db'}")
    return tmp_path


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_an_unknown_option_is_a_usage_error(path: tuple[str, ...], empty_dir: Path) -> None:
    command = COMMANDS[path]
    args = [*path, *required_arguments(command), "--no-such-option"]
    as_json = takes_json(command)
    message = assert_error(invoke(args + (["--json"] if as_json else [])), 2, as_json)
    assert "--no-such-option" in message


@pytest.mark.parametrize("path", [p for p in sorted(COMMANDS) if metadata_flag(COMMANDS[p])],
                         ids=" ".join)
@pytest.mark.parametrize("store", ["not-a-store", "cannot-exist", "unknown-scheme"])
def test_a_metadata_uri_that_is_not_a_store(path: tuple[str, ...], store: str,
                                             empty_dir: Path) -> None:
    command = COMMANDS[path]
    (empty_dir / "not-a-db").write_text("this is not a database\n")
    uri = {"not-a-store": f"sqlite:///{empty_dir / 'not-a-db'}",
           "cannot-exist": f"sqlite:///{empty_dir / 'not-a-db' / 'meta.db'}",
           "unknown-scheme": "nosuchscheme://somewhere"}[store]
    flag = metadata_flag(command)
    assert flag is not None
    as_json = takes_json(command)
    result = invoke([*path, *required_arguments(command), flag, uri,
                     *(["--json"] if as_json else [])])
    # 2: a usage error found before the store is opened (`cookie delete`
    # without --yes), or `bookie start`'s own status for a bookie that refuses
    assert_error(result, {1, 2}, as_json)


@pytest.mark.parametrize("path", [p for p in sorted(COMMANDS) if p not in RUN_UNTIL_STOPPED],
                         ids=" ".join)
def test_unknown_ids_on_a_cluster_with_no_bookies(path: tuple[str, ...],
                                                  empty_dir: Path) -> None:
    command = COMMANDS[path]
    as_json = takes_json(command)
    result = invoke([*path, *required_arguments(command), *(["--json"] if as_json else [])])
    if result.exit_code == 0:  # a listing of an empty store, say
        assert "Traceback" not in result.stdout + result.stderr
        assert "error" not in result.stderr
    else:
        assert_error(result, {1, 2}, as_json)


# --- on 3 real bookies ----------------------------------------------------------------


@pytest.fixture
def metadata(cli_cluster: Cluster) -> str:
    return cli_cluster.metadata_uri


def test_known_errors_on_a_real_cluster(metadata: str, tmp_path: Path) -> None:
    def run(*args: str, password: str = "") -> Result:
        return CliRunner().invoke(cli, [*args, "--metadata", metadata, "--json"],
                                  env={"QUIRE_LEDGER_PASSWORD": password})

    striped = assert_error(run("ledger", "create", "-e", "3", "-w", "2", "-a", "2",
                               "--ledger-type", "VD_JOURNAL"), 1, True)
    assert "striped" in striped
    assert_error(run("ledger", "create", "-e", "2", "-w", "3"), 1, True)
    assert "4 writable bookies" in assert_error(run("ledger", "create", "-e", "4"), 1, True)

    written = json.loads(run("ledger", "append", "x", password="right").stdout)
    wrong_file = str(write_secret(tmp_path / "wrong", "wrong"))
    wrong = run("ledger", "read", str(written["ledger_id"]), "--password-file", wrong_file)
    assert_error(wrong, 1, True)
    assert_error(run("ledger", "read", str(written["ledger_id"]), password="wrong"), 1, True)
    assert "987654" in assert_error(run("ledger", "read", "987654"), 1, True)
    assert "987654" in assert_error(run("ledger", "info", "987654"), 1, True)
    assert_error(run("ledger", "recover", "987654"), 1, True)

    assert json.loads(run("log", "append", "guarded", "x", password="right").stdout)
    assert_error(run("log", "cat", "guarded", "--password-file", wrong_file), 1, True)
    assert "no-such-log" in assert_error(run("log", "info", "no-such-log"), 1, True)
    assert_error(run("log", "create", "bad/name"), 1, True)
    assert_error(run("cookie", "get", "no-such-bookie"), 1, True)


def test_the_deprecated_password_argument_still_reads_with_a_warning(metadata: str) -> None:
    def run(*args: str) -> Result:
        return CliRunner().invoke(cli, [*args, "--metadata", metadata, "--json"],
                                  env={"QUIRE_LEDGER_PASSWORD": "right"})

    written = json.loads(run("ledger", "append", "old", "script").stdout)
    old = run("ledger", "read", str(written["ledger_id"]), "--password", "right")
    assert old.exit_code == 0, old.output
    assert [e["entry_id"] for e in json.loads(old.stdout)] == [0, 1]
    warning, = old.stderr.splitlines()
    assert warning.startswith("warning: --password is deprecated: ")
    # the argument is what is used, not the environment
    assert_error(run("ledger", "read", str(written["ledger_id"]), "--password", "wrong"), 1,
                 True)


def test_internal_errors_show_a_traceback_only_with_debug(
        empty_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr("quire.cli.ledger.with_client", broken)
    message = assert_error(invoke(["ledger", "create", "--json"]), 1, True)
    assert "internal error" in message and "--debug" in message
    debug = invoke(["--debug", "ledger", "create"])
    assert isinstance(debug.exception, KeyError)
    monkeypatch.setenv("QUIRE_DEBUG", "1")
    assert isinstance(invoke(["ledger", "create"]).exception, KeyError)
