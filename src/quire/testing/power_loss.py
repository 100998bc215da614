"""Emulate a power loss on a stopped bookie's directories.

``kill -9`` keeps the kernel page cache, so a crash test that only kills the
process never notices a missing ``fsync``.  With
``StorageConfig.power_loss_tracking`` the storage engine records, **after
each fsync returns**, the length of the file that the fsync made durable
(:class:`~quire.bookie.storage.sync_tracker.SyncTracker`).
:func:`emulate_power_loss` then rewinds every tracked file to what a power
cut would have left:

* journal files (preallocated, kind ``journal``): the bytes from the last
  synced length to the end of the file are overwritten with zeros (the file
  keeps its preallocated size, as it would on a real disk);
* entry logs (kind ``entrylog``): truncated to the last synced length;
* files created but never synced: deleted.

Files the sidecar does not mention (created while tracking was off) are left
alone.  The sidecar is rewritten afterwards so that the emulated state counts
as synced, and tracking can continue from there.

Not emulated (documented limits):

* LMDB (the ledger index): the engine always opens it with ``sync=True,
  metasync=True``, so a committed write transaction is durable when
  ``commit()`` returns; LMDB updates pages in place (copy-on-write B+tree with
  two meta pages), so "truncate to the synced length" has no meaning there and
  its files are left untouched.
* Directory entries: a file that was fsynced counts as existing even if its
  directory was never fsynced (the engine fsyncs the directory after creating
  a file, before it reports anything in that file durable).
* Reordering of unsynced writes inside the unsynced region: everything after
  the synced length is lost, never a random subset.

The sidecar format is the storage engine's
(:mod:`quire.bookie.storage.sync_tracker`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from quire.bookie.storage.sync_tracker import KIND_JOURNAL, SIDECAR_NAME

_ZEROS = bytes(1024 * 1024)


@dataclass
class PowerLossReport:
    """What :func:`emulate_power_loss` did (paths are absolute)."""

    zeroed: dict[Path, int] = field(default_factory=dict)
    """Journal files and how many bytes were overwritten with zeros."""
    truncated: dict[Path, int] = field(default_factory=dict)
    """Entry logs and how many bytes were cut off."""
    deleted: list[Path] = field(default_factory=list)
    """Files that were never synced."""


@dataclass
class _Tracked:
    kind: str
    synced: int | None = None
    removed: bool = False


def _read_sidecar(path: Path) -> dict[str, _Tracked]:
    files: dict[str, _Tracked] = {}
    for line in path.read_text("ascii").splitlines():
        parts = line.split()
        if len(parts) != 4:
            continue  # a torn last line (the writer was killed mid-write)
        event, kind, name, length_text = parts
        try:
            length = int(length_text)
        except ValueError:
            continue
        if event == "create":
            files[name] = _Tracked(kind)
        elif event == "sync":
            tracked = files.setdefault(name, _Tracked(kind))
            tracked.synced = max(tracked.synced or 0, length)
            tracked.removed = False
        elif event == "remove":
            files.setdefault(name, _Tracked(kind)).removed = True
    return files


def _zero_from(path: Path, start: int) -> int:
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        if start >= size:
            return 0
        f.seek(start)
        remaining = size - start
        while remaining:
            n = min(remaining, len(_ZEROS))
            f.write(_ZEROS[:n])
            remaining -= n
        return size - start


def emulate_power_loss(dirs: Iterable[str | os.PathLike[str]]) -> PowerLossReport:
    """Rewind every file tracked under ``dirs`` (searched recursively for
    sidecars) to its last fsynced state.  The bookie must be stopped (killed
    or abandoned): nothing may hold the files open for writing."""
    report = PowerLossReport()
    sidecars: set[Path] = set()
    for d in dirs:
        root = Path(d)
        if root.is_dir():
            sidecars.update(p.resolve() for p in root.rglob(SIDECAR_NAME))
    for sidecar in sorted(sidecars):
        directory = sidecar.parent
        survivors: list[tuple[str, str, int]] = []
        for name, tracked in sorted(_read_sidecar(sidecar).items()):
            path = directory / name
            if tracked.removed or not path.exists():
                continue
            if tracked.synced is None:
                path.unlink()
                report.deleted.append(path)
                continue
            if tracked.kind == KIND_JOURNAL:
                zeroed = _zero_from(path, tracked.synced)
                if zeroed:
                    report.zeroed[path] = zeroed
            else:
                size = path.stat().st_size
                if size > tracked.synced:
                    os.truncate(path, tracked.synced)
                    report.truncated[path] = size - tracked.synced
            survivors.append((tracked.kind, name, tracked.synced))
        tmp = sidecar.with_name(SIDECAR_NAME + ".tmp")
        tmp.write_text("".join(f"sync {kind} {name} {length}\n"
                               for kind, name, length in survivors), "ascii")
        os.replace(tmp, sidecar)
    return report
