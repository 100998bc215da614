"""Emulate a power loss under a stopped ``file://`` tier-2 root.

``kill -9`` keeps the page cache, so only an emulation shows a missing
fsync.  With ``Tier2Config.power_loss_tracking`` the file driver records
each step after it returns (:mod:`quire.tier2.sync_tracking`: mkdir,
directory fsync, chunk bytes fsynced, link, unlink);
:func:`emulate_tier2_power_loss` then removes what a power cut could have
lost:

* a chunk whose name was not made durable (no fsync of its directory after
  its link, or its directory itself not durable) is deleted;
* a chunk whose bytes were never fsynced is deleted, one with fewer bytes
  fsynced than it has is cut to that length;
* a directory the driver created whose name was not made durable is deleted
  with everything in it;
* temporary files (``.tmp-...``) are deleted.

Files and directories the sidecar does not mention (made while tracking was
off) are left alone and count as durable.  Not emulated: an unlink that a
power cut would undo (deleted chunks stay deleted), and reordering inside
the unsynced bytes (they are lost, never a random subset).  Afterwards the
sidecar is emptied: what is left counts as durable.
"""

from __future__ import annotations

import os
import posixpath
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from quire.tier2.file import TEMPORARY_PREFIX
from quire.tier2.sync_tracking import SIDECAR_NAME


@dataclass
class Tier2PowerLossReport:
    """What :func:`emulate_tier2_power_loss` removed (names relative to the root)."""

    lost_chunks: list[str] = field(default_factory=list)
    truncated_chunks: dict[str, int] = field(default_factory=dict)
    """Chunk -> how many bytes were cut off."""
    lost_directories: list[str] = field(default_factory=list)
    temporaries: list[str] = field(default_factory=list)


def emulate_tier2_power_loss(root: str | os.PathLike[str]) -> Tier2PowerLossReport:
    """Rewind the tier-2 directory ``root`` to what a power cut would have
    left.  Nothing may be writing to it."""
    root = Path(root)
    sidecar = root / SIDECAR_NAME
    report = Tier2PowerLossReport()
    created_at: dict[str, int] = {}
    """Entry (directory or chunk) -> index of the event that named it."""
    directories: set[str] = set()
    last_directory_sync: dict[str, int] = {}
    synced_bytes: dict[str, int] = {}
    lines = sidecar.read_text("ascii").splitlines() if sidecar.exists() else []
    for index, line in enumerate(lines):
        words = line.split()
        if not words:
            continue
        match words:
            case ["mkdir", directory]:
                created_at[directory] = index
                directories.add(directory)
            case ["dirsync", directory]:
                last_directory_sync[directory] = index
            case ["sync", name, length] if length.isdigit():
                synced_bytes[name] = int(length)
            case ["link", name]:
                created_at[name] = index
            case ["unlink", name]:
                created_at.pop(name, None)
                synced_bytes.pop(name, None)
            case _:
                continue  # a torn last line (the writer was killed mid-write)

    def durable(entry: str) -> bool:
        if entry == "." or entry not in created_at:
            return True  # the root, or made while tracking was off
        parent = posixpath.dirname(entry) or "."
        return last_directory_sync.get(parent, -1) > created_at[entry] and durable(parent)

    for name in sorted(created_at.keys() - directories):
        path = root / name
        if not path.is_file():
            continue
        if not durable(name) or name not in synced_bytes:
            path.unlink()
            report.lost_chunks.append(name)
        elif path.stat().st_size > synced_bytes[name]:
            report.truncated_chunks[name] = path.stat().st_size - synced_bytes[name]
            os.truncate(path, synced_bytes[name])
    for directory in sorted(directories):
        path = root / directory
        if path.is_dir() and not durable(directory):
            shutil.rmtree(path)
            report.lost_directories.append(directory)
    for path in sorted(root.rglob(TEMPORARY_PREFIX + "*")):
        path.unlink()
        report.temporaries.append(str(path.relative_to(root)))
    if sidecar.exists():
        sidecar.write_text("", "ascii")
    return report
