"""``quire cookie list|get|delete|fix`` through click's runner, on SQLite
metadata (the fix of a real bookie process is in
tests/integration/test_bookie_server.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from quire.bookie.cookie import Cookie, check_cookies
from quire.cli.main import cli
from quire.metadata import BookieInfo, open_store
from quire.types import BookieState


@pytest.fixture
def metadata(tmp_path: Path) -> str:
    """A metadata store as a cluster's first bookie leaves it (created: the
    commands under test only read or change it)."""
    uri = f"sqlite:///{tmp_path / 'meta.db'}"

    async def create() -> None:
        await (await open_store(uri)).close()

    asyncio.run(create())
    return uri


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def make_cookie(metadata: str, root: Path, bookie_id: str) -> Cookie:
    async def go() -> Cookie:
        store = await open_store(metadata)
        try:
            data = root / bookie_id
            data.mkdir(parents=True)
            return (await check_cookies(store, bookie_id, (data,), (data,))).cookie
        finally:
            await store.close()

    return asyncio.run(go())


def test_list_and_get_show_every_cookie(tmp_path: Path, metadata: str) -> None:
    assert json.loads(run("cookie", "list", "--metadata", metadata, "--json").output) == []
    one = make_cookie(metadata, tmp_path, "bookie-1")
    two = make_cookie(metadata, tmp_path, "bookie-2")
    listed = json.loads(run("cookie", "list", "--metadata", metadata, "--json").output)
    assert [(r["bookie_id"], r["instance_id"], r["version"]) for r in listed] == [
        ("bookie-1", one.instance_id, 0), ("bookie-2", two.instance_id, 0)]
    table = run("cookie", "list", "--metadata", metadata).output
    assert "bookie-1" in table and two.instance_id in table

    got = json.loads(run("cookie", "get", "bookie-2", "--metadata", metadata, "--json").output)
    assert got == {"bookie_id": "bookie-2", "instance_id": two.instance_id,
                   "journal_dirs": [str(tmp_path / "bookie-2")],
                   "ledger_dirs": [str(tmp_path / "bookie-2")], "version": 0}
    assert two.instance_id in run("cookie", "get", "bookie-2", "--metadata", metadata).output
    missing = run("cookie", "get", "bookie-3", "--metadata", metadata)
    assert missing.exit_code == 1 and "bookie-3" in missing.output


def test_delete_needs_yes_and_says_what_it_means(tmp_path: Path, metadata: str) -> None:
    make_cookie(metadata, tmp_path, "bookie-1")
    refused = run("cookie", "delete", "bookie-1", "--metadata", metadata)
    assert refused.exit_code == 2
    assert "taken out of service for good" in refused.output and "--yes" in refused.output
    assert len(json.loads(run("cookie", "list", "--metadata", metadata, "--json").output)) == 1

    deleted = run("cookie", "delete", "bookie-1", "--yes", "--metadata", metadata, "--json")
    assert json.loads(deleted.output) == {"bookie_id": "bookie-1", "deleted": True}
    assert json.loads(run("cookie", "list", "--metadata", metadata, "--json").output) == []
    again = run("cookie", "delete", "bookie-1", "--yes", "--metadata", metadata)
    assert again.exit_code == 1


def test_fix_takes_the_bookie_config_and_checks_its_id(tmp_path: Path, metadata: str) -> None:
    config = tmp_path / "bookie.toml"
    config.write_text(f'bookie_id = "bookie-1"\nmetadata_uri = "{metadata}"\n'
                      f'journal_dirs = ["{tmp_path / "data"}"]\n'
                      f'ledger_dirs = ["{tmp_path / "data"}"]\n')
    wrong = run("cookie", "fix", "bookie-2", "--config", str(config))
    assert wrong.exit_code == 2 and "the config is of bookie bookie-1" in wrong.output
    first = json.loads(run("cookie", "fix", "bookie-1", "--config", str(config),
                           "--json").output)
    assert first["first_boot"] and first["stamped_dirs"] == []
    (tmp_path / "data" / "COOKIE").unlink()
    fixed = run("cookie", "fix", "bookie-1", "--config", str(config), "--json")
    assert json.loads(fixed.output) == {"bookie_id": "bookie-1",
                                        "instance_id": first["instance_id"],
                                        "stamped_dirs": [str(tmp_path / "data")],
                                        "first_boot": False}
    assert "nothing to fix" in run("cookie", "fix", "bookie-1", "--config", str(config)).output


async def test_delete_refuses_a_running_bookie(tmp_path: Path, metadata: str) -> None:
    await asyncio.to_thread(make_cookie, metadata, tmp_path, "bookie-1")
    store = await open_store(metadata)
    try:
        await store.register_bookie(BookieInfo("bookie-1", "127.0.0.1:1", BookieState.WRITABLE))
        refused = await asyncio.to_thread(run, "cookie", "delete", "bookie-1", "--yes",
                                          "--metadata", metadata)
        assert refused.exit_code == 1 and "bookie-1 is running" in refused.output
        assert (await store.read_cookie("bookie-1")).version == 0
    finally:
        await store.close()
