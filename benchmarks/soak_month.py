"""Runs for a month: the whole sandbox under a steady, bounded load, and a slope test.

Three bookies (GC every 5 s, minor and major compactions every 10 and 30 s,
entry logs of 8 MiB: :data:`ENTRY_LOG_BYTES`), two segment stores flushing
to ``file://`` tier-2 (small flush thresholds, a small read index, a tier-1
ceiling) and the controller (retention every 2 s) run as the sandbox runs
them; :mod:`benchmarks._soak_load` drives them with a steady mixed load
whose live data is bounded (size retention on every stream, streams deleted
as others are created, a table updated, streams scaled and truncated, reader
groups coming and going, transactions). Every ``--sample-s`` (60) it samples
the resident memory and open file descriptors of each process, the bytes on
disk of each bookie and of tier-2, the tier-1 backlog and the table
segments' bytes (the segment stores' ``/metrics``).

**The slope test** (:func:`verdicts`): for each series, a least-squares
line through the samples of the last half of the run; a series *still
grows* when that line rises, over the last half, by more than
``max(ABSOLUTE[kind], 25% of the series' level)``.  Warming up (the first
half) is allowed; growing at the end is not.  The run fails (exit 1) when
any series still grows.  ``--plant-leak`` starts the second segment store
with :mod:`quire.testing.planted_leak` (a list that grows with every
append), which the test must catch.

Prints the samples as a table and the verdicts, and draws the series as a
PNG (matplotlib): ``--out PREFIX`` writes ``PREFIX.png`` and
``PREFIX.json``.

    .venv/bin/python benchmarks/soak_month.py --minutes 60 [--out soak]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._soak_load import LoadShape, SoakLoad
from quire.sandbox import (
    BookieProcess,
    ControllerProcess,
    SegmentStoreProcess,
    ServiceProcess,
    free_port,
    sqlite_uri,
    start_all,
    stop_all,
    tier1_quorums,
)
from quire.streams import ControllerClient, RemoteSegmentStore, controller_resolver

REPO = Path(__file__).resolve().parent.parent
LEAK_SITE = REPO / "tests" / "support" / "planted_leak"
MIB = 1 << 20
ABSOLUTE = {"rss": 24 * MIB, "fds": 16, "disk": 64 * MIB, "tier2": 64 * MIB,
            "tier1_backlog": 32 * MIB, "table_bytes": 2 * MIB}
"""What a series may still rise by over the last half whatever its level."""
RELATIVE = 0.25
"""... or this fraction of its level over the last half, whichever is more."""
MIN_SAMPLES = 4
ENTRY_LOG_BYTES = 8 * MIB
"""The bookies' entry log size: GC and compaction reclaim only entry logs
rolled over, so a bookie's disk holds its live entries plus up to one entry
log (``entry_log_max_bytes``, 512 MiB by default) of entries already
deleted; a small one shows the bound within minutes."""


@dataclass(frozen=True)
class Verdict:
    series: str
    level: float
    rise: float
    """What the last half's least-squares line rises by over the last half."""
    limit: float
    grows: bool


def kind_of(series: str) -> str:
    return series.split(":", 1)[0]


def verdicts(times: list[float], samples: dict[str, list[float]]) -> list[Verdict]:
    """The slope test of each series (see the module docstring)."""
    end = times[-1]
    start = end - (end - times[0]) / 2
    last = [i for i, t in enumerate(times) if t >= start]
    out = []
    for series, values in sorted(samples.items()):
        xs = [times[i] for i in last]
        ys = [values[i] for i in last]
        level = sum(ys) / len(ys) if ys else 0.0
        if len(xs) < MIN_SAMPLES:
            out.append(Verdict(series, level, 0.0, 0.0, False))
            continue
        mx = sum(xs) / len(xs)
        var = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - level) for x, y in zip(xs, ys, strict=True)) / var
        rise = slope * (xs[-1] - xs[0])
        limit = max(ABSOLUTE[kind_of(series)], RELATIVE * level)
        out.append(Verdict(series, level, rise, limit, rise > limit))
    return out


