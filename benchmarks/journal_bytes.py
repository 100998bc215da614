"""BP-46: disk bytes per payload byte and add rate, journal on against journal off.

In one run, a 3-bookie sandbox on the embedded (SQLite) metadata store, each
bookie its own process, is started twice in each of ``--rounds`` rounds:
once with the journal on (the default settings) and once with
``journal_write_data = false`` and ``data_integrity_checking = true`` (BP-46's
protected mode).  Against each, ``quire bench write``'s load generator
(``quire.bench.bench_write``, the client's async add path, on uvloop) adds
``--entries`` PD_JOURNAL entries of ``--entry-bytes`` at E=3 W=3 A=2 with
``--outstanding`` in flight, then closes its ledgers and every bookie stops
cleanly (SIGTERM: final checkpoint, then exit).

Disk bytes are each bookie's ``/proc/<pid>/io`` ``write_bytes`` (bytes it
sent to the block layer: buffered, direct and RWF_DSYNC writes alike), from
just before the first add to the bookie's exit (read while the exited bookie
is not yet reaped), so the entry logs and index of the final checkpoint are
counted; summed over the bookies and divided by the acknowledged payload
bytes times the write quorum (3).  Where they went, as a cross-check: the
journal's own byte counter (``quire_bookie_journal_written_bytes_total``,
record bytes without page padding; scraped before the stop), the growth of
the entry-log and index directories' file sizes (the index's is a lower
bound: LMDB rewrites pages in place), the bookie's log file, and the rest
unattributed: with the journal on, mostly each journal group's RWF_DSYNC
write re-dirtying the partly written page it starts in (the kernel counts
the whole folio, several pages on ext4 with large folios: 14-17 KiB per
fsync on this project's VM, kernel 6.18) and the zeros it pads its last
page with; LMDB page rewrites; the metadata store's SQLite
file.

Prints, per mode, the run with the median entries/s (p50/p99 from that run)
and its bytes per byte; the journal-off / journal-on ratios are the medians
of the rounds' ratios.  Goals (issue 22): journal off at most 1.1 bytes per
payload byte per replica (about 2 with the journal on), and journal-off
entries/s at least journal-on's; each is printed PASS or FAIL (the exit code
is 0 either way: the script reports, it does not judge).  ``--json`` prints
one JSON object instead.  Progress goes to stderr.

    .venv/bin/python benchmarks/journal_bytes.py [--entries 200000] [--rounds 1]
        [--entry-bytes 1024] [--outstanding 256] [--ledgers 1] [--tmpdir DIR]
        [--block-device NAME] [--json] [--quiet]

Each mode's directory is removed once it is measured (with the journal on a
mode leaves 1-2 GB).  ``--block-device`` (e.g. ``loop0`` for a loop-mounted
file system given as ``--tmpdir``) also counts what that device wrote, file
system metadata included: the cross-check of ``write_bytes``, which counts
a whole page-cache folio each time one is dirtied.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from benchmarks._common import FSYNC_COUNT, Progress, median_run, scrape
from quire.bench import WriteBenchParams, bench_write
from quire.client import Client
from quire.errors import QuireError
from quire.sandbox import NO_JOURNAL_SETTINGS, BookieProcess, Sandbox
from quire.types import LedgerType

ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 3, 3, 2
MODES: dict[str, dict[str, Any]] = {
    "journal on": {},
    "journal off": NO_JOURNAL_SETTINGS,
}
GOAL_OFF_BYTES_PER_BYTE = 1.1
"""Journal off: at most this many disk bytes per acknowledged payload byte per replica."""
GOAL_OFF_OVER_ON_ENTRIES_PER_S = 1.0
"""Journal off: at least the journal-on run's entries/s."""
JOURNAL_BYTES = "quire_bookie_journal_written_bytes_total"
PARTS = ("journal", "entry_logs", "index", "bookie_log")
"""Where a bookie's written bytes are attributed (the rest is ``unattributed``)."""
EXIT_TIMEOUT_S = 120.0


def proc_io(pid: int) -> dict[str, int]:
    """``/proc/<pid>/io`` as numbers (readable until the process is reaped)."""
    text = Path(f"/proc/{pid}/io").read_text()
    return {key: int(value) for key, value in
            (line.split(": ", 1) for line in text.splitlines() if line)}


