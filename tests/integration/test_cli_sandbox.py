"""The ``quire`` command line against a real ``quire sandbox`` process."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pravega_client
import pytest

from quire.bookie.config import BookieConfig
from quire.config import load_config
from quire.security import write_secret
from tests.support.pravega_reading import read_slices

QUIRE = [sys.executable, "-m", "quire.cli.main"]


class SandboxProcess:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}

    def start(self, *args: str, timeout_s: float = 90) -> dict[str, Any]:
        self.proc = subprocess.Popen(
            [*QUIRE, "sandbox", "--dir", str(self.directory), "--json", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                assert line, self.proc.stderr.read().decode() if self.proc.stderr else ""
                self.info = json.loads(line)
                return self.info
            assert self.proc.poll() is None, "sandbox exited before it was ready"
        raise AssertionError("sandbox not ready in time")

    def interrupt(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(60)
        self.proc = None
        return code

    def interrupt_burst(self, count: int) -> int:
        """``count`` SIGINT and SIGTERM signals back to back (a user pressing
        Ctrl-C again while a supervisor stops the process)."""
        assert self.proc is not None
        for i in range(count):
            self.proc.send_signal(signal.SIGINT if i % 2 else signal.SIGTERM)
        code = self.proc.wait(60)
        self.proc = None
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def wait_for_stderr(self, text: str, count: int = 1, timeout_s: float = 60) -> list[str]:
        """Read the sandbox's stderr until ``count`` lines held ``text``; the lines read."""
        assert self.proc is not None and self.proc.stderr is not None
        seen: list[str] = []
        deadline = time.monotonic() + timeout_s
        while sum(text in line for line in seen) < count:
            assert time.monotonic() < deadline, f"no {count} x {text!r} in {seen}"
            ready, _, _ = select.select([self.proc.stderr], [], [], 0.5)
            if ready:
                line = self.proc.stderr.readline().decode()
                assert line, f"the sandbox exited; its stderr: {seen}"
                seen.append(line)
        return seen


def read_stream(manager: pravega_client.StreamManager, scope: str, stream: str, group: str,
                count: int) -> list[str]:
    """``count`` events of the stream, read from its head by a new reader group."""
    reader = manager.create_reader_group(group, scope, stream).create_reader("reader")
    return asyncio.run(read_slices(reader, count, time.monotonic() + 60))


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[SandboxProcess]:
    process = SandboxProcess(tmp_path / "sandbox")
    yield process
    process.kill()
    for line in subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True,
                               text=True).stdout.split():
        subprocess.run(["kill", "-9", line], check=False)


