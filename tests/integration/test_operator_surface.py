"""The operator's surface against a real ``quire sandbox`` (3 bookies, a
segment store, the controller, each its own process): the bookies' admin
API, the controller's REST API (and its OpenAPI document), ``/ready``
everywhere, the Grafana dashboard's metric names on the live ``/metrics``,
and the cluster page in headless Chromium (Debian's, driven by Selenium):
no console error, no request leaving the machine, a killed bookie shown
down and back up, a stream written by the official client shown with a
rate.  The secure variant (TLS and users) is test_operator_surface_secure."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pravega_client
import pytest

from tests.integration.test_cli_sandbox import SandboxProcess
from tests.integration.test_pravega_client import read_slices

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "quire-dashboard.json"


def call(url: str, method: str = "GET", body: Any = None, *, raw: bytes | None = None,
         headers: dict[str, str] | None = None, context: Any = None) -> tuple[int, Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None
                                        else None)
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60, context=context) as answer:
            text = answer.read().decode()
            status = answer.status
    except urllib.error.HTTPError as e:
        text, status = e.read().decode(), e.code
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    process = SandboxProcess(tmp_path_factory.mktemp("ops") / "sandbox")
    process.start()
    yield process
    process.kill()
    for pid in subprocess.run(["pgrep", "-f", str(process.directory)], capture_output=True,
                              text=True).stdout.split():
        subprocess.run(["kill", "-9", pid], check=False)


def test_bookie_admin_api(sandbox: SandboxProcess) -> None:
    info = sandbox.info
    bookie = info["bookies"][0]
    base = f"http://{bookie['metrics']}/api/v1"
    assert call(f"http://{bookie['metrics']}/ready") == (200, {"status": "ready"})
    assert call(f"{base}/bookie/is_ready")[0] == 200
    status, about = call(f"{base}/bookie/info")
    assert status == 200 and about["bookieId"] == bookie["bookie_id"]
    assert about["totalSpace"] >= about["freeSpace"] > 0
    assert call(f"{base}/bookie/state")[1]["readOnly"] is False
    assert call(f"{base}/bookie/state/readonly", "PUT", {"readOnly": True}) == (
        200, {"readOnly": True})
    deadline = time.monotonic() + 10
    while call(f"{base}/bookie/list_bookies?type=ro")[1] != {
            bookie["bookie_id"]: bookie["address"]}:
        assert time.monotonic() < deadline, "the read-only state was not registered"
        time.sleep(0.1)
    assert call(f"{base}/bookie/state/readonly", "PUT", {"readOnly": False})[1] == {
        "readOnly": False}
    assert call(f"{base}/bookie/state/readonly", "PUT", raw=b"{nope")[0] == 400
    status, error = call(f"{base}/bookie/state/readonly", "PUT", {"readOnly": "yes"})
    assert status == 400 and "readOnly" in error["error"]
    assert call(f"{base}/bookie/list_bookies?type=xx")[0] == 400
    assert len(call(f"{base}/bookie/list_bookies")[1]) == 3
    cluster = call(f"{base}/bookie/cluster_info")[1]
    assert cluster["totalBookiesCount"] == 3 and cluster["unavailableBookiesCount"] == 0
    mark = call(f"{base}/bookie/last_log_mark")[1]
    assert re.fullmatch(r"\d+:\d+", next(iter(mark.values()))["current"])
    status, report = call(f"{base}/bookie/gc", "PUT")
    assert status == 200 and report["compaction"] == "major"
    assert call(f"{base}/bookie/gc")[1] == {"is_in_force_gc": False}
    assert call(f"{base}/bookie/gc_details")[1][0]["majorCompactionCounter"] >= 1
    ledgers = call(f"{base}/ledger/list?print_metadata=true")[1]
    assert ledgers, "the segment store's tier-1 ledgers are listed"
    ledger_id = next(iter(ledgers))
    assert call(f"{base}/ledger/metadata?ledger_id={ledger_id}")[1][ledger_id][
        "ledger_id"] == int(ledger_id)
    assert call(f"{base}/ledger/metadata?ledger_id=999999999")[0] == 404
    assert call(f"{base}/ledger/metadata?ledger_id=x")[0] == 400
    recovery = call(f"{base}/autorecovery/status")[1]
    assert recovery["enabled"] is True and recovery["lostBookies"] == []
    assert call(f"{base}/autorecovery/list_under_replicated_ledger")[1] == []
    assert call(f"{base}/autorecovery/who_is_auditor")[1]["Auditor"] in {
        b["bookie_id"] for b in info["bookies"]}
    assert call(f"{base}/autorecovery/trigger_audit", "PUT")[1] == {
        "lostBookies": [], "ledgersMarked": 0}
    assert call(f"{base}/autorecovery/decommission", "PUT", {})[0] == 400
    assert call(f"{base}/autorecovery/decommission", "PUT", {"bookie_src": "nope"})[0] == 404
    assert call(f"{base}/autorecovery/decommission")[0] == 404
    assert call(f"{base}/no/such/thing")[0] == 404
    # a tier-1 write that met the read-only bookie (E3 on 3 bookies: no
    # replacement) may have cost a container its log; it reopens by itself
    store = info["segment_stores"][0]["metrics"]
    deadline = time.monotonic() + 30
    while call(f"http://{store}/ready")[0] != 200:
        assert time.monotonic() < deadline, "the segment store did not become ready again"
        time.sleep(0.1)
    assert call(f"http://{store}/api/v1/containers")[1]["containers"]


def test_controller_rest_api(sandbox: SandboxProcess) -> None:
    base = f"http://{sandbox.info['controller']['metrics']}"
    v1 = f"{base}/v1/scopes"
    assert call(f"{base}/ready") == (200, {"status": "ready"})
    assert call(v1, "POST", {"scopeName": "rest"}) == (201, {"scopeName": "rest"})
    assert call(v1, "POST", {"scopeName": "rest"})[0] == 409
    assert call(v1, "POST", {"scopeName": "_bad"})[0] == 400
    status, error = call(v1, "POST", raw=b"not json")
    assert status == 400 and "not JSON" in error["error"]
    assert {"scopeName": "rest"} in call(v1)[1]["scopes"]
    assert call(f"{v1}/rest")[1] == {"scopeName": "rest"}
    assert call(f"{v1}/nope")[0] == 404
    config = {"streamName": "orders", "scalingPolicy": {"type": "FIXED_NUM_SEGMENTS",
                                                        "minSegments": 2},
              "retentionPolicy": {"type": "LIMITED_DAYS", "value": 0,
                                  "timeBasedRetention": {"days": 1, "hours": 2, "minutes": 3}},
              "streamTags": ["a"]}
    status, created = call(f"{v1}/rest/streams", "POST", config)
    assert status == 201 and created["scalingPolicy"]["minSegments"] == 2
    assert created["retentionPolicy"]["timeBasedRetention"] == {"days": 1, "hours": 2,
                                                                "minutes": 3}
    assert call(f"{v1}/rest/streams", "POST", config)[0] == 409
    assert call(f"{v1}/nope/streams", "POST", config)[0] == 404
    assert call(f"{v1}/rest/streams", "POST", {"streamName": "x", "scalingPolicy": {
        "type": "SOMETIMES"}})[0] == 400
    assert call(f"{v1}/rest/streams", "POST", {"scalingPolicy": {}})[0] == 400
    assert [s["streamName"] for s in call(f"{v1}/rest/streams")[1]["streams"]] == ["orders"]
    assert call(f"{v1}/rest/streams?filter_type=tag&filter_value=b")[1] == {"streams": []}
    assert call(f"{v1}/rest/streams/orders")[1]["tags"] == ["a"]
    assert call(f"{v1}/rest/streams/nope")[0] == 404
    status, updated = call(f"{v1}/rest/streams/orders", "PUT", {
        "scalingPolicy": {"type": "FIXED_NUM_SEGMENTS", "minSegments": 2},
        "retentionPolicy": {"type": "LIMITED_SIZE_MB", "value": 5}})
    assert status == 200 and updated["retentionPolicy"]["value"] == 5
    events = call(f"{v1}/rest/streams/orders/scaling-events?from=0&to={2**62}")[1]
    assert len(events["scalingEvents"]) == 1
    assert len(events["scalingEvents"][0]["segmentList"]) == 2
    assert call(f"{v1}/rest/streams/orders/scaling-events")[0] == 400
    assert call(f"{v1}/rest/streams/orders", "DELETE")[0] == 412  # not sealed
    assert call(f"{v1}/rest", "DELETE")[0] == 412  # has a stream
    assert call(f"{v1}/rest/streams/orders/state", "PUT", {"streamState": "OPEN"})[0] == 400
    assert call(f"{v1}/rest/streams/orders/state", "PUT", {"streamState": "SEALED"}) == (
        200, {"streamState": "SEALED"})
    assert call(f"{v1}/rest/streams/orders", "DELETE")[0] == 204
    assert call(f"{v1}/rest/streams/orders", "DELETE")[0] == 404
    assert call(f"{v1}/rest", "DELETE")[0] == 204

    # reader groups: the official client's own, and its positions
    manager = pravega_client.StreamManager(sandbox.info["controller"]["uri"])
    assert manager.create_scope("groups")
    assert manager.create_stream("groups", "events", 2)
    writer = manager.create_writer("groups", "events")
    for n in range(40):
        writer.write_event(f"event-{n}", routing_key=f"k{n % 4}")
    writer.flush()
    reader = manager.create_reader_group("grp", "groups", "events").create_reader("r1")
    assert len(asyncio.run(read_slices(reader, 40, time.monotonic() + 60,
                                       go_offline=False))) == 40
    assert call(f"{v1}/groups/readergroups")[1] == {"readerGroups": [
        {"readerGroupName": "grp"}]}
    status, group = call(f"{v1}/groups/readergroups/grp")
    assert status == 200 and group["streamList"] == ["groups/events"]
    assert group["onlineReaderIds"] == ["r1"]
    assert set(group["positions"]) == {"groups/events/0.#epoch.0", "groups/events/1.#epoch.0"}

    async def offline() -> None:
        reader.reader_offline()

    asyncio.run(offline())  # its positions are written back: everything was read
    group = call(f"{v1}/groups/readergroups/grp")[1]
    assert group["onlineReaderIds"] == [] and sum(group["positions"].values()) > 0
    assert call(f"{v1}/groups/readergroups/nope")[0] == 404
    assert call(f"{v1}/nope/readergroups")[0] == 404
    for bad in ("g_1", "g" * 251):  # outside the naming rule (check_name): 400, GET and DELETE
        for method in ("GET", "DELETE"):
            status, refusal = call(f"{v1}/groups/readergroups/{bad}", method)
            assert status == 400 and "invalid reader group name" in refusal["error"], refusal

    # the OpenAPI document names exactly the routes served
    document = call(f"{base}/v1/openapi.json")[1]
    from quire.controller.core import ControllerConfig, ControllerCore
    from quire.controller.reader_groups import ReaderGroups
    from quire.controller.rest import ControllerRest

    core = ControllerCore(None, ControllerConfig())  # type: ignore[arg-type]
    served = {(r.method.lower(), r.path) for r in ControllerRest(
        core, ReaderGroups(None)).routes()}  # type: ignore[arg-type]
    documented = {(method, path) for path, item in document["paths"].items()
                  for method in item if method != "parameters"}
    assert served == documented


def test_the_grafana_dashboard_names_metrics_that_exist(sandbox: SandboxProcess) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for wanted in ("bookie add latency", "journal sync latency", "segment append latency",
                   "tier-1 backlog", "tier-2 lag", "flush failures", "controller rpc errors",
                   "under-replicated ledgers"):
        assert wanted in titles
    info = sandbox.info
    manager = pravega_client.StreamManager(info["controller"]["uri"])  # RPCs and appends
    assert manager.create_scope("grafana")
    assert manager.create_stream("grafana", "metrics", 1)
    writer = manager.create_writer("grafana", "metrics")
    writer.write_event("one")
    writer.flush()
    exposed = set()
    for address in [*(b["metrics"] for b in info["bookies"]),
                    *(s["metrics"] for s in info["segment_stores"]),
                    info["controller"]["metrics"]]:
        text = call(f"http://{address}/metrics")[1]
        exposed |= {line.split("{")[0].split(" ")[0] for line in text.splitlines()
                    if line and not line.startswith("#")}
    functions = {"histogram_quantile", "sum", "rate", "max", "by", "le", "instance"}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            names = set(re.findall(r"\b(quire_[a-z0-9_]+)", target["expr"]))
            assert names, target["expr"]
            missing = {n for n in names if n not in exposed and n not in functions}
            assert not missing, f"{panel['title']}: no such metric {missing}"


# --- the page in Chromium -----------------------------------------------------------


def chromium(tmp_path: Path) -> Any:
    """Debian's Chromium under Selenium (a missing browser fails, never skips)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert Path("/usr/bin/chromium").exists() and Path("/usr/bin/chromedriver").exists(), \
        "install Debian's chromium and chromium-driver (scripts/setup --system)"
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager downloads nothing
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-background-networking", "--disable-component-update",
                     "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                     f"--user-data-dir={tmp_path / 'chromium-profile'}",
                     "--window-size=1400,1700"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def requested_urls(driver: Any) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def wait_until(driver: Any, condition: Any, what: str, timeout_s: float = 10.0) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout_s, poll_frequency=0.1).until(condition, what)