# --- the system and its samples -------------------------------------------------------


@dataclass
class System:
    bookies: list[BookieProcess]
    stores: list[SegmentStoreProcess]
    controller: ControllerProcess
    tier2: Path

    @property
    def processes(self) -> list[ServiceProcess]:
        return [*self.bookies, *self.stores, self.controller]


@contextlib.contextmanager
def system(root: Path, plant_leak: bool) -> Iterator[System]:
    metadata_uri = sqlite_uri(root / "metadata.db")
    bookies = [BookieProcess(root, metadata_uri, f"bookie-{i}", port=free_port(),
                             metrics_port=0, gc_interval_ms=5_000,
                             minor_compaction_interval_ms=10_000,
                             major_compaction_interval_ms=30_000,
                             entry_log_max_bytes=ENTRY_LOG_BYTES) for i in (1, 2, 3)]
    tier2 = root / "tier2"
    stores = [SegmentStoreProcess(root, metadata_uri, f"segmentstore-{i}", port=free_port(),
                                  metrics_port=0, tier2_uri=tier2.resolve().as_uri(),
                                  container_count=4, rebalance_interval_ms=200,
                                  tier2_flush_threshold_bytes=256 << 10,
                                  tier2_flush_threshold_ms=2_000, tier2_flush_interval_ms=500,
                                  read_index_budget_bytes=16 * MIB,
                                  tier1_ceiling_bytes=256 * MIB, **tier1_quorums(3))
              for i in (1, 2)]
    controller = ControllerProcess(root, metadata_uri, metrics_port=0,
                                   retention_interval_ms=2_000)
    found = System(bookies, stores, controller, tier2)
    for process in found.processes:
        process.ends_with_parent = True
    try:
        start_all(bookies)
        stores[0].start()
        with leak_planted(plant_leak):
            stores[1].start()
        controller.start()
        yield found
    finally:
        controller.stop()
        stop_all(stores)
        stop_all(bookies)


@contextlib.contextmanager
def leak_planted(plant: bool) -> Iterator[None]:
    """Processes started inside get the planted leak (if ``plant``)."""
    if not plant:
        yield
        return
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "QUIRE_PLANTED_LEAK")}
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(LEAK_SITE), saved["PYTHONPATH"]) if p)
    os.environ["QUIRE_PLANTED_LEAK"] = "1"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _rss(pid: int) -> float:
    found = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return float(found.group(1)) * 1024 if found else 0.0


def _disk(path: Path) -> float:
    total = 0
    for directory, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(Path(directory, name)).st_blocks * 512
    return float(total)


def _metric(address: str, name: str) -> float:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(
        rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))


def sample(found: System) -> dict[str, float]:
    """One sample of every series (see the module docstring)."""
    out: dict[str, float] = {}
    for process in found.processes:
        assert process.proc is not None
        pid = process.proc.pid
        out[f"rss:{process.name}"] = _rss(pid)
        out[f"fds:{process.name}"] = float(len(os.listdir(f"/proc/{pid}/fd")))
    for bookie in found.bookies:
        out[f"disk:{bookie.name}"] = _disk(bookie.data_dir)
    out["tier2:file"] = _disk(found.tier2)
    addresses = [s.metrics_address for s in found.stores if s.metrics_address]
    out["tier1_backlog:all"] = sum(_metric(a, "quire_segmentstore_tier1_backlog_bytes")
                                   for a in addresses)
    out["table_bytes:all"] = sum(_metric(a, "quire_segmentstore_table_bytes")
                                 for a in addresses)
    return out


# --- the run ----------------------------------------------------------------------------