def quire(metadata: str, *args: str, env: dict[str, str] | None = None) -> Any:
    out = subprocess.run([*QUIRE, *args, "--metadata", metadata, "--json"],
                         capture_output=True, timeout=120, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr.decode()
    return json.loads(out.stdout)


def test_sandbox_serves_stops_and_restarts_from_its_directory(sandbox: SandboxProcess,
                                                              tmp_path: Path) -> None:
    pw = ("--password-file", str(write_secret(tmp_path / "ledger-password", "pw\n")))
    info = sandbox.start()
    metadata = info["metadata"]
    assert [b["bookie_id"] for b in info["bookies"]] == ["bookie-1", "bookie-2", "bookie-3"]
    assert len(quire(metadata, "bookie", "list")) == 3

    written = quire(metadata, "ledger", "append", "alpha", "beta", "gamma", *pw)
    ledger_id = written["ledger_id"]
    assert written["entry_ids"] == [0, 1, 2]
    entries = quire(metadata, "ledger", "read", str(ledger_id), *pw)
    assert [base64.b64decode(e["payload"]) for e in entries] == [b"alpha", b"beta", b"gamma"]
    batched = quire(metadata, "ledger", "read", str(ledger_id), "--batch", "2",
                    env={"QUIRE_LEDGER_PASSWORD": "pw"})
    assert batched == entries
    for mode in (["--batch", "2"], ["--batch", "0", "--window", "2"]):
        bench_read = quire(metadata, "bench", "read", str(ledger_id), *mode,
                           env={"QUIRE_LEDGER_PASSWORD": "pw"})
        assert bench_read["result"]["entries"] == 3
    info_out = quire(metadata, "ledger", "info", str(ledger_id))
    assert (info_out["state"], info_out["last_entry_id"]) == ("CLOSED", 2)

    vd = quire(metadata, "ledger", "append", "x", "y", "--ledger-type", "VD_JOURNAL",
               "--keep-open")
    synced = quire(metadata, "ledger", "sync", str(vd["ledger_id"]))
    assert synced["persisted_lac"] == 1
    assert set(synced["last_add_synced"].values()) == {1}

    bench = quire(metadata, "bench", "write", "--count", "300", "--entry-bytes", "100")
    assert bench["result"]["entries"] == 300

    # the stream tier: the real Pravega client against the sandbox's controller
    controller_uri = info["controller"]["uri"]
    manager = pravega_client.StreamManager(controller_uri)
    assert manager.create_scope("sandbox")
    assert manager.create_stream("sandbox", "events", 2)
    writer = manager.create_writer("sandbox", "events")
    for n in range(20):
        writer.write_event(f"event-{n}", routing_key=f"k{n % 3}")
    writer.flush()
    del writer
    assert sorted(read_stream(manager, "sandbox", "events", "first", 20)) == \
        sorted(f"event-{n}" for n in range(20))
    # the segment store flushes to tier-2 in the sandbox's directory: the
    # controller's _system tables are flushed in every iteration (PDP-40),
    # and each one ends with a snapshot of its container's system journal
    deadline = time.monotonic() + 60
    while not any((sandbox.directory / "tier2").rglob("journal_*.E*")):
        assert time.monotonic() < deadline, "nothing reached tier-2"
        time.sleep(0.1)

    assert sandbox.interrupt() == 0
    addresses = {b["bookie_id"]: b["address"] for b in info["bookies"]}
    again = sandbox.start()
    assert {b["bookie_id"]: b["address"] for b in again["bookies"]} == addresses
    assert again["controller"]["uri"] == controller_uri
    # the stream came back with the segment store (its tier-1 replayed)
    assert sorted(read_stream(pravega_client.StreamManager(controller_uri), "sandbox",
                              "events", "second", 20)) == sorted(f"event-{n}" for n in range(20))
    entries = quire(metadata, "ledger", "read", str(ledger_id), *pw)
    assert [base64.b64decode(e["payload"]) for e in entries] == [b"alpha", b"beta", b"gamma"]
    recovered = quire(metadata, "ledger", "recover", str(vd["ledger_id"]))
    assert recovered["last_entry_id"] == 1
    quire(metadata, "ledger", "delete", str(ledger_id))
    assert ledger_id not in [row["ledger_id"] for row in quire(metadata, "ledger", "list")]
    assert sandbox.interrupt() == 0


def test_sandbox_stops_on_a_burst_of_signals(sandbox: SandboxProcess) -> None:
    """200 SIGINT and SIGTERM back to back: the sandbox stops once, with
    status 0, and leaves no bookie running.  (The deadlock this guards
    against, a handler taking the lock of the Event the main loop was
    waiting on, needed a signal to land in a window of a few bytecodes; a
    burst makes that likelier but cannot force it.)"""
    info = sandbox.start()
    assert sandbox.interrupt_burst(200) == 0
    bookie_ids = [b["bookie_id"] for b in info["bookies"]]
    left = subprocess.run(["pgrep", "-f", str(sandbox.directory)], capture_output=True,
                          text=True).stdout.split()
    assert left == [], f"bookies {bookie_ids} still running: {left}"


def test_sandbox_no_journal_reaches_every_bookie(sandbox: SandboxProcess) -> None:
    """Each bookie runs ``quire bookie start --config DIR/<id>.toml``: the
    file the sandbox wrote is the config the bookie loads."""
    info = sandbox.start("--no-journal", "--bookies", "2")
    for bookie in info["bookies"]:
        config = load_config(BookieConfig, sandbox.directory / f"{bookie['bookie_id']}.toml",
                             section="bookie")
        assert not config.storage.journal_write_data and config.data_integrity_checking
    metadata = info["metadata"]
    written = quire(metadata, "ledger", "append", "a", "b", "-e", "2", "-w", "2", "-a", "2")
    assert written["entry_ids"] == [0, 1]
    assert sandbox.interrupt() == 0


def pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":  # a zombie has ended; its parent (init, here) reaps it
            alive.append(pid)
    return alive


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal")
def test_a_killed_sandbox_takes_its_bookies_and_a_failing_restart_is_retried(
        sandbox: SandboxProcess) -> None:
    first = sandbox.start()
    bookie_pids = [b["pid"] for b in first["bookies"]]
    pids = [*bookie_pids, *(s["pid"] for s in first["segment_stores"]),
            first["controller"]["pid"]]

    held = subprocess.run([*QUIRE, "sandbox", "--dir", str(sandbox.directory), "--json"],
                          capture_output=True, timeout=60)
    assert held.returncode == 1 and b"Traceback" not in held.stderr
    message = json.loads(held.stdout)["error"]
    assert held.stderr.decode().splitlines() == [f"error: {message}"]
    assert all(f"pid {pid} (" in message for pid in bookie_pids), message
    assert "bookie start --config" in message

    assert sandbox.proc is not None
    sandbox.proc.kill()  # kill -9: no chance to stop its bookies
    sandbox.proc.wait(10)
    deadline = time.monotonic() + 30
    while pids_alive(pids):
        assert time.monotonic() < deadline, f"processes {pids_alive(pids)} outlived the sandbox"
        time.sleep(0.1)

    second = sandbox.start()
    assert [b["bookie_id"] for b in second["bookies"]] == ["bookie-1", "bookie-2", "bookie-3"]
    metadata = second["metadata"]

    # bookie-2 crashes and cannot start again (its journal directory is a file now)
    journal = sandbox.directory / "bookie-2" / "journal"
    journal.rename(journal.with_name("journal.away"))
    journal.write_text("not a directory")
    os.kill(second["bookies"][1]["pid"], signal.SIGKILL)
    sandbox.wait_for_stderr("restart of bookie bookie-2 failed")
    assert sandbox.proc.poll() is None
    written = quire(metadata, "ledger", "append", "still", "serving", "-e", "2", "-w", "2")
    assert written["entry_ids"] == [0, 1]

    journal.unlink()
    journal.with_name("journal.away").rename(journal)
    sandbox.wait_for_stderr("bookie bookie-2 is back")
    assert sorted(b["bookie_id"] for b in quire(metadata, "bookie", "list")) == [
        "bookie-1", "bookie-2", "bookie-3"]
    assert sandbox.interrupt() == 0
