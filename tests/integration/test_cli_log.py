"""``quire log ...`` against 3 real bookie processes (click's runner, and a
``quire log tail -f`` subprocess)."""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from quire.cli.main import cli
from quire.security import write_secret
from tests.support.cluster import Cluster


@pytest.fixture
def metadata(cli_cluster: Cluster) -> str:
    return cli_cluster.metadata_uri


def quire(metadata: str, *args: str, stdin: str | None = None,
          env: dict[str, str] | None = None) -> Any:
    result = CliRunner().invoke(cli, [*args, "--metadata", metadata, "--json"], input=stdin,
                                env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def payloads(records: list[dict[str, str]]) -> list[bytes]:
    return [base64.b64decode(r["payload"]) for r in records]


def test_create_append_cat_info_truncate_delete(metadata: str, tmp_path: Path) -> None:
    pw = ("--password-file", str(write_secret(tmp_path / "pw", "pw\n")))
    env = {"QUIRE_LEDGER_PASSWORD": "pw"}
    assert quire(metadata, "log", "create", "events") == {"name": "events", "created": True}
    refused = CliRunner().invoke(cli, ["log", "create", "events", "--metadata", metadata])
    assert refused.exit_code == 1 and refused.stderr.startswith("error: ")
    assert quire(metadata, "log", "create", "events", "--exist-ok")["created"] is False

    first = quire(metadata, "log", "append", "events", "a", "b", *pw)
    assert first["positions"] == ["0:0", "0:1"]
    second = quire(metadata, "log", "append", "events", stdin="c\nd\ne\n", env=env)
    assert second["positions"] == ["1:0", "1:1", "1:2"]  # each append is a new writer: a ledger

    records = quire(metadata, "log", "cat", "events", *pw)
    assert [r["position"] for r in records] == ["0:0", "0:1", "1:0", "1:1", "1:2"]
    assert payloads(records) == [b"a", b"b", b"c", b"d", b"e"]
    assert payloads(quire(metadata, "log", "cat", "events", "--from", "1:1",
                          env=env)) == [b"d", b"e"]
    wrong = CliRunner().invoke(cli, ["log", "cat", "events", "--metadata", metadata])
    assert wrong.exit_code == 1 and wrong.stderr.startswith("error: ")  # the empty password
    text = CliRunner().invoke(cli, ["log", "cat", "events", *pw, "--metadata", metadata])
    assert text.stdout.splitlines() == ["0:0\ta", "0:1\tb", "1:0\tc", "1:1\td", "1:2\te"]
    assert payloads(quire(metadata, "log", "tail", "events", "-n", "4",
                          env=env)) == [b"b", b"c", b"d", b"e"]

    info = quire(metadata, "log", "info", "events")
    assert (info["entries"], info["writer"], info["next_seq"]) == (5, None, 2)
    assert [(r["seq"], r["state"], r["entries"]) for r in info["ledgers"]] == [
        (0, "closed", 2), (1, "closed", 3)]
    listed = {r["name"]: r for r in quire(metadata, "log", "list")}  # other tests' logs too
    assert listed["events"]["entries"] == 5

    cut = quire(metadata, "log", "truncate", "events", "--before", "1:0", *pw)
    assert cut["removed_ledgers"] == [info["ledgers"][0]["ledger_id"]]
    assert cut["truncated_before"] == "0:2"  # the end of ledger 0: the same place as 1:0
    assert payloads(quire(metadata, "log", "cat", "events", env=env)) == [b"c", b"d", b"e"]
    bad = CliRunner().invoke(cli, ["log", "truncate", "events", "--before", "x",
                                   "--metadata", metadata, "--json"])
    assert bad.exit_code == 2 and "error" in json.loads(bad.stdout)

    assert quire(metadata, "log", "delete", "events", *pw)["deleted"] is True
    assert "events" not in [r["name"] for r in quire(metadata, "log", "list")]
    gone = CliRunner().invoke(cli, ["log", "cat", "events", "--metadata", metadata, "--json"])
    assert gone.exit_code == 1 and "events" in json.loads(gone.stdout)["error"]


def wait_or_dump(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    """``proc``'s exit status; if it has not exited in ``timeout_s``, it is
    aborted and the test fails with every thread's stack (faulthandler,
    which a child started with PYTHONFAULTHANDLER=1 prints on SIGABRT)."""
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        proc.wait(10)
        stacks = proc.stderr.read().decode()[-8000:] if proc.stderr else ""
        raise AssertionError(f"no exit {timeout_s:g} s after Ctrl-C; its stacks:\n"
                             f"{stacks}") from None


def read_line(proc: subprocess.Popen[bytes], deadline_s: float) -> bytes:
    assert proc.stdout is not None
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            return proc.stdout.readline()
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
    raise AssertionError("no record from tail -f in time")


def test_tail_follow_prints_records_appended_after_it_started(metadata: str) -> None:
    quire(metadata, "log", "append", "followed", "old-1", "old-2")
    # (faulthandler: a tail that does not stop is made to say where it is, below)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "quire.cli.main", "log", "tail", "followed",
                             "-f", "-n", "1", "--json", "--metadata", metadata],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert json.loads(read_line(proc, 60))["position"] == "0:1"
        quire(metadata, "log", "append", "followed", "new")
        record = json.loads(read_line(proc, 60))
        assert (record["position"], base64.b64decode(record["payload"])) == ("1:0", b"new")
        proc.send_signal(signal.SIGINT)
        assert wait_or_dump(proc, 30) == 0
        assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