def files_bytes(directory: Path) -> int:
    """Sum of the sizes of the files under ``directory`` (0 if it does not exist)."""
    if not directory.exists():
        return 0
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def file_parts(bookie: BookieProcess) -> dict[str, int]:
    """Sizes of what a bookie writes besides its journal (see StorageConfig's layout)."""
    ledgers = Path(bookie.settings["ledger_dirs"][0]) / "ledgers"
    return {"entry_logs": files_bytes(ledgers / "entrylog"),
            "index": files_bytes(ledgers / "index"),
            "bookie_log": bookie.log_path.stat().st_size if bookie.log_path.exists() else 0}


def journal_counters(bookie: BookieProcess) -> dict[str, int]:
    """A running bookie's journal record bytes and fsyncs so far (its /metrics)."""
    assert bookie.metrics_address
    found = scrape(bookie.metrics_address, JOURNAL_BYTES, FSYNC_COUNT)
    return {"journal": int(found[JOURNAL_BYTES]), "journal_fsyncs": int(found[FSYNC_COUNT])}


def snapshot(bookie: BookieProcess) -> dict[str, int]:
    """A running bookie's counters: its /proc io, journal counters, file sizes."""
    assert bookie.proc is not None
    return {**proc_io(bookie.proc.pid), **file_parts(bookie), **journal_counters(bookie)}


def stop_and_snapshot(bookies: list[BookieProcess],
                      journals: list[dict[str, int]]) -> list[dict[str, int]]:
    """SIGTERM every bookie (they stop in parallel: final checkpoint, exit),
    then each one's /proc io as it exited, read before it is reaped, and its
    file sizes; ``journals`` (:func:`journal_counters`) were scraped just
    before the stop."""
    for bookie in bookies:
        assert bookie.proc is not None
        bookie.proc.send_signal(signal.SIGTERM)
    after = []
    for bookie, journal in zip(bookies, journals, strict=True):
        assert bookie.proc is not None
        pid = bookie.proc.pid
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        # WNOWAIT: learn that it exited without reaping it, so /proc/<pid>/io stays
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
            if time.monotonic() > deadline:
                raise QuireError(f"{bookie.bookie_id} did not exit {EXIT_TIMEOUT_S:g} s "
                                 "after SIGTERM")
            time.sleep(0.02)
        io = proc_io(pid)
        code = bookie.proc.wait()
        bookie.proc = None
        if code != 0:
            raise QuireError(f"{bookie.bookie_id} exited with {code}; its log ends with:\n"
                             f"{bookie.log()[-3000:]}")
        after.append({**io, **file_parts(bookie), **journal})
    return after


async def add_entries(uri: str, args: argparse.Namespace, label: str,
                      progress: Progress) -> dict[str, Any]:
    client = await Client.connect(uri)
    try:
        params = WriteBenchParams(
            ensemble_size=ENSEMBLE, write_quorum_size=WRITE_QUORUM, ack_quorum_size=ACK_QUORUM,
            entry_bytes=args.entry_bytes, ledgers=args.ledgers, outstanding=args.outstanding,
            count=args.entries, duration_s=float("inf"), ledger_type=LedgerType.PD_JOURNAL)
        return await bench_write(client, params, lambda s: progress(label, s))
    finally:
        await client.close()


def disk_figures(before: list[dict[str, int]], after: list[dict[str, int]],
                 payload_bytes: int) -> dict[str, Any]:
    """Bytes written, summed over the bookies, and per payload byte per replica."""
    per_replica = payload_bytes * WRITE_QUORUM
    bookies = [{key: a[key] - b[key] for key in
                ("write_bytes", "cancelled_write_bytes", *PARTS, "journal_fsyncs")}
               for b, a in zip(before, after, strict=True)]
    total = {key: sum(b[key] for b in bookies) for key in bookies[0]}
    total["unattributed"] = total["write_bytes"] - sum(total[p] for p in PARTS)
    fsyncs = total.pop("journal_fsyncs")
    return {"bytes": total, "bookies": bookies, "journal_fsyncs": fsyncs,
            "per_payload_byte_per_replica": {k: v / per_replica for k, v in total.items()},
            "bytes_per_byte": total["write_bytes"] / per_replica}


