"""A child process's parent-death signal (``parent_death_prefix``, no
``preexec_fn``) and reading its output lines with a deadline (``LineReader``),
on real processes and pipes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from quire.errors import QuireError
from quire.sandbox import LineReader, ServiceProcess, parent_death_prefix
from quire.sandbox import processes as processes_module

PRINT_PID_AND_SLEEP = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"


def test_the_process_gets_the_signal_when_the_thread_that_started_it_ends() -> None:
    assert parent_death_prefix(signal.SIGKILL), "setpriv (util-linux) is installed here"
    started: dict[str, subprocess.Popen[bytes]] = {}
    printed: list[bytes | None] = []

    def start() -> None:
        proc = subprocess.Popen([*parent_death_prefix(signal.SIGKILL), sys.executable, "-c",
                                 PRINT_PID_AND_SLEEP], stdout=subprocess.PIPE)
        started["proc"] = proc
        assert proc.stdout is not None
        printed.append(LineReader(proc.stdout).line(30))  # it runs: the signal is armed

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    proc = started["proc"]
    try:
        assert printed == [f"{proc.pid}\n".encode()]  # the command runs in place (same pid)
        assert proc.wait(30) == -signal.SIGKILL  # the thread ended, the process lives on
    finally:
        proc.kill()
        proc.wait(10)


def test_the_command_does_not_run_if_its_parent_is_not_the_one_that_started_it() -> None:
    prefix = parent_death_prefix()
    assert prefix[-1] == str(os.getpid())
    # as if the parent had died before the signal was armed (the child reparented)
    elsewhere = [*prefix[:-1], str(os.getppid())]
    done = subprocess.run([*elsewhere, sys.executable, "-c", "print('ran')"],
                          capture_output=True, timeout=30)
    assert (done.returncode, done.stdout) == (0, b"")
    done = subprocess.run([*prefix, sys.executable, "-c", "print('ran')"],
                          capture_output=True, timeout=30)
    assert (done.returncode, done.stdout) == (0, b"ran\n")


def test_without_setpriv_there_is_no_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes_module, "_setpriv", lambda: None)
    assert parent_death_prefix(signal.SIGKILL) == []


def test_a_line_is_handed_out_once_its_newline_came_and_never_waits_past_its_deadline(
) -> None:
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        reader = LineReader(pipe)
        os.write(write_end, b'{"a": 1}\n{"b"')
        assert reader.line() == b'{"a": 1}\n'
        started = time.monotonic()
        assert reader.line(0.2) is None  # half a line: no line, and no wait for the rest
        assert time.monotonic() - started < 5
        os.write(write_end, b': 2}\nlast, no newline')
        assert reader.line(5) == b'{"b": 2}\n'
        assert not reader.ended
        os.close(write_end)
        assert reader.line(5) == b"last, no newline"
        assert reader.line(5) is None
        assert reader.ended


def _service_module(tmp_path: Path, body: str) -> ServiceProcess:
    (tmp_path / "stand_in_service.py").write_text(textwrap.dedent(body))
    process = ServiceProcess(tmp_path, "stand-in", {})
    process.entry_module = "stand_in_service"
    process.extra_env = {"PYTHONPATH": str(tmp_path)}
    process.ends_with_parent = True
    return process


def test_a_service_started_to_end_with_its_parent_is_the_process_that_serves(
        tmp_path: Path) -> None:
    process = _service_module(tmp_path, """
        import json, os, time
        print(json.dumps({"event": "ready", "address": f"pid:{os.getpid()}"}), flush=True)
        time.sleep(60)
    """)
    process.start(timeout_s=30)
    try:
        assert process.proc is not None
        assert process.address == f"pid:{process.proc.pid}"  # the prefix exec'd in place
    finally:
        process.stop(10)
    assert process.proc is None


def test_a_service_that_prints_half_a_line_is_not_waited_for_past_the_timeout(
        tmp_path: Path) -> None:
    process = _service_module(tmp_path, """
        import sys, time
        sys.stdout.write('{"event": "rea')
        sys.stdout.flush()
        time.sleep(60)
    """)
    started = time.monotonic()
    try:
        with pytest.raises(QuireError, match="did not become ready in 1 s"):
            process.start(timeout_s=1.0)
        assert time.monotonic() - started < 20
    finally:
        process.kill9()
