"""``quire scope ...`` and ``quire stream ...`` against an in-process
controller and segment server (on a thread of their own): click's runner
with ``--json``, and a ``quire stream tail`` subprocess."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from quire.cli.main import cli
from quire.streams import ControllerClient
from tests.support.streams import SystemThread

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def controller() -> Iterator[str]:
    system = SystemThread()
    yield system.system.controller_uri
    system.close()


def quire(controller: str, *args: str, stdin: str | None = None) -> Any:
    result = CliRunner().invoke(cli, [*args, "--controller", controller, "--json"],
                                input=stdin)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def refused(controller: str, *args: str, code: int = 1) -> str:
    result = CliRunner().invoke(cli, [*args, "--controller", controller])
    assert result.exit_code == code, result.output
    assert result.stderr.startswith("error: ")
    return result.stderr


def test_scopes_and_streams_lifecycle(controller: str) -> None:
    assert quire(controller, "scope", "create", "sc") == {"scope": "sc", "created": True}
    assert quire(controller, "scope", "create", "sc")["created"] is False
    assert "sc" in quire(controller, "scope", "list")
    assert quire(controller, "stream", "create", "sc/st", "--segments", "3",
                 "--retention", "size", "--retention-param", "1000000") == \
        {"stream": "sc/st", "created": True}
    assert quire(controller, "stream", "list", "sc") == ["st"]
    info = quire(controller, "stream", "info", "sc/st")
    assert info["scaling_segments"] == 3 and info["retention"] == "size"
    assert len(info["segments"]) == 3 and not info["sealed"]
    assert [s["length"] for s in info["segments"]] == [0, 0, 0]
    scaled = quire(controller, "stream", "scale", "sc/st", str(info["segments"][0]["id"]),
                   "--into", "2")
    first = info["segments"][0]
    assert [(c["min_key"], c["max_key"]) for c in scaled["created"]] == [
        (first["min_key"], first["max_key"] / 2), (first["max_key"] / 2, first["max_key"])]
    assert len(quire(controller, "stream", "info", "sc/st")["segments"]) == 4
    assert "not an open segment" in refused(controller, "stream", "scale", "sc/st",
                                            str(first["id"]), code=2)
    assert "not sealed" in refused(controller, "stream", "delete", "sc/st")
    assert "has streams" in refused(controller, "scope", "delete", "sc")
    assert quire(controller, "stream", "seal", "sc/st") == {"stream": "sc/st", "sealed": True}
    assert quire(controller, "stream", "info", "sc/st")["sealed"] is True
    assert "sealed" in refused(controller, "stream", "write", "sc/st", "late")
    assert quire(controller, "stream", "delete", "sc/st")["deleted"] is True
    assert quire(controller, "scope", "delete", "sc") == {"scope": "sc", "deleted": True}
    assert "no scope" in refused(controller, "stream", "list", "sc")
    bad = CliRunner().invoke(cli, ["stream", "info", "nostream", "--controller", controller])
    assert bad.exit_code == 2
    assert "UNAVAILABLE" in refused("tcp://127.0.0.1:1", "scope", "list")


def test_write_cat_and_tail(controller: str) -> None:
    quire(controller, "scope", "create", "io")
    quire(controller, "stream", "create", "io/st", "--segments", "2")
    assert quire(controller, "stream", "write", "io/st", "a", "b", "--key", "k") == \
        {"stream": "io/st", "events": 2}
    assert quire(controller, "stream", "write", "io/st", "--key", "k",
                 stdin="c\nd\n")["events"] == 2
    events = quire(controller, "stream", "cat", "io/st")
    assert [base64.b64decode(e["data"]) for e in events] == [b"a", b"b", b"c", b"d"]
    text = CliRunner().invoke(cli, ["stream", "cat", "io/st", "--controller", controller])
    assert text.stdout.splitlines() == ["a", "b", "c", "d"]

    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "QUIRE_CONTROLLER": controller}
    tail = subprocess.Popen([sys.executable, "-m", "quire.cli.main", "stream", "tail", "io/st",
                             "--count", "3", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    try:
        assert tail.stderr is not None and tail.stdout is not None
        assert tail.stderr.readline().startswith("tailing io/st")  # its start cut is taken
        quire(controller, "stream", "write", "io/st", "e", "f", "g", "--key", "k")
        lines = [json.loads(tail.stdout.readline()) for _ in range(3)]
        assert [base64.b64decode(e["data"]) for e in lines] == [b"e", b"f", b"g"]
        assert tail.wait(timeout=20) == 0
    finally:
        tail.kill()
        tail.wait()


def test_update_truncate_merge_tags_history_and_transactions(controller: str) -> None:
    quire(controller, "scope", "create", "ops")
    assert quire(controller, "stream", "create", "ops/auto", "--scaling", "events",
                 "--target-rate", "50", "--scale-factor", "3", "--segments", "2",
                 "--tags", "blue,green")["created"]
    quire(controller, "stream", "create", "ops/plain")
    assert quire(controller, "stream", "list", "ops", "--tag", "green") == ["auto"]
    info = quire(controller, "stream", "info", "ops/auto")
    assert (info["scaling"], info["target_rate"], info["scale_factor"]) == ("events", 50, 3)
    assert [s["id"] for s in info["current_segments"]] == [0, 1] and info["history"] == []
    assert quire(controller, "stream", "update", "ops/auto", "--scaling", "fixed",
                 "--segments", "3", "--tags", "red")["updated"] == ["scaling", "segments",
                                                                     "tags"]
    info = quire(controller, "stream", "info", "ops/auto")
    assert (info["scaling"], len(info["current_segments"]), info["tags"]) == \
        ("fixed", 3, ["red"])
    assert [(h["reason"], h["sealed"]) for h in info["history"]] == [("update", [0, 1])]
    first, second = (s["id"] for s in info["current_segments"][:2])
    merged = quire(controller, "stream", "scale", "ops/auto", str(first), str(second))
    assert merged["sealed"] == sorted([first, second]) and len(merged["created"]) == 1
    assert [h["reason"] for h in quire(controller, "stream", "info", "ops/auto")["history"]] \
        == ["update", "manual"]
    quire(controller, "stream", "write", "ops/plain", "a", "b", "--key", "k")
    assert quire(controller, "stream", "truncate", "ops/plain", "--cut", "0=9") == \
        {"stream": "ops/plain", "cut": {"0": 9}}
    assert [base64.b64decode(e["data"]) for e in quire(controller, "stream", "cat",
                                                       "ops/plain")] == [b"b"]
    assert quire(controller, "stream", "truncate", "ops/plain", "--tail")["cut"] == {"0": 18}
    assert quire(controller, "stream", "cat", "ops/plain") == []

    async def open_txn() -> int:
        async with ControllerClient(controller) as client:
            return (await client.create_transaction("ops", "plain", 60_000)).id

    txn_id = f"{asyncio.run(open_txn()):032x}"
    listed = quire(controller, "txn", "list", "ops/plain")
    assert [(t["id"], t["state"]) for t in listed] == [(txn_id, "OPEN")]
    assert quire(controller, "txn", "abort", "ops/plain", txn_id)["aborted"] is True
    assert [t["state"] for t in quire(controller, "txn", "list", "ops/plain")] == ["ABORTED"]
    assert quire(controller, "readergroup", "list", "ops") == []
