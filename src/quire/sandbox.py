"""A local cluster of real bookie processes: the sandbox, and the test harness.

:class:`BookieProcess` runs ``quire bookie start`` as a child process and
waits for its ready line; :class:`Sandbox` runs N of them with stable bookie
ids and ports, state kept in one directory so a restart finds its data.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quire.errors import QuireError


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


NO_JOURNAL_SETTINGS: dict[str, Any] = {"journal_write_data": False,
                                       "data_integrity_checking": True}
"""BP-46's protected journal-less mode, as bookie settings: adds skip the
journal, and what a crash loses is detected and repaired (``quire sandbox
--no-journal`` gives them to every bookie)."""


def sqlite_uri(path: Path) -> str:
    return f"sqlite:///{path.resolve()}"


class BookieProcess:
    """One bookie child process; ``settings`` are BookieConfig's flat keys
    (see :func:`quire.config.settings_of`)."""

    def __init__(self, root: Path, metadata_uri: str, bookie_id: str, **settings: Any) -> None:
        self.root = root
        self.bookie_id = bookie_id
        self.data_dir = root / bookie_id
        self.settings: dict[str, Any] = {
            "metadata_uri": metadata_uri,
            "bookie_id": bookie_id,
            "port": 0,
            "journal_dirs": [str(self.data_dir / "journal")],
            "ledger_dirs": [str(self.data_dir / "ledgers")],
            **settings,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.metrics_address: str | None = None
        self.log_path = root / f"{bookie_id}.log"

    @property
    def dirs(self) -> list[Path]:
        return [Path(d) for d in (*self.settings["journal_dirs"], *self.settings["ledger_dirs"])]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.root / f"{self.bookie_id}.toml"
        path.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in self.settings.items()))
        return path

    def start(self, timeout_s: float = 60.0, expect_ready: bool = True) -> None:
        config = self.write_config()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "quire.cli.main", "bookie", "start", "--config",
                 str(config)],
                stdout=subprocess.PIPE, stderr=log, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if expect_ready:
            self._wait_ready(timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    break
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("event") == "ready":
                    self.address = str(event["address"])
                    self.metrics_address = event.get("metrics")
                    return
            if self.proc.poll() is not None:
                break
        raise QuireError(f"bookie {self.bookie_id} did not become ready; its log "
                         f"({self.log_path}) ends with:\n{self.log()[-3000:]}")

    def wait_exit(self, timeout_s: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 60.0) -> None:
        """Clean shutdown (SIGTERM): flush, checkpoint, unregister."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.address.rsplit(":", 1)
        return host, int(port)


def free_port() -> int:
    """A loopback port free right now (for a bookie's stable port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_all(bookies: list[BookieProcess], timeout_s: float = 60.0,
              on_ready: Callable[[BookieProcess], None] | None = None) -> None:
    """Start the bookies in parallel, then wait until each serves; on any
    failure stop them all and re-raise."""
    for bookie in bookies:
        bookie.start(expect_ready=False)
    try:
        for bookie in bookies:
            bookie._wait_ready(timeout_s)
            if on_ready is not None:
                on_ready(bookie)
    except BaseException:
        stop_all(bookies)
        raise


def stop_all(bookies: list[BookieProcess]) -> None:
    """Clean shutdown of every bookie, SIGTERM to all first so they stop in parallel."""
    for bookie in bookies:
        if bookie.running and bookie.proc is not None:
            bookie.proc.send_signal(signal.SIGTERM)
    for bookie in bookies:
        bookie.stop()


class Sandbox:
    """N bookies on one metadata store, state in ``directory``.

    Bookie ids (``bookie-1`` ...) and ports are chosen on first start and kept
    in ``directory/sandbox.json``, so a restart serves the same ledgers.
    """

    def __init__(self, directory: Path, bookies: int = 3, metadata_uri: str | None = None,
                 **bookie_settings: Any) -> None:
        self.directory = directory
        self.count = bookies
        self.bookie_settings = bookie_settings
        state = self._load_state()
        self.metadata_uri = (metadata_uri or state.get("metadata")
                             or sqlite_uri(directory / "metadata.db"))
        ports: dict[str, int] = state.get("ports", {})
        self.bookies: list[BookieProcess] = []
        for i in range(1, bookies + 1):
            bookie_id = f"bookie-{i}"
            port = ports.get(bookie_id) or free_port()
            self.bookies.append(BookieProcess(directory, self.metadata_uri, bookie_id,
                                              port=port, **bookie_settings))

    def _load_state(self) -> dict[str, Any]:
        path = self.directory / "sandbox.json"
        if path.exists():
            loaded: dict[str, Any] = json.loads(path.read_text())
            return loaded
        return {}

    def _save_state(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        state = {"metadata": self.metadata_uri,
                 "ports": {b.bookie_id: b.settings["port"] for b in self.bookies}}
        (self.directory / "sandbox.json").write_text(json.dumps(state, indent=2))

    def start(self, on_ready: Callable[[BookieProcess], None] | None = None,
              timeout_s: float = 60.0) -> None:
        self._save_state()
        start_all(self.bookies, timeout_s, on_ready)

    def stop(self) -> None:
        stop_all(self.bookies)

    def describe(self) -> dict[str, Any]:
        return {"metadata": self.metadata_uri, "dir": str(self.directory.resolve()),
                "bookies": [{"bookie_id": b.bookie_id, "address": b.address,
                             "metrics": b.metrics_address} for b in self.bookies]}
