"""The bookie's background services: checkpoints (and write-cache
throttling), garbage collection, the disk watch; each on its timer.

Every method runs on the event loop's thread; the slow parts (a
checkpoint, removing dead entry logs) run on threads of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from quire.bookie.config import BookieConfig
from quire.bookie.connection import ConnectionHub
from quire.bookie.group_commit import GroupCommitter
from quire.bookie.status import BookieStatus
from quire.bookie.storage import BookieStorage
from quire.errors import MetadataError, MetadataNotFoundError
from quire.metadata import MetadataStore

log = logging.getLogger("quire.bookie")


class BackgroundServices:
    """Checkpoints, GC and the disk watch of one bookie.  ``on_ledger_dropped``
    is called for each ledger GC deletes (the server forgets its LAC and
    sync cursor); ``on_checkpointed(epoch)`` after each checkpoint that
    succeeded, with the write-cache epoch it wrote out (BP-46's journal
    bypass counts entries synced by it)."""

    def __init__(self, config: BookieConfig, storage: BookieStorage, committer: GroupCommitter,
                 hub: ConnectionHub, status: BookieStatus, store: MetadataStore,
                 on_ledger_dropped: Callable[[int], None],
                 on_checkpointed: Callable[[int], None]) -> None:
        self._config = config
        self._storage = storage
        self._committer = committer
        self._hub = hub
        self._status = status
        self._store = store
        self._on_ledger_dropped = on_ledger_dropped
        self._on_checkpointed = on_checkpointed
        self._tasks: list[asyncio.Task[None]] = []
        self._checkpointing: asyncio.Task[None] | None = None

    def start(self) -> None:
        cfg = self._config
        self._tasks = [
            asyncio.create_task(self._every(cfg.flush_interval_ms, self.checkpoint)),
            asyncio.create_task(self._every(cfg.gc_interval_ms, self.collect_garbage)),
            asyncio.create_task(self._every(cfg.disk_check_interval_ms, self.check_disk)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    async def _every(self, interval_ms: int, action: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000.0)
            try:
                result = action()
                if asyncio.iscoroutine(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("periodic task %s failed", getattr(action, "__name__", action))

    # --- checkpoints ------------------------------------------------------------

    async def checkpoint(self) -> None:
        """Write cache to entry logs, index commit, journal mark (one at a
        time: a call while one is under way waits for that one)."""
        await self._start_checkpoint()

    async def covering(self, epoch: int) -> None:
        """The :class:`~quire.bookie.durability.Checkpoints` seam: return once
        a checkpoint wrote out write-cache ``epoch`` (one under way when
        called may have swapped its cache before, so a second may be run)."""
        while self._storage.checkpointed_epoch < epoch:
            await asyncio.shield(self._start_checkpoint())

    def _start_checkpoint(self) -> asyncio.Task[None]:
        if self._checkpointing is None:
            self._checkpointing = asyncio.get_running_loop().create_task(self._run_checkpoint())
        return self._checkpointing

    async def _run_checkpoint(self) -> None:
        # Every add journaled so far is in the write cache this checkpoint
        # writes to fsynced entry logs: once it succeeds they are durable, and
        # BP-14 sync cursors may move over them (this also bounds a cursor's
        # list of unsynced adds for a VD ledger that is never synced).
        covered = self._storage.journal.append_seq
        try:
            await asyncio.to_thread(self._storage.checkpoint)
        finally:
            self._checkpointing = None
            self._hub.set_throttled(False)
        self._committer.mark_durable(covered)
        self._on_checkpointed(self._storage.checkpointed_epoch)
        if self._storage.checkpoint_due:  # filled up again while this one ran
            self.write_cache_full()

    def write_cache_full(self) -> None:
        """The write cache reached ``write_cache_max_bytes``: checkpoint now,
        or, while one is under way already, stop reading until it is done.
        Adds are refused with TOO_MANY_REQUESTS only beyond
        ``write_cache_reject_ratio``."""
        if self._checkpointing is None:
            self._start_checkpoint()
        else:
            self._hub.set_throttled(True)

    # --- garbage collection -------------------------------------------------------

    async def collect_garbage(self) -> None:
        """Drop ledgers whose metadata is definitely gone; remove dead entry logs.

        A ledger is deleted only after a direct read of its metadata says it
        does not exist: a listing miss or any error keeps it.
        """
        listed = set(await self._store.list_ledgers())
        for ledger_id in self._storage.list_ledgers():
            if ledger_id in listed:
                continue
            try:
                await self._store.read_ledger(ledger_id)
            except MetadataNotFoundError:
                log.info("ledger %d deleted from metadata; dropping it", ledger_id)
                self._storage.delete_ledger(ledger_id)
                self._on_ledger_dropped(ledger_id)
            except MetadataError as e:
                log.warning("gc: cannot tell whether ledger %d exists: %s", ledger_id, e)
        await asyncio.to_thread(self._storage.gc_entry_logs)

    # --- the disk watch -------------------------------------------------------------

    def update_disk_state(self) -> None:
        """Read-only above ``disk_usage_threshold`` of the ledger disk used,
        writable again below ``disk_usage_lwm_threshold``."""
        free, total = self._storage.disk_usage()
        used = 1.0 - (free / total) if total else 0.0
        self._status.disk_used(used, self._config.disk_usage_threshold,
                               self._config.disk_usage_lwm_threshold)

    async def check_disk(self) -> None:
        self.update_disk_state()
        if self._storage.checkpoint_due:
            await self.checkpoint()
