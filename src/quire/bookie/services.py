"""The bookie's background services: checkpoints (and write-cache
throttling), garbage collection with minor and major compaction, the disk
watch; each on its timer.

Every method runs on the event loop's thread; the slow parts (a
checkpoint, removing dead entry logs, a compaction) run on threads of
their own.

Compaction (:mod:`~quire.bookie.storage.compaction`) rides on GC, as
BookKeeper's does: each GC run, after dropping deleted ledgers and removing
dead entry logs, runs a major compaction (``major_compaction_threshold``)
once ``major_compaction_interval_ms`` passed since the last one, else a
minor one (``minor_compaction_threshold``) once its interval passed.  The
disk watch runs GC with a major compaction at once when the ledger disk is
fuller than ``compaction_disk_usage_threshold`` (at most once per
``gc_interval_ms``), and :meth:`BackgroundServices.gc_now` (``quire bookie
gc --now``) does the same on demand.  One GC run at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quire.bookie.config import BookieConfig
from quire.bookie.connection import ConnectionHub
from quire.bookie.group_commit import GroupCommitter
from quire.bookie.metrics import BookieMetrics
from quire.bookie.status import BookieStatus
from quire.bookie.storage import BookieStorage
from quire.bookie.storage.compaction import CompactionStats
from quire.errors import MetadataError, MetadataNotFoundError
from quire.metadata import MetadataStore

log = logging.getLogger("quire.bookie")

MINOR, MAJOR = "minor", "major"


@dataclass(frozen=True)
class GcReport:
    """What one GC run did."""

    ledgers_dropped: list[int] = field(default_factory=list)
    entry_logs_removed: list[int] = field(default_factory=list)
    compaction: str = ""
    """``"minor"``, ``"major"`` or ``""`` (none was due)."""
    compaction_stats: CompactionStats = field(default_factory=CompactionStats)


class BackgroundServices:
    """Checkpoints, GC and the disk watch of one bookie.  ``on_ledger_dropped``
    is called for each ledger GC deletes (the server forgets its LAC and
    sync cursor); ``on_checkpointed(epoch)`` after each checkpoint that
    succeeded, with the write-cache epoch it wrote out (BP-46's journal
    bypass counts entries synced by it)."""

    def __init__(self, config: BookieConfig, storage: BookieStorage, committer: GroupCommitter,
                 hub: ConnectionHub, status: BookieStatus, store: MetadataStore,
                 on_ledger_dropped: Callable[[int], None],
                 on_checkpointed: Callable[[int], None],
                 metrics: BookieMetrics | None = None) -> None:
        self._config = config
        self._storage = storage
        self._committer = committer
        self._hub = hub
        self._status = status
        self._store = store
        self._on_ledger_dropped = on_ledger_dropped
        self._on_checkpointed = on_checkpointed
        self._metrics = metrics
        self._tasks: list[asyncio.Task[Any]] = []
        self._checkpointing: asyncio.Task[None] | None = None
        self._gc_lock = asyncio.Lock()
        now = time.monotonic()
        self._last_compaction = {MINOR: now, MAJOR: now}
        self._compactions = {MINOR: 0, MAJOR: 0}
        self._last_compaction_wall_ms = {MINOR: 0, MAJOR: 0}
        self._forced = False
        self._last_disk_gc = float("-inf")
        self._disk_gc: asyncio.Task[GcReport] | None = None

    def start(self) -> None:
        cfg = self._config
        self._tasks = [
            asyncio.create_task(self._every(cfg.flush_interval_ms, self.checkpoint)),
            asyncio.create_task(self._every(cfg.gc_interval_ms, self.collect_garbage)),
            asyncio.create_task(self._every(cfg.disk_check_interval_ms, self.check_disk)),
        ]

    async def stop(self) -> None:
        if self._disk_gc is not None:
            self._tasks.append(self._disk_gc)
            self._disk_gc = None
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
        """The GC timer's run: drop deleted ledgers, remove dead entry logs,
        and compact if a compaction is due (see the module docstring)."""
        await self.run_gc()

    async def gc_now(self) -> GcReport:
        """GC and a major compaction now, whatever the intervals
        (``quire bookie gc --now``)."""
        self._forced = True
        try:
            return await self.run_gc(compaction=MAJOR)
        finally:
            self._forced = False

    def gc_details(self) -> dict[str, Any]:
        """What GC is doing and did (BookKeeper's ``gc_details`` shape; times
        are wall-clock ms, 0: never since the bookie started)."""
        running = self._gc_lock.locked()
        return {"forceCompacting": self._forced, "gcRunning": running,
                "majorCompactionCounter": self._compactions[MAJOR],
                "minorCompactionCounter": self._compactions[MINOR],
                "lastMajorCompactionTime": self._last_compaction_wall_ms[MAJOR],
                "lastMinorCompactionTime": self._last_compaction_wall_ms[MINOR]}

    async def run_gc(self, compaction: str | None = None) -> GcReport:
        """Drop ledgers whose metadata is definitely gone; remove dead entry
        logs; then run ``compaction`` (``"minor"`` or ``"major"``), or, if
        None, the one that is due, if any.

        A ledger is deleted only after a direct read of its metadata says it
        does not exist: a listing miss or any error keeps it.
        """
        async with self._gc_lock:
            dropped = []
            listed = set(await self._store.list_ledgers())
            for ledger_id in self._storage.list_ledgers():
                if ledger_id in listed:
                    continue
                try:
                    await self._store.read_ledger(ledger_id)
                except MetadataNotFoundError:
                    dropped.append(ledger_id)
                except MetadataError as e:
                    log.warning("gc: cannot tell whether ledger %d exists: %s", ledger_id, e)
            if dropped:
                log.info("dropping %d ledgers deleted from metadata: %s%s", len(dropped),
                         dropped[:20], " ..." if len(dropped) > 20 else "")
                self._storage.delete_ledgers(dropped)  # one pass over the caches
                for ledger_id in dropped:
                    self._on_ledger_dropped(ledger_id)
            removed = await asyncio.to_thread(self._storage.gc_entry_logs)
            if self._metrics is not None:
                self._metrics.entry_logs_removed.inc(len(removed))
            kind = compaction if compaction is not None else self._compaction_due()
            stats = CompactionStats()
            if kind:
                stats = await self._compact(kind)
            return GcReport(dropped, removed, kind, stats)

    def _compaction_due(self) -> str:
        cfg, now = self._config, time.monotonic()
        for kind, threshold, interval_ms in (
                (MAJOR, cfg.major_compaction_threshold, cfg.major_compaction_interval_ms),
                (MINOR, cfg.minor_compaction_threshold, cfg.minor_compaction_interval_ms)):
            if threshold > 0 and interval_ms > 0 \
                    and now - self._last_compaction[kind] >= interval_ms / 1000.0:
                return kind
        return ""

    async def _compact(self, kind: str) -> CompactionStats:
        cfg = self._config
        threshold = (cfg.major_compaction_threshold if kind == MAJOR
                     else cfg.minor_compaction_threshold)
        stats = await asyncio.to_thread(self._storage.compact_entry_logs, threshold)
        now = time.monotonic()
        self._last_compaction[kind] = now
        self._compactions[kind] += 1
        self._last_compaction_wall_ms[kind] = int(time.time() * 1000)
        if kind == MAJOR:  # a major compaction does a minor one's work too
            self._last_compaction[MINOR] = now
        if stats.logs_compacted or stats.logs_failed:
            log.info("%s compaction: %d entry logs compacted (%d failed), %d entries "
                     "(%d bytes) moved, %d bytes reclaimed in %.3fs", kind,
                     stats.logs_compacted, stats.logs_failed, stats.entries_moved,
                     stats.bytes_moved, stats.bytes_reclaimed, stats.duration_s)
        if self._metrics is not None:
            self._metrics.count_compaction(kind, stats)
        return stats

    # --- the disk watch -------------------------------------------------------------

    def update_disk_state(self) -> float:
        """Read-only above ``disk_usage_threshold`` of the ledger disk used,
        writable again below ``disk_usage_lwm_threshold``.  Returns the
        used fraction."""
        free, total = self._storage.disk_usage()
        used = 1.0 - (free / total) if total else 0.0
        self._status.disk_used(used, self._config.disk_usage_threshold,
                               self._config.disk_usage_lwm_threshold)
        return used

    def _gc_if_disk_full(self, used: float) -> None:
        """Run GC with a major compaction in the background when the disk is
        fuller than ``compaction_disk_usage_threshold`` (once per
        ``gc_interval_ms`` at most, never two at once)."""
        cfg = self._config
        threshold = cfg.compaction_disk_usage_threshold
        if threshold <= 0 or used <= threshold or self._disk_gc is not None:
            return
        now = time.monotonic()
        if now - self._last_disk_gc < cfg.gc_interval_ms / 1000.0:
            return
        self._last_disk_gc = now
        log.info("ledger disk %.0f%% used: GC and major compaction now", 100 * used)
        task = asyncio.get_running_loop().create_task(self.run_gc(compaction=MAJOR))
        self._disk_gc = task
        task.add_done_callback(self._disk_gc_done)

    def _disk_gc_done(self, task: asyncio.Task[GcReport]) -> None:
        self._disk_gc = None
        if not task.cancelled() and task.exception() is not None:
            log.error("disk-triggered GC failed", exc_info=task.exception())

    async def check_disk(self) -> None:
        self._gc_if_disk_full(self.update_disk_state())
        if self._storage.checkpoint_due:
            await self.checkpoint()