def device_written_bytes(device: str) -> int:
    """Bytes the block device ``device`` (``/sys/block/<device>``) has written
    since boot, file system metadata and every process included."""
    fields = Path(f"/sys/block/{device}/stat").read_text().split()
    return int(fields[6]) * 512  # sectors written, always of 512 bytes there


def run_mode(mode: str, args: argparse.Namespace, root: Path,
             progress: Progress) -> dict[str, Any]:
    sandbox = Sandbox(root / "sandbox", bookies=3, metrics_port=0, **MODES[mode])
    progress.note(f"{mode}: starting a 3-bookie sandbox ...")
    sandbox.start()
    try:
        before = [snapshot(b) for b in sandbox.bookies]
        if args.block_device:
            os.sync()
            device_before = device_written_bytes(args.block_device)
        progress.note(f"{mode}: {args.entries:,} PD adds of {args.entry_bytes} B at "
                      f"E={ENSEMBLE} W={WRITE_QUORUM} A={ACK_QUORUM}, "
                      f"{args.outstanding} outstanding, {args.ledgers} ledger(s)")
        result: dict[str, Any] = uvloop.run(add_entries(sandbox.metadata_uri, args, mode,
                                                        progress))
        journal = [journal_counters(b) for b in sandbox.bookies]
        progress.note(f"{mode}: stopping the bookies (final checkpoint) ...")
        after = stop_and_snapshot(sandbox.bookies, journal)
        if args.block_device:
            os.sync()  # (the file system's own journal included)
            device = device_written_bytes(args.block_device) - device_before
    except BaseException:
        for bookie in sandbox.bookies:  # before the temporary directory goes
            print(f"--- {mode}: {bookie.log_path.name} ends with:\n{bookie.log()[-3000:]}",
                  file=sys.stderr)
        raise
    finally:
        sandbox.stop()  # whatever is still running, if something failed
        shutil.rmtree(root, ignore_errors=True)  # 1-2 GB a mode: not kept for the next
    payload_bytes = result["entries"] * args.entry_bytes
    result.update(disk_figures(before, after, payload_bytes))
    if args.block_device:
        result["device_bytes"] = device
        result["device_bytes_per_byte"] = device / (payload_bytes * WRITE_QUORUM)
    progress.note(_line(mode, result))
    return result


# --- output -------------------------------------------------------------------


def _line(mode: str, r: dict[str, Any]) -> str:
    return (f"{mode:<12} {r['entries_per_s']:>9,.0f} entries/s  p50 {r['p50_ms']:6.2f} ms  "
            f"p99 {r['p99_ms']:6.2f} ms  {r['bytes_per_byte']:5.3f} disk bytes per payload "
            f"byte per replica")