def table(driver: Any, table_id: str) -> list[list[str]]:
    """The cells' text of a table's rows, read at once (the page redraws it
    every second)."""
    rows: list[list[str]] = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0] + ' tbody tr'))"
        ".map(r => Array.from(r.cells).map(c => c.textContent))", f"#{table_id}")
    return rows


def bookie_state(driver: Any, bookie_id: str) -> str | None:
    for cells in table(driver, "bookies"):
        if cells and cells[0] == bookie_id:
            return cells[1]
    return None


def test_the_cluster_page_in_chromium(sandbox: SandboxProcess, tmp_path: Path) -> None:
    info = sandbox.info
    page = info["controller"]["page"]
    manager = pravega_client.StreamManager(info["controller"]["uri"])
    assert manager.create_scope("page")
    assert manager.create_stream("page", "clicks", 2)
    driver = chromium(tmp_path)
    try:
        driver.get(page)
        wait_until(driver, lambda d: bookie_state(d, "bookie-3") == "up", "bookies listed")
        assert [row[0] for row in table(driver, "bookies")] == [
            "bookie-1", "bookie-2", "bookie-3"]
        writer = manager.create_writer("page", "clicks")

        def clicks_rate(d: Any) -> bool:
            for n in range(50):
                writer.write_event(f"click-{n}", routing_key=f"user-{n % 5}")
            writer.flush()
            return any(cells[0] == "page/clicks" and float(cells[3] or 0) > 0
                       for cells in table(d, "streams"))

        wait_until(driver, clicks_rate, "a non-zero event rate for page/clicks", 30)

        victim = info["bookies"][1]
        os.kill(victim["pid"], signal.SIGKILL)  # the sandbox restarts it
        started = time.monotonic()
        wait_until(driver, lambda d: bookie_state(d, victim["bookie_id"]) == "down",
                   "the killed bookie shown down")
        assert time.monotonic() - started < 10
        wait_until(driver, lambda d: bookie_state(d, victim["bookie_id"]) == "up",
                   "the bookie shown up again", 60)

        artifacts = Path(os.environ.get("QUIRE_TEST_ARTIFACTS", tmp_path.parent))
        artifacts.mkdir(parents=True, exist_ok=True)
        shot = artifacts / "cluster-page.png"
        assert driver.save_screenshot(str(shot))
        if os.environ.get("QUIRE_UPDATE_SCREENSHOT"):
            shutil.copy(shot, REPO / "docs" / "images" / "cluster-page.png")
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], errors
        network = [u for u in requested_urls(driver) if re.match(r"(https?|wss?|ftp)://", u)]
        assert any(u.startswith(page) for u in network)
        outside = [u for u in network
                   if not re.match(r"(https?|wss?)://(127\.0\.0\.1|localhost)[:/]", u)]
        assert outside == [], outside
    finally:
        driver.quit()
