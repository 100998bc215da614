"""A segment store process for tests: ``python -m tests.support.segment_writer URI N``.

Opens a :class:`~quire.segmentstore.SegmentStore` hosting every container
(container_count 2), creates segments ``sc/st/<i>.#epoch.0`` for i < N
(or finds them), prints ``{"ready": true}``, then appends ``<i>:<n>;`` to
segment ``i`` round robin, event n of writer ``i + 1``, with up to 128
appends outstanding, printing ``{"acked": [i, n, length]}`` for each
acknowledged one, until it is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys

from quire.client import Client
from quire.errors import SegmentExistsError
from quire.segmentstore import AppendResult, SegmentStore, SegmentStoreConfig


def segment_name(i: int) -> str:
    return f"sc/st/{i}.#epoch.0"


async def main(uri: str, segments: int) -> None:
    client = await Client.connect(uri)
    store = await SegmentStore.open(client, range(2),
                                    config=SegmentStoreConfig(container_count=2))
    for i in range(segments):
        with contextlib.suppress(SegmentExistsError):
            await store.create_segment(segment_name(i))
    print(json.dumps({"ready": True}), flush=True)
    window = asyncio.Semaphore(128)

    def acked(i: int, n: int, future: asyncio.Future[AppendResult]) -> None:
        window.release()
        if not future.cancelled() and future.exception() is None:
            print(json.dumps({"acked": [i, n, future.result().length]}), flush=True)

    n = 0
    while True:
        for i in range(segments):
            await window.acquire()
            store.append(segment_name(i), f"{i}:{n};".encode(), writer=(i + 1, n)) \
                .add_done_callback(lambda f, i=i, n=n: acked(i, n, f))
        n += 1


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