def _verdict(met: bool) -> str:
    return "PASS" if met else "FAIL"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=200_000,
                        help="entries added per mode and round (default 200000)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of both modes (alternating which goes first); "
                             "figures are medians over them")
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--outstanding", type=int, default=256)
    parser.add_argument("--ledgers", type=int, default=1)
    parser.add_argument("--tmpdir", type=Path, default=None,
                        help="where the bookies keep their files (default: system temp)")
    parser.add_argument("--block-device", default="",
                        help="also count what this block device (a name under /sys/block, "
                             "e.g. loop0) wrote in each measurement; only meaningful for a "
                             "device that holds --tmpdir and nothing else writes to")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args()
    if args.entries < 1 or args.rounds < 1:
        parser.error("--entries and --rounds must be at least 1")
    progress = Progress(not args.quiet)

    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="quire-journal-bytes-", dir=args.tmpdir) as tmp:
        for i in range(args.rounds):
            order = list(MODES) if i % 2 == 0 else list(reversed(MODES))
            progress.note(f"round {i + 1}/{args.rounds}: {' then '.join(order)}")
            for mode in order:
                runs[mode].append(run_mode(mode, args, Path(tmp) / f"round-{i + 1}-"
                                           f"{mode.replace(' ', '-')}", progress))
    results = {mode: median_run(rs) for mode, rs in runs.items()}
    on, off = runs["journal on"], runs["journal off"]
    round_ratios = {
        "entries_per_s": [f["entries_per_s"] / n["entries_per_s"]
                          for n, f in zip(on, off, strict=True)],
        "bytes_per_byte": [f["bytes_per_byte"] / n["bytes_per_byte"]
                           for n, f in zip(on, off, strict=True)]}
    ratios = {k: statistics.median(v) for k, v in round_ratios.items()}
    off_bytes = statistics.median(r["bytes_per_byte"] for r in off)
    goals = {
        "journal_off_bytes_per_byte": {
            "goal": f"<= {GOAL_OFF_BYTES_PER_BYTE}", "value": off_bytes,
            "met": off_bytes <= GOAL_OFF_BYTES_PER_BYTE},
        "journal_off_over_on_entries_per_s": {
            "goal": f">= {GOAL_OFF_OVER_ON_ENTRIES_PER_S}", "value": ratios["entries_per_s"],
            "met": ratios["entries_per_s"] >= GOAL_OFF_OVER_ON_ENTRIES_PER_S}}
    if args.json:
        print(json.dumps({
            "params": {"entries": args.entries, "rounds": args.rounds,
                       "entry_bytes": args.entry_bytes, "outstanding": args.outstanding,
                       "ledgers": args.ledgers, "shape": [ENSEMBLE, WRITE_QUORUM, ACK_QUORUM],
                       "ledger_type": LedgerType.PD_JOURNAL.value,
                       "modes": {m: s for m, s in MODES.items()}},
            "results": results, "runs": runs, "ratios": ratios,
            "round_ratios": round_ratios, "goals": goals}, indent=2))
        return
    print(f"\n{args.entries:,} PD adds of {args.entry_bytes} B per mode, E={ENSEMBLE} "
          f"W={WRITE_QUORUM} A={ACK_QUORUM}, {args.outstanding} outstanding, "
          f"{args.ledgers} ledger(s); median run of {args.rounds}")
    for mode, r in results.items():
        print(_line(mode, r))
    print("\ndisk bytes per payload byte per replica, by where they went:")
    print(f"{'mode':<12} {'/proc total':>11} {'journal':>8} {'entry logs':>10} "
          f"{'index':>8} {'bookie log':>10} {'other':>8}   (MB written, all bookies)")
    for mode, r in results.items():
        per, total = r["per_payload_byte_per_replica"], r["bytes"]
        print(f"{mode:<12} {per['write_bytes']:>11.3f} {per['journal']:>8.3f} "
              f"{per['entry_logs']:>10.3f} {per['index']:>8.3f} {per['bookie_log']:>10.4f} "
              f"{per['unattributed']:>8.3f}   ({total['write_bytes'] / 1e6:,.1f} MB)")
    print("(journal: the bookies' journal record bytes; entry logs and index: growth of "
          "their files; other: the rest: each journal group's write re-dirties the partly "
          "written page (folio) it starts in and pads its last one, LMDB page rewrites, "
          "the metadata store)")
    for mode, r in results.items():
        fsyncs = r["journal_fsyncs"]
        per_fsync = (f", {r['bytes']['unattributed'] / fsyncs / 1024:.1f} KiB of other per fsync"
                     if fsyncs else "")
        print(f"{mode}: {fsyncs:,} journal fsyncs{per_fsync}")
    if args.block_device:
        for mode, r in results.items():
            print(f"{mode}: device {args.block_device} wrote {r['device_bytes'] / 1e6:,.1f} MB, "
                  f"{r['device_bytes_per_byte']:.3f} bytes per payload byte per replica "
                  "(file system metadata included)")

    def rounds(values: list[float]) -> str:
        return ", ".join(f"{v:.3f}" for v in values)

    print(f"\njournal off / journal on: entries/s {ratios['entries_per_s']:.3f}x, "
          f"bytes per byte {ratios['bytes_per_byte']:.3f}x (median of the rounds' ratios: "
          f"{rounds(round_ratios['entries_per_s'])}; {rounds(round_ratios['bytes_per_byte'])})")
    g = goals["journal_off_bytes_per_byte"]
    print(f"goal journal off <= {GOAL_OFF_BYTES_PER_BYTE} disk bytes per payload byte per "
          f"replica: {g['value']:.3f}  {_verdict(g['met'])}")
    g = goals["journal_off_over_on_entries_per_s"]
    print(f"goal journal-off entries/s >= journal-on: {g['value']:.3f}x  {_verdict(g['met'])}")


if __name__ == "__main__":
    main()
