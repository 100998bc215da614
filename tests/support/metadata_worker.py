"""A separate process for the metadata store's multi-process tests.

    python metadata_worker.py URI OPTIONS_JSON COMMAND [ARG]

Each command prints "ready" once set up, then waits for a line on stdin, so
a test can release several workers at the same moment:

    cas LEDGER_ID    compare-and-set the ledger at the version read before
                     "ready"; prints "won" or "lost"
    ids COUNT        allocates COUNT ledger ids; prints them on one line
    register ID      registers bookie ID before "ready"; then waits to be killed
    lease KEY        creates leased record KEY (its value: the pid) before
                     "ready"; then waits to be killed

and one that talks on after "ready":

    elect NAME       campaigns as NAME for group "auditor"; prints "leading"
                     and "not leading" as it gains and loses the lead; on a
                     line "resign" resigns and prints "resigned"
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from quire.errors import MetadataVersionError
from quire.metadata import BookieInfo, ElectionView, Leadership, MetadataStore, open_store
from quire.types import BookieState


async def main(uri: str, options: str, command: str, arg: str) -> None:
    store = await open_store(uri, **json.loads(options))
    try:
        if command == "cas":
            current = await store.read_ledger(int(arg))
            changed = current.value.with_(custom_metadata={"winner": str(os.getpid()).encode()})
            await ready()
            try:
                await store.write_ledger(int(arg), changed, current.version)
                print("won", flush=True)
            except MetadataVersionError:
                print("lost", flush=True)
        elif command == "ids":
            await ready()
            ids = [await store.new_ledger_id() for _ in range(int(arg))]
            print(" ".join(map(str, ids)), flush=True)
        elif command == "register":
            await store.register_bookie(BookieInfo(arg, "127.0.0.1:3181", BookieState.WRITABLE))
            await ready()
        elif command == "lease":
            await store.create_leased_record(arg, str(os.getpid()).encode())
            await ready()
        elif command == "elect":
            await campaign(store, arg)
        else:
            raise SystemExit(f"unknown command {command!r}")
    finally:
        await store.close()


async def campaign(store: MetadataStore, name: str) -> None:
    election = store.elect("auditor", name)
    leading = False

    def on_view(view: ElectionView) -> None:
        nonlocal leading
        if (view.state is Leadership.LEADER) != leading:
            leading = not leading
            print("leading" if leading else "not leading", flush=True)

    election.watch(on_view)
    print("ready", flush=True)
    while line := await asyncio.to_thread(sys.stdin.readline):
        if line.strip() == "resign":
            await election.resign()
            print("resigned", flush=True)


async def ready() -> None:
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
