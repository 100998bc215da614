"""A separate process for the metadata store's multi-process tests.

    python metadata_worker.py URI OPTIONS_JSON COMMAND [ARG]

Each command prints "ready" once set up, then waits for a line on stdin, so
a test can release several workers at the same moment:

    cas LEDGER_ID    compare-and-set the ledger at the version read before
                     "ready"; prints "won" or "lost"
    ids COUNT        allocates COUNT ledger ids; prints them on one line
    register ID      registers bookie ID before "ready"; then waits to be killed
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from quire.errors import MetadataVersionError
from quire.metadata import BookieInfo, open_store
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
        else:
            raise SystemExit(f"unknown command {command!r}")
    finally:
        await store.close()


async def ready() -> None:
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
