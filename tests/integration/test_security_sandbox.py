"""``quire sandbox --secure``: real processes (a bookie, a segment store, the
controller) with TLS and auth on, used the way its printed lines say, by the
real Pravega client and by ``quire scope``; the controller reaches its
``_system`` tables over the segment store's TLS wire with the internal
identity's token."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import ssl
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pravega_client
import pytest

from quire.security import read_credentials
from tests.integration.test_pravega_client import read_slices

QUIRE = [sys.executable, "-m", "quire.cli.main"]


def read_lines_until(proc: subprocess.Popen[bytes], last: str, timeout_s: float) -> list[str]:
    """Stdout lines up to the first starting with ``last`` (read from the
    descriptor: a buffered reader would hide lines from select)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    text = ""
    deadline = time.monotonic() + timeout_s
    while not any(line.strip().startswith(last) for line in text.splitlines()):
        assert time.monotonic() < deadline, f"no {last!r} line in {text!r}"
        assert proc.poll() is None, "the sandbox exited"
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            text += os.read(fd, 65536).decode()
    lines = text.splitlines(keepends=True)
    return lines[:1 + next(i for i, line in enumerate(lines)
                           if line.strip().startswith(last))]


@pytest.mark.timeout(180)
def test_the_secure_sandbox_serves_the_pravega_client_and_quire(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "sandbox"
    proc = subprocess.Popen([*QUIRE, "sandbox", "--secure", "--bookies", "1", "--dir",
                             str(directory)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        lines = read_lines_until(proc, "export pravega_client_auth_password", 120)
        said = {k.strip(): v.strip() for k, _, v in (line.partition(": ") for line in lines)
                if k.strip() in ("controller", "tls ca", "credentials")}
        uri, ca, credentials_file = said["controller"], said["tls ca"], said["credentials"]
        assert uri.startswith("tls://localhost:")
        assert stat.S_IMODE(os.stat(credentials_file).st_mode) == 0o600
        credentials = read_credentials(credentials_file)
        assert credentials.username == "admin" and len(credentials.password) >= 24
        assert credentials.password not in "".join(lines)  # read from the file, not printed
        exports = dict(line.strip().removeprefix("export ").split("=", 1)
                       for line in lines if line.strip().startswith("export "))
        assert exports["pravega_client_tls_cert_path"] == ca
        assert exports["pravega_client_auth_method"] == "Basic"
        assert exports["pravega_client_auth_username"] == "admin"
        # the password line is a shell command reading the file: run it as a shell would
        shown = subprocess.run(["sh", "-c", f"{lines[-1].strip()}; "
                                "printf %s \"$pravega_client_auth_password\""],
                               capture_output=True, text=True, check=True).stdout
        assert shown == credentials.password

        for name, value in {**exports, "pravega_client_auth_password": shown}.items():
            monkeypatch.setenv(name, value)
        manager = pravega_client.StreamManager(uri, auth_enabled=True, tls_enabled=True)
        assert manager.create_scope("secure")
        assert manager.create_stream("secure", "events", 1)
        writer = manager.create_writer("secure", "events")
        for n in range(10):
            writer.write_event(f"e:{n}")
        writer.flush()
        reader = manager.create_reader_group("g", "secure", "events").create_reader("r1")
        got = asyncio.run(read_slices(reader, 10, time.monotonic() + 75))
        assert sorted(got) == sorted(f"e:{n}" for n in range(10))

        listed = subprocess.run([*QUIRE, "scope", "list", "--controller", uri, "--tls-ca", ca,
                                 "--credentials", credentials_file],
                                capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        assert "secure" in listed.stdout.split()
        refused = subprocess.run([*QUIRE, "scope", "list", "--controller", uri, "--tls-ca", ca],
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0 and "authentication failed" in refused.stderr

        # the HTTP endpoints are TLS and authenticated too (the bookie's, say)
        context = ssl.create_default_context(cafile=ca)
        with pytest.raises(urllib.error.HTTPError) as unauthenticated:
            urllib.request.urlopen(f"https://localhost:{bookie_metrics_port(directory)}"
                                   "/metrics", context=context, timeout=10)
        assert unauthenticated.value.code == 401
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def bookie_metrics_port(directory: Path) -> int:
    """The port of the sandbox's bookie's HTTP endpoint (its registration)."""
    from quire.metadata import open_store

    state = json.loads((directory / "sandbox.json").read_text())

    async def port() -> int:
        store = await open_store(state["metadata"])
        try:
            [bookie] = await store.list_bookies()
            assert bookie.metrics_address is not None
            return int(bookie.metrics_address.rpartition(":")[2])
        finally:
            await store.close()

    return asyncio.run(port())