async def soak(found: System, seconds: float, sample_s: float, shape: LoadShape
               ) -> tuple[list[float], dict[str, list[float]], dict[str, Any]]:
    controller = ControllerClient(found.controller.uri)
    segments = RemoteSegmentStore(controller_resolver(controller))
    load = SoakLoad(controller, segments, shape)
    running = asyncio.ensure_future(load.run())
    times: list[float] = []
    samples: dict[str, list[float]] = {}
    started = time.monotonic()
    try:
        while True:
            now = time.monotonic() - started
            for series, value in (await asyncio.to_thread(sample, found)).items():
                samples.setdefault(series, []).append(value)
            times.append(now)
            print(f"sample {len(times)} at {now:.0f} s: {load.counts.events:,} events",
                  file=sys.stderr, flush=True)
            if now >= seconds or running.done():
                break
            await asyncio.sleep(max(0.0, sample_s - (time.monotonic() - started - now)))
    finally:
        load.stop()
        await asyncio.gather(running, return_exceptions=True)
        await segments.close()
        await controller.close()
    if running.done() and not running.cancelled() and running.exception() is not None:
        raise running.exception()  # type: ignore[misc]
    counts = asdict(load.counts)
    counts["errors"] = dict(load.counts.errors)
    return times, samples, counts


def table(times: list[float], samples: dict[str, list[float]]) -> str:
    """The samples, one row per sample (MiB for bytes)."""
    names = sorted(samples)
    head = ["t_s", *names]
    rows = [head]
    for i, t in enumerate(times):
        row = [f"{t:.0f}"]
        for name in names:
            value = samples[name][i]
            row.append(f"{value:.0f}" if kind_of(name) == "fds" else f"{value / MIB:.1f}")
        rows.append(row)
    widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True))
                     for r in rows)


def draw(times: list[float], samples: dict[str, list[float]], path: Path) -> None:
    """The series as a PNG, one panel per kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({kind_of(s) for s in samples})
    figure, axes = plt.subplots(len(kinds), 1, figsize=(10, 3 * len(kinds)), squeeze=False)
    minutes = [t / 60 for t in times]
    for axis, kind in zip(axes[:, 0], kinds, strict=True):
        for series, values in sorted(samples.items()):
            if kind_of(series) == kind:
                scale = 1 if kind == "fds" else MIB
                axis.plot(minutes, [v / scale for v in values], label=series.split(":", 1)[1])
        axis.set_title(kind + ("" if kind == "fds" else " (MiB)"))
        axis.set_xlabel("minutes")
        axis.legend(fontsize="small", loc="upper left")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--sample-s", type=float, default=60.0)
    parser.add_argument("--dir", type=Path, default=None, help="state (default: a temp dir)")
    parser.add_argument("--out", default="soak_month", help="PREFIX of PREFIX.png/.json")
    parser.add_argument("--plant-leak", action="store_true",
                        help="the second segment store leaks with every append")
    parser.add_argument("--rotate-s", type=float, default=LoadShape.rotate_s)
    args = parser.parse_args(argv)
    shape = LoadShape(rotate_s=args.rotate_s)
    with contextlib.ExitStack() as stack:
        root = args.dir or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="quire-soak-month-")))
        found = stack.enter_context(system(root, args.plant_leak))
        times, samples, counts = asyncio.run(soak(found, args.minutes * 60, args.sample_s,
                                                  shape))
    judged = verdicts(times, samples)
    print(table(times, samples))
    print()
    for v in judged:
        scale = 1 if kind_of(v.series) == "fds" else MIB
        unit = "" if scale == 1 else " MiB"
        print(f"{'GROWS' if v.grows else 'ok':5}  {v.series}: level {v.level / scale:.1f}{unit}, "
              f"last half rises {v.rise / scale:.1f}{unit} (limit {v.limit / scale:.1f}{unit})")
    print(f"load: {json.dumps(counts, sort_keys=True)}")
    draw(times, samples, Path(f"{args.out}.png"))
    Path(f"{args.out}.json").write_text(json.dumps({
        "times": times, "samples": samples, "load": counts,
        "verdicts": [asdict(v) for v in judged]}, indent=1))
    print(f"wrote {args.out}.png and {args.out}.json")
    return 1 if any(v.grows for v in judged) else 0


if __name__ == "__main__":
    raise SystemExit(main())
