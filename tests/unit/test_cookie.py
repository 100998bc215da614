"""Cookies (BP-46): checking every copy, reporting directories that lost
theirs, stamping them, and the node's and ``quire cookie fix``'s decisions."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from quire.bookie.cookie import (
    COOKIE_FILE,
    Cookie,
    check_cookies,
    missing_cookies_error,
    stamp_missing_cookies,
)
from quire.bookie.storage import BookieStorage
from quire.errors import CookieMismatchError, CookieMissingError, QuireError
from quire.metadata import MetadataStore, open_store
from quire.node import BookieNode
from quire.node.cookie_fix import fix_missing_cookies
from tests.support.bookie_node import node_at, node_config

ID = "bookie-7"


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    opened = await open_store("memory://")
    yield opened
    await opened.close()


def dirs(tmp_path: Path) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    journal, ledgers = (tmp_path / "journal",), (tmp_path / "l1", tmp_path / "l2")
    for d in (*journal, *ledgers):
        d.mkdir(exist_ok=True)
    return journal, ledgers


async def test_first_boot_writes_every_copy_and_later_checks_pass(
        tmp_path: Path, store: MetadataStore) -> None:
    journal, ledgers = dirs(tmp_path)
    first = await check_cookies(store, ID, journal, ledgers)
    assert first.first_boot and not first.failed
    meta = Cookie.from_bytes((await store.read_cookie(ID)).value, "meta")
    assert meta == first.cookie and meta.bookie_id == ID and meta.instance_id
    for d in (*journal, *ledgers):
        assert Cookie.from_bytes((d / COOKIE_FILE).read_bytes(), str(d)) == meta
    again = await check_cookies(store, ID, journal, ledgers)
    assert again == dataclasses.replace(first, first_boot=False)


async def test_emptied_directory_is_reported_not_raised_and_stamping_repairs_it(
        tmp_path: Path, store: MetadataStore) -> None:
    journal, ledgers = dirs(tmp_path)
    first = await check_cookies(store, ID, journal, ledgers)
    shutil.rmtree(ledgers[1])
    ledgers[1].mkdir()
    (journal[0] / COOKIE_FILE).unlink()
    check = await check_cookies(store, ID, journal, ledgers)
    assert check.failed and not check.first_boot
    assert check.missing_dirs == (journal[0], ledgers[1])
    assert check.cookie == first.cookie  # the metadata store's, not a new one
    assert not (ledgers[1] / COOKIE_FILE).exists()  # checking writes nothing

    error = missing_cookies_error(check)
    assert isinstance(error, CookieMismatchError)
    text = str(error)
    assert str(journal[0]) in text and str(ledgers[1]) in text and str(ledgers[0]) not in text
    assert f"quire cookie fix {ID} --config" in text
    assert "data_integrity_stamp_missing_cookies = true" in text

    stamp_missing_cookies(check)
    after = await check_cookies(store, ID, journal, ledgers)
    assert not after.failed and after.cookie == first.cookie


@pytest.mark.parametrize("problem", ["other-instance", "other-bookie", "no-metadata",
                                     "moved-dirs"])
async def test_every_other_disagreement_raises(tmp_path: Path, store: MetadataStore,
                                               problem: str) -> None:
    journal, ledgers = dirs(tmp_path)
    first = (await check_cookies(store, ID, journal, ledgers)).cookie
    (ledgers[1] / COOKIE_FILE).unlink()  # also missing: listed with the real problem
    bookie_id = ID
    if problem == "other-instance":
        (ledgers[0] / COOKIE_FILE).write_bytes(
            dataclasses.replace(first, instance_id="someone-else").to_bytes())
    elif problem == "other-bookie":
        await store.write_cookie("bookie-8", first.to_bytes(), None)
        bookie_id = "bookie-8"
    elif problem == "no-metadata":
        await store.delete_cookie(ID)
    else:
        ledgers = (ledgers[0], tmp_path / "l3")
        ledgers[1].mkdir()
    with pytest.raises(CookieMismatchError) as caught:
        await check_cookies(store, bookie_id, journal, ledgers)
    assert not isinstance(caught.value, CookieMissingError)
    text = str(caught.value)
    assert text.startswith("cookie check failed: ")
    expected = {"other-instance": "instance someone-else",
                "other-bookie": f"this bookie is configured as {bookie_id}",
                "no-metadata": f"the metadata store has no cookie for {ID}",
                "moved-dirs": "differ from the cookie's"}[problem]
    assert expected in text
    assert f"{ledgers[1]} has no cookie" in text


# --- the node and quire cookie fix -------------------------------------------------


async def test_node_refuses_a_lost_cookie_unless_stamping_is_on(tmp_path: Path) -> None:
    config = node_config(tmp_path)
    async with node_at(config):
        pass
    (tmp_path / "data" / COOKIE_FILE).unlink()
    with pytest.raises(CookieMissingError, match="quire cookie fix b1 --config"):
        await BookieNode(config).start()
    assert not (tmp_path / "data" / COOKIE_FILE).exists()

    stamping = dataclasses.replace(config, data_integrity_stamp_missing_cookies=True)
    async with node_at(stamping):
        assert (tmp_path / "data" / COOKIE_FILE).exists()
    async with node_at(config):  # and now without stamping too
        pass


async def test_fix_stamps_a_stopped_bookie_and_refuses_a_running_one(tmp_path: Path) -> None:
    config = node_config(tmp_path)
    async with node_at(config):
        with pytest.raises(QuireError, match="b1 is running"):
            await fix_missing_cookies(config)
    assert not (await fix_missing_cookies(config)).failed  # nothing to fix
    (tmp_path / "data" / COOKIE_FILE).unlink()

    storage = BookieStorage.open(config.storage)  # as a bookie holds it, unregistered
    try:
        with pytest.raises(QuireError, match="is the bookie running"):
            await fix_missing_cookies(config)
    finally:
        storage.close()
    assert not (tmp_path / "data" / COOKIE_FILE).exists()

    check = await fix_missing_cookies(config)
    assert check.missing_dirs == (tmp_path / "data",)
    assert (tmp_path / "data" / COOKIE_FILE).read_bytes() == check.cookie.to_bytes()
    async with node_at(config):
        pass
