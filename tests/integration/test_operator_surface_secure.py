"""The operator's surface with TLS and users: a bookie, a segment store and
the controller, each its own process, every HTTP port over TLS (a local CA)
authenticating against the user database.  No credentials 401, a READ user
reads but may not change (403), a READ_UPDATE user changes, bad JSON 400;
the segment store's ``/health`` says only its status word, its containers'
health (``/api/v1/health``, what ``quire segmentstore status`` shows) needs
READ;
the page's login sets an HttpOnly, Secure, SameSite=Strict cookie, a change
made with it needs the CSRF token, Basic still works for API clients; and
the page, reading the other processes with the controller's internal
token, shows the bookie up."""

from __future__ import annotations

import http.cookiejar
import json
import time
import urllib.request
from pathlib import Path

from click.testing import CliRunner

from quire.cli.main import cli
from quire.sandbox import ControllerProcess, SegmentStoreProcess, free_port, sqlite_uri
from quire.security import basic_authorization, client_context, write_credentials, write_secret
from quire.security.certificates import issue_certificate, make_ca
from tests.integration.test_operator_surface import call
from tests.integration.test_security_http import OPERATOR, READER, add_user
from tests.support.bookies import BookieProcess
from tests.support.stream_stack import wait_assigned


def test_the_apis_and_the_page_over_tls_with_users(tmp_path: Path) -> None:
    import asyncio

    metadata = sqlite_uri(tmp_path / "metadata.db")
    ca = make_ca(tmp_path / "pki")
    cert = issue_certificate(ca, tmp_path / "pki", "localhost", dns_names=("localhost",),
                             ip_addresses=("127.0.0.1",))
    secret = write_secret(tmp_path / "token-secret", b"a cluster secret of 32 bytes....")
    security = {"tls_cert_file": str(cert.cert_file), "tls_key_file": str(cert.key_file),
                "tls_ca_file": str(ca.cert_file), "auth_enabled": True,
                "auth_token_secret_file": str(secret)}
    add_user(metadata, READER, "prn::/,READ")
    add_user(metadata, OPERATOR, "prn::/,READ_UPDATE")
    bookie = BookieProcess(tmp_path, metadata, "bookie-1", metrics_port=0, **security)
    store = SegmentStoreProcess(tmp_path, metadata, "ss-1", port=free_port(), metrics_port=0,
                                container_count=2, tier1_ensemble_size=1,
                                tier1_write_quorum_size=1, tier1_ack_quorum_size=1,
                                tier1_tls_ca_file=str(ca.cert_file),  # the bookie port's mTLS
                                tier1_tls_cert_file=str(cert.cert_file),
                                tier1_tls_key_file=str(cert.key_file), **security)
    controller = ControllerProcess(tmp_path, metadata, metrics_port=0, **security)
    tls = client_context(ca.cert_file)
    reader = {"Authorization": basic_authorization(READER.username, READER.password)}
    operator = {"Authorization": basic_authorization(OPERATOR.username, OPERATOR.password)}
    bookie.start()
    try:
        store.start()
        asyncio.run(wait_assigned(metadata, 2))
        controller.start()
        b_api = f"https://{bookie.metrics_address}/api/v1"
        base = f"https://{controller.metrics_address}"
        assert controller.ready_event["page"] == f"{base}/ui/"
        for url in (f"{b_api}/bookie/info", f"{base}/v1/scopes",
                    f"https://{store.metrics_address}/api/v1/containers",
                    f"https://{store.metrics_address}/api/v1/health"):
            assert call(url, context=tls)[0] == 401
            assert call(url, context=tls, headers=reader)[0] == 200
        # /health is a probe's: the status word only, the containers' detail needs READ
        assert call(f"https://{store.metrics_address}/health", context=tls) == (
            200, {"status": "ok"})
        health = call(f"https://{store.metrics_address}/api/v1/health", context=tls,
                      headers=reader)[1]
        assert health["status"] == "ok" and [c["container"] for c in health["containers"]] == [
            0, 1]
        status_cli = ["segmentstore", "status", "--json", "--metadata", metadata,
                      "--tls-ca", str(ca.cert_file)]
        refused = CliRunner().invoke(cli, status_cli)
        assert refused.exit_code == 1 and all(
            "no credentials" in c["status"] for c in json.loads(refused.stdout)["containers"])
        credentials = write_credentials(tmp_path / "reader.toml", READER)
        shown = CliRunner().invoke(cli, [*status_cli, "--credentials", str(credentials)])
        assert shown.exit_code == 0, shown.output
        assert [c["status"] for c in json.loads(shown.stdout)["containers"]] == ["ok", "ok"]
        assert call(f"https://{bookie.metrics_address}/ready", context=tls)[0] == 200
        assert call(f"{base}/ready", context=tls)[0] == 200
        status, refusal = call(f"{b_api}/bookie/state/readonly", "PUT", {"readOnly": True},
                               context=tls, headers=reader)
        assert status == 403 and "may not READ_UPDATE" in refusal["error"]
        assert call(f"{base}/v1/scopes", "POST", {"scopeName": "s"}, context=tls,
                    headers=reader)[0] == 403
        assert call(f"{base}/v1/scopes", "POST", raw=b"{", context=tls,
                    headers=operator)[0] == 400
        assert call(f"{base}/v1/scopes", "POST", {"scopeName": "s"}, context=tls,
                    headers=operator) == (201, {"scopeName": "s"})
        assert call(f"{base}/v1/scopes/s/streams/nope", context=tls, headers=reader)[0] == 404
        assert call(f"{b_api}/bookie/state/readonly", "PUT", {"readOnly": False}, context=tls,
                    headers=operator)[0] == 200

        # the page's login: a session cookie and a CSRF token
        cookies = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(cookies),
            urllib.request.HTTPSHandler(context=tls))

        def page_call(path: str, method: str = "GET", body: object = None,
                      headers: dict[str, str] | None = None) -> tuple[int, object]:
            request = urllib.request.Request(
                base + path, method=method, headers={"Content-Type": "application/json",
                                                     **(headers or {})},
                data=None if body is None else json.dumps(body).encode())
            try:
                with browser.open(request, timeout=60) as answer:
                    raw = answer.read()
                    return answer.status, json.loads(raw) if raw else None
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read() or b"null")

        with browser.open(base + "/ui/", timeout=60) as answer:  # the page itself is public
            assert answer.status == 200 and b"Quire cluster" in answer.read()
        assert page_call("/ui/api/cluster")[0] == 401
        assert page_call("/ui/login", "POST", {"username": READER.username,
                                               "password": "wrong"})[0] == 401
        request = urllib.request.Request(base + "/ui/login", method="POST", data=json.dumps(
            {"username": OPERATOR.username, "password": OPERATOR.password}).encode(),
            headers={"Content-Type": "application/json"})
        with browser.open(request, timeout=60) as answer:
            set_cookie = answer.headers["Set-Cookie"]
            session = json.loads(answer.read())
        assert session["user"] == OPERATOR.username and session["csrfToken"]
        assert "HttpOnly" in set_cookie and "Secure" in set_cookie
        assert "SameSite=Strict" in set_cookie
        assert page_call("/ui/api/session")[1]["csrfToken"] == session["csrfToken"]
        assert page_call("/v1/scopes", "POST", {"scopeName": "t"})[0] == 403  # no token
        assert page_call("/v1/scopes", "POST", {"scopeName": "t"},
                         {"X-CSRF-Token": session["csrfToken"]})[0] == 201
        deadline = time.monotonic() + 30
        while True:  # the controller reads the bookie over TLS with its internal token
            snapshot = page_call("/ui/api/cluster")[1]
            assert isinstance(snapshot, dict)
            states = {b["id"]: b["state"] for b in snapshot["bookies"]}
            stores = snapshot["segment_stores"]
            if states == {"bookie-1": "up"} and stores and stores[0]["containers"]:
                break
            assert time.monotonic() < deadline, snapshot
            time.sleep(0.2)
        assert page_call("/ui/logout", "POST", None,
                         {"X-CSRF-Token": session["csrfToken"]})[0] == 200
        assert page_call("/ui/api/cluster")[0] == 401
    finally:
        controller.stop()
        store.stop()
        bookie.stop()
