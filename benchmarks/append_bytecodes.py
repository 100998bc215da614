"""Python bytecodes per segment append, by function, in one or more source trees.

``segment_append_cpu.py`` measures CPU per append, and on this project's VMs
one process can run 30% slower than the next on the same code. This script
counts instead: the bytecodes the interpreter executes per append, from
``sys.settrace`` with opcode events, for the same kind of row (one container
on the in-memory tier-1 log, ``--segments`` segments taking ``--size``-byte
appends in turn, 256 outstanding, plain or with a writer's event number).
The count moves by less than 0.1% from run to run on a quiet machine, up
to 1% on a busy one (where callbacks fall between frames), so a change's
cost on the append path shows, and the table says which functions it is
in. A bytecode is not a fixed cost: ``segment_append_cpu.py`` still says
what a change costs in time.

With ``--instructions`` it counts machine instructions instead, the C
work (dicts, arrays, the 1 KiB copies, futures) included: each child runs
under valgrind's cachegrind twice, with ``--appends`` and twice as many,
untraced, and the difference of the two totals over ``--appends`` is the
instructions per append (start-up and warm-up cancel out, all but a few
million instructions of timers and start-up that differ between runs). That
count moves by 1-2% from run to run (2.3% at most seen), where CPU time
moves 30%: the nearest thing to CPU time this VM measures steadily.

Each tree runs in a child process with its ``src`` first on ``PYTHONPATH``
and this script's driver, so trees from before a change can be compared
with this script as it is now.

    .venv/bin/python benchmarks/append_bytecodes.py [--tree DIR ...] [--appends 4000]
        [--segments 1000] [--size 1024] [--instructions] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODES = ("plain", "writer")
CACHEGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
              "--cachegrind-out-file=/dev/null"]
WARM_APPENDS = 3000
"""Appends before counting: every segment has its state and the first frames are cut."""


async def keep_outstanding(call: Callable[[int], asyncio.Future[Any]], count: int,
                           outstanding: int) -> None:
    """``call(i)`` for i < count, ``outstanding`` in flight, each completion
    issuing the next, as ``segment_appends.drive`` does without its clocks:
    that module imports names of the current tree, so trees from before a
    change cannot run it."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    issued = finished = 0

    def issue() -> None:
        nonlocal issued
        issued += 1
        call(issued - 1).add_done_callback(complete)

    def complete(future: asyncio.Future[Any]) -> None:
        nonlocal finished
        finished += 1
        if future.exception() is not None and not done.done():
            done.set_exception(future.exception())  # type: ignore[arg-type]
        elif issued < count:
            issue()
        elif finished == count and not done.done():
            done.set_result(None)

    for _ in range(min(outstanding, count)):
        issue()
    await done


def count_in_this_process(mode: str, appends: int, segments: int, size: int,
                          traced: bool = True) -> dict[str, Any]:
    """Bytecodes per append of ``appends`` appends after a warm-up, by
    function (``traced`` False: only run them, for an instruction count)."""
    import uvloop

    from quire.metadata import open_store
    from quire.segmentstore import SegmentStore, SegmentStoreConfig
    from quire.testing.memory_data_log import MemoryDataLogs


    counts: collections.Counter[str] = collections.Counter()

    def trace(frame: FrameType, _event: str, _arg: object) -> Any:
        frame.f_trace_opcodes = True
        code = frame.f_code
        where = code.co_filename.rpartition("/src/")[2].rpartition("/benchmarks/")[2]
        key = f"{where}:{code.co_name}"

        def each(_frame: FrameType, event: str, _arg: object) -> Any:
            if event == "opcode":
                counts[key] += 1
            return each
        return each

    async def run() -> None:
        logs = MemoryDataLogs()
        store = await SegmentStore.open(None, [0], metadata_store=await open_store("memory://ops"),
                                        open_log=lambda c: logs.open(f"c{c}"),
                                        config=SegmentStoreConfig(container_count=1))
        names = [f"ops/{i}" for i in range(segments)]
        await asyncio.gather(*(store.create_segment(n) for n in names))
        event = b"e" * size
        numbers = iter(range(1, 1 << 62))

        def call(i: int) -> Any:
            if mode == "plain":
                return store.append(names[i % segments], event)
            return store.append(names[i % segments], event,
                                writer=(1 + i % segments, next(numbers)))
        try:
            await keep_outstanding(call, WARM_APPENDS, 256)
            if not traced:
                await keep_outstanding(call, appends, 256)
                return
            sys.settrace(trace)
            try:
                await keep_outstanding(call, appends, 256)
            finally:
                sys.settrace(None)
        finally:
            await store.close()

    uvloop.run(run())
    return {"mode": mode, "bytecodes_per_append": sum(counts.values()) / appends,
            "functions": {k: v / appends for k, v in counts.most_common() if v >= appends / 2}}


def _child(tree: Path, mode: str, args: argparse.Namespace, appends: int,
           under_cachegrind: bool) -> subprocess.CompletedProcess[str]:
    """One child run; under cachegrind it runs the appends untraced."""
    env = {**os.environ, "PYTHONPATH": str(tree.resolve() / "src"), "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [*(CACHEGRIND if under_cachegrind else []), sys.executable, __file__, "--child", mode,
         "--appends", str(appends), "--segments", str(args.segments), "--size", str(args.size),
         *(["--untraced"] if under_cachegrind else [])],
        env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"append_bytecodes: {tree} ({mode}) failed:\n{done.stderr[-4000:]}")
    return done


def count_in_tree(tree: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    if not args.instructions:
        result: dict[str, Any] = json.loads(_child(tree, mode, args, args.appends, False).stdout)
        return result
    totals = []
    for appends in (args.appends, 2 * args.appends):
        done = _child(tree, mode, args, appends, True)
        found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
        if found is None:
            sys.exit(f"append_bytecodes: no instruction count from valgrind:\n"
                     f"{done.stderr[-2000:]}")
        totals.append(int(found.group(1).replace(",", "")))
    return {"mode": mode, "instructions_per_append": (totals[1] - totals[0]) / args.appends,
            "functions": {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, action="append",
                        help="a source tree (repeat; default: this one); the first is the baseline")
    parser.add_argument("--appends", type=int, default=4000)
    parser.add_argument("--segments", type=int, default=1000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--instructions", action="store_true",
                        help="count machine instructions under valgrind (module docstring)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--untraced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(count_in_this_process(args.child, args.appends, args.segments,
                                               args.size, traced=not args.untraced)))
        return
    trees = args.tree or [REPO]
    rows = [{"tree": str(tree), **count_in_tree(tree, mode, args)}
            for tree in trees for mode in MODES]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    unit = "instructions" if args.instructions else "bytecodes"
    key = f"{unit}_per_append"
    print(f"{unit} per append: {args.segments} segment(s), {args.size} B, "
          f"{args.appends} appends after {WARM_APPENDS}")
    base = {r["mode"]: r[key] for r in rows[:len(MODES)]}
    for r in rows:
        ratio = r[key] / base[r["mode"]]
        print(f"  {r['tree']:<40} {r['mode']:<7} {r[key]:8.1f}  {ratio:.3f}x")
        for name, per_append in list(r["functions"].items())[:8]:
            print(f"      {per_append:7.1f}  {name}")


if __name__ == "__main__":
    main()
