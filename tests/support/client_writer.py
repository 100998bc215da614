"""A writer process for recovery tests: ``python -m tests.support.client_writer URI``.

Creates a ledger (E=W=3, A=2, password ``pw``), prints ``{"ledger_id": N}``,
then appends ``entry-<id>`` payloads forever with up to 64 adds in flight,
printing ``{"acked": id}`` for each acknowledged entry, until it is killed.
"""

from __future__ import annotations

import asyncio
import json
import sys

from quire.client import Client


async def main(uri: str) -> None:
    client = await Client.connect(uri)
    ledger = await client.create_ledger(3, 3, 2, password=b"pw")
    print(json.dumps({"ledger_id": ledger.ledger_id}), flush=True)
    window = asyncio.Semaphore(64)

    def acked(future: asyncio.Future[int]) -> None:
        window.release()
        if not future.cancelled() and future.exception() is None:
            print(json.dumps({"acked": future.result()}), flush=True)

    entry_id = 0
    while True:
        await window.acquire()
        ledger.append(b"entry-%d" % entry_id).add_done_callback(acked)
        entry_id += 1


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
