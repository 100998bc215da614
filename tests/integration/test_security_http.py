"""A real bookie process whose HTTP endpoint (``/metrics``, ``POST
/admin/gc``) serves over TLS and authenticates against users made with
``quire auth user add`` (a real process, the password on stdin): no
credentials 401, a READ user scrapes but may not GC (403), a READ_UPDATE
user GCs, also through ``quire bookie gc --now``; plaintext on the TLS port
is closed; an unprotected secret file refuses the start."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from quire.bookie.admin import request_gc
from quire.cli.main import cli
from quire.errors import AdminRequestError, QuireError
from quire.sandbox import sqlite_uri
from quire.security import (
    Credentials,
    basic_authorization,
    client_context,
    write_credentials,
    write_secret,
)
from quire.security.certificates import issue_certificate, make_ca
from tests.support.bookies import BookieProcess

READER = Credentials("prometheus", "scrape pw")
OPERATOR = Credentials("operator", "gc pw")


def add_user(metadata_uri: str, credentials: Credentials, acl: str) -> None:
    """``quire auth user add`` in its own process, the password piped in."""
    done = subprocess.run(
        [sys.executable, "-m", "quire.cli.main", "auth", "user", "add", credentials.username,
         "--acl", acl, "--metadata", metadata_uri],
        input=credentials.password + "\n", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"user {credentials.username} added" in done.stdout


def get(url: str, tls: object, authorization: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": authorization} if authorization else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30,
                                    context=tls) as answer:  # type: ignore[arg-type]
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_bookie_http_over_tls_with_users_and_permissions(tmp_path: Path) -> None:
    metadata_uri = sqlite_uri(tmp_path / "metadata.db")
    ca = make_ca(tmp_path / "pki")
    cert = issue_certificate(ca, tmp_path / "pki", "bookie-1", ip_addresses=("127.0.0.1",))
    add_user(metadata_uri, READER, "prn::/,READ")
    add_user(metadata_uri, OPERATOR, "prn::/,READ_UPDATE")
    bookie = BookieProcess(tmp_path, metadata_uri, "bookie-1", metrics_port=0,
                           tls_cert_file=str(cert.cert_file), tls_key_file=str(cert.key_file),
                           auth_enabled=True)
    bookie.start()
    try:
        address = bookie.metrics_address
        assert address is not None
        tls = client_context(ca.cert_file)
        url = f"https://{address}/metrics"
        status, body = get(url, tls)
        assert status == 401 and "no credentials" in json.loads(body)["error"]
        status, body = get(url, tls, basic_authorization(READER.username, "wrong"))
        assert status == 401 and json.loads(body) == {"error": "wrong user name or password"}
        status, body = get(url, tls, basic_authorization(READER.username, READER.password))
        assert status == 200 and "quire_bookie_" in body
        assert get(f"https://{address}/health", tls)[0] == 200

        with pytest.raises(AdminRequestError, match="prometheus may not READ_UPDATE prn::/"):
            request_gc(address, timeout_s=60, tls=tls, authorization=basic_authorization(
                READER.username, READER.password))
        report = request_gc(address, timeout_s=60, tls=tls, authorization=basic_authorization(
            OPERATOR.username, OPERATOR.password))
        assert report["compaction"] == "major"

        credentials = write_credentials(tmp_path / "operator.toml", OPERATOR)
        result = CliRunner().invoke(cli, [
            "bookie", "gc", "--now", "--metadata", metadata_uri, "--tls-ca",
            str(ca.cert_file), "--credentials", str(credentials), "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["bookie-1"]["compaction"] == "major"
        result = CliRunner().invoke(cli, ["bookie", "gc", "--now", "--metadata", metadata_uri,
                                          "--tls-ca", str(ca.cert_file), "--json"])
        assert result.exit_code == 1 and "no credentials" in json.loads(
            result.stdout)["bookie-1"]["error"]

        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as plain:
            plain.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert plain.recv(1024) == b""  # closed without an answer
        status, body = get(f"https://{address}/metrics", tls, basic_authorization(
            READER.username, READER.password))
        assert status == 200  # and the bookie serves on
        # no credentials twice (a scrape, the command), a wrong password once
        assert 'quire_http_refusals_total{reason="unauthenticated"} 3.0' in body
        assert 'quire_http_refusals_total{reason="forbidden"} 1.0' in body
    finally:
        bookie.stop()


def test_an_unprotected_secret_file_refuses_the_start(tmp_path: Path) -> None:
    secret = write_secret(tmp_path / "token-secret", b"a cluster secret of 32 bytes....")
    secret.chmod(0o644)
    bookie = BookieProcess(tmp_path, sqlite_uri(tmp_path / "metadata.db"), "bookie-1",
                           auth_enabled=True, auth_token_secret_file=str(secret))
    with pytest.raises(QuireError, match="exited before it was ready"):
        bookie.start(timeout_s=60)
    assert f"chmod 600 {secret}" in bookie.log()
