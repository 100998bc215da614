"""``quire cookie fix``: BP-46's cookie repair, by hand, on a stopped bookie.

A directory that lost its cookie (an emptied or replaced disk) keeps a
bookie from starting unless ``data_integrity_stamp_missing_cookies`` is
set.  :func:`fix_missing_cookies` does what that setting makes the bookie do
at start: protect the bookie's open ledgers (BP-46 phase one), then stamp
the missing cookies, so the next start passes the cookie check.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from quire.bookie.config import BookieConfig
from quire.bookie.cookie import CookieCheck, check_cookies, stamp_missing_cookies
from quire.bookie.storage import BookieStorage
from quire.errors import QuireError, StorageError
from quire.metadata import MetadataStore, open_leased_store
from quire.node.integrity import protect_if_needed

log = logging.getLogger("quire.node")


async def fix_missing_cookies(config: BookieConfig) -> CookieCheck:
    """Check the cookies of the (stopped) bookie of ``config``; if
    directories lack theirs, protect its ledgers and stamp them.

    Returns the check as found (``failed`` means its ``missing_dirs`` were
    stamped; a first boot wrote every copy).  Raises :class:`QuireError` if
    the bookie is running (registered, or its storage directories locked),
    and :class:`~quire.errors.CookieMismatchError` for cookies that disagree,
    which stamping cannot settle.
    """
    bookie_id = config.resolved_bookie_id
    store = await open_leased_store(config.metadata_uri, config.registration_lease_ms,
                                    **config.security.zookeeper.store_options())
    try:
        await _refuse_if_registered(store, bookie_id, config.registration_lease_ms)
        storage_config = config.storage
        for d in (*storage_config.journal_dirs, *storage_config.ledger_dirs):
            Path(d).mkdir(parents=True, exist_ok=True)
        check = await check_cookies(store, bookie_id, storage_config.journal_dirs,
                                    storage_config.ledger_dirs)
        if not check.failed:
            return check
        storage = await asyncio.to_thread(_open_stopped_storage, config, bookie_id)
        try:
            # phase one (it also covers an unclean last run: every ledger of
            # the bookie is fenced, the open ones in limbo), then the stamps
            await protect_if_needed(store, storage, bookie_id, cookie_failed=True,
                                    data_integrity_checking=config.data_integrity_checking)
            await asyncio.to_thread(stamp_missing_cookies, check)
        finally:
            await asyncio.to_thread(storage.close)
        log.info("bookie %s: stamped the missing cookies of %s", bookie_id,
                 ", ".join(map(str, check.missing_dirs)))
        return check
    finally:
        await store.close()


async def _refuse_if_registered(store: MetadataStore, bookie_id: str, lease_ms: int) -> None:
    for info in await store.list_bookies():
        if info.bookie_id == bookie_id:
            raise QuireError(
                f"bookie {bookie_id} is running (registered at {info.address}): stop it "
                f"first (a bookie killed just now stays registered for up to {lease_ms} ms)")


def _open_stopped_storage(config: BookieConfig, bookie_id: str) -> BookieStorage:
    try:
        return BookieStorage.open(config.storage)
    except StorageError as e:
        raise QuireError(f"cannot open the storage of bookie {bookie_id}: {e} (is the bookie "
                         f"running? stop it first)") from e
