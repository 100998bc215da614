"""GC scheduling (minor and major compaction, the disk trigger), the admin
endpoint beside /metrics, and ``quire bookie gc --now`` against it."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from quire.bookie import services as services_module
from quire.bookie.admin import request_gc, serve_admin
from quire.bookie.config import BookieConfig
from quire.bookie.metrics import BookieMetrics
from quire.bookie.services import BackgroundServices
from quire.bookie.storage.compaction import CompactionStats
from quire.cli.main import cli
from quire.errors import AdminRequestError, ConfigError
from quire.metadata import BookieInfo, open_store
from quire.types import BookieState


class FakeStorage:
    def __init__(self) -> None:
        self.thresholds: list[float] = []
        self.used = 0.5

    def list_ledgers(self) -> list[int]:
        return []

    def gc_entry_logs(self) -> list[int]:
        return [7]

    def compact_entry_logs(self, threshold: float) -> CompactionStats:
        self.thresholds.append(threshold)
        return CompactionStats(logs_compacted=1, entries_moved=10, bytes_moved=1000,
                               bytes_reclaimed=5000)

    def disk_usage(self) -> tuple[int, int]:
        return int((1 - self.used) * 1000), 1000

    checkpoint_due = False


class FakeStore:
    async def list_ledgers(self) -> list[int]:
        return []


class FakeStatus:
    def disk_used(self, *args: object) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(services_module.time, "monotonic", clock)
    return clock


def make_services(storage: FakeStorage, metrics: BookieMetrics | None = None,
                  **settings: Any) -> BackgroundServices:
    config = BookieConfig(**{"minor_compaction_interval_ms": 10_000,
                             "major_compaction_interval_ms": 100_000, **settings})
    return BackgroundServices(config, storage, None, None, FakeStatus(),  # type: ignore[arg-type]
                              FakeStore(), lambda _lid: None,  # type: ignore[arg-type]
                              lambda _epoch: None, metrics)


async def test_minor_and_major_compaction_run_when_due(clock: Clock) -> None:
    storage = FakeStorage()
    metrics = BookieMetrics()
    services = make_services(storage, metrics)
    assert (await services.run_gc()).compaction == ""  # nothing due yet
    clock.now += 10
    report = await services.run_gc()
    assert report.compaction == "minor" and report.entry_logs_removed == [7]
    assert (await services.run_gc()).compaction == ""  # just ran
    clock.now += 95  # major due (and minor: the major one covers it)
    assert (await services.run_gc()).compaction == "major"
    assert (await services.run_gc()).compaction == ""
    assert storage.thresholds == [0.2, 0.8]
    assert metrics.registry.get_sample_value(
        "quire_bookie_compactions_total", {"kind": "minor"}) == 1
    assert metrics.registry.get_sample_value(
        "quire_bookie_compaction_entries_moved_total") == 20
    assert metrics.registry.get_sample_value(
        "quire_bookie_compaction_bytes_reclaimed_total") == 10000
    assert metrics.registry.get_sample_value("quire_bookie_gc_entry_logs_removed_total") == 5


async def test_intervals_or_thresholds_of_zero_turn_compaction_off(clock: Clock) -> None:
    storage = FakeStorage()
    services = make_services(storage, minor_compaction_interval_ms=0,
                             major_compaction_threshold=0.0)
    clock.now += 1_000_000
    assert (await services.run_gc()).compaction == ""
    assert (await services.gc_now()).compaction == "major"  # on demand, whatever the timers
    assert storage.thresholds == [0.0]  # (and a threshold of 0 compacts nothing)


async def test_a_full_disk_runs_gc_with_a_major_compaction_once_per_gc_interval(
        clock: Clock) -> None:
    storage = FakeStorage()
    services = make_services(storage, gc_interval_ms=60_000,
                             compaction_disk_usage_threshold=0.85)
    await services.check_disk()
    assert services._disk_gc is None  # 50% used
    storage.used = 0.9
    await services.check_disk()
    task = services._disk_gc
    assert task is not None
    report = await task
    assert report.compaction == "major" and storage.thresholds == [0.8]
    await services.check_disk()
    assert services._disk_gc is None  # not again within gc_interval_ms
    clock.now += 61
    await services.check_disk()
    assert services._disk_gc is not None
    await services.stop()


def test_compaction_settings_are_checked() -> None:
    with pytest.raises(ConfigError):
        BookieConfig(minor_compaction_threshold=1.5)
    with pytest.raises(ConfigError):
        BookieConfig(major_compaction_interval_ms=-1)
    with pytest.raises(ConfigError, match="disk_usage_lwm_threshold"):
        BookieConfig(disk_usage_threshold=0.5, disk_usage_lwm_threshold=0.9)


class FakeActions:
    def __init__(self) -> None:
        self.calls = 0
        self.error: Exception | None = None

    async def gc_now(self) -> dict[str, Any]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return {"ledgers_dropped": [3], "entry_logs_removed": [], "compaction": "major",
                "compaction_stats": {"logs_compacted": 2, "entries_moved": 9,
                                     "bytes_reclaimed": 4096}}


@pytest.fixture
async def admin() -> AsyncIterator[tuple[str, FakeActions]]:
    actions = FakeActions()
    metrics = BookieMetrics()
    server = await serve_admin(metrics.registry, actions, "127.0.0.1", 0)
    yield f"127.0.0.1:{server.port}", actions
    await server.close()


async def test_admin_gc_is_a_post_beside_the_metrics(admin: tuple[str, FakeActions]) -> None:
    address, actions = admin
    report = await asyncio.to_thread(request_gc, address, timeout_s=10)
    assert report["compaction_stats"]["logs_compacted"] == 2
    assert actions.calls == 1
    with pytest.raises(urllib.error.HTTPError) as refused:
        await asyncio.to_thread(urllib.request.urlopen, f"http://{address}/admin/gc",
                                timeout=10)
    assert refused.value.code == 405 and actions.calls == 1
    answer = await asyncio.to_thread(urllib.request.urlopen, f"http://{address}/metrics",
                                     timeout=10)
    text = answer.read().decode()
    assert "quire_bookie_compactions_total" in text or "quire_bookie_compactions" in text
    actions.error = RuntimeError("disk on fire")
    with pytest.raises(AdminRequestError, match="disk on fire"):
        await asyncio.to_thread(request_gc, address, timeout_s=10)


def test_admin_request_to_nothing_is_an_admin_error() -> None:
    with pytest.raises(AdminRequestError):
        request_gc("127.0.0.1:1", timeout_s=5)


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, ["bookie", "gc", *args], catch_exceptions=False)


async def test_cli_gc_now_asks_every_registered_bookie(
        tmp_path: Path, admin: tuple[str, FakeActions]) -> None:
    metadata = f"sqlite:///{tmp_path / 'meta.db'}"
    assert (await asyncio.to_thread(run, "--metadata", metadata)).exit_code == 2  # no --now
    result = await asyncio.to_thread(run, "--now", "--metadata", metadata)
    assert result.exit_code == 1 and f"error: no Quire metadata at {metadata}" in result.stderr
    address, _actions = admin
    store = await open_store(metadata)  # (registrations last while it is open)
    try:
        result = await asyncio.to_thread(run, "--now", "--metadata", metadata)
        assert result.exit_code == 1 and "error: no bookie is registered" in result.stderr
        await store.register_bookie(BookieInfo("b1", "127.0.0.1:1", BookieState.WRITABLE,
                                               address))
        result = await asyncio.to_thread(run, "--now", "--metadata", metadata, "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["b1"]["compaction"] == "major"
        result = await asyncio.to_thread(run, "--now", "--metadata", metadata)
        assert "b1: 1 ledgers dropped, 0 dead entry logs removed, 2 entry logs compacted" \
            in result.stdout
        result = await asyncio.to_thread(run, "--now", "--metadata", metadata,
                                         "--bookie", "nope", "--json")
        assert result.exit_code == 1 and "nope" in json.loads(result.stdout)["error"]
        await store.register_bookie(BookieInfo("b2", "127.0.0.1:2", BookieState.WRITABLE))
        result = await asyncio.to_thread(run, "--now", "--metadata", metadata, "--json")
        assert result.exit_code == 1  # b2 has no metrics endpoint
        reports = json.loads(result.stdout)
        assert "metrics_port" in reports["b2"]["error"]
        assert reports["b1"]["compaction"] == "major"
    finally:
        await store.close()
