"""``quire.hosts.process.serve``: a signal stops the host cleanly, and a clean
stop that hangs (its metadata store or bookies gone) gives way to an exit."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from quire.hosts.process import STOP_DEADLINE_EXIT_CODE, serve


class FakeHost:
    """A host whose stop finishes, or never does (``stop_hangs``)."""

    def __init__(self, stop_hangs: bool) -> None:
        self.stop_hangs = stop_hangs
        self.stops = 0
        self.stopped = asyncio.Event()

    async def start(self) -> None:
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)

    async def stop(self) -> None:
        self.stops += 1
        if self.stop_hangs:
            await asyncio.Event().wait()
        self.stopped.set()

    async def wait_stopped(self) -> None:
        await self.stopped.wait()

    def ready_event(self) -> dict[str, Any]:
        return {}


async def test_a_signal_stops_the_host_cleanly_and_nothing_exits_it() -> None:
    host = FakeHost(stop_hangs=False)
    exits: list[int] = []
    await asyncio.wait_for(serve(host, stop_deadline_s=0.5, exit=exits.append), 5)
    await asyncio.sleep(0.6)  # past the deadline: the stop already finished, no exit
    assert host.stops == 1 and exits == []


async def test_a_clean_stop_that_hangs_ends_in_an_exit_at_the_deadline() -> None:
    host = FakeHost(stop_hangs=True)
    exits: list[int] = []

    def exit_(code: int) -> None:
        exits.append(code)
        host.stopped.set()  # what os._exit would end: the process

    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(serve(host, stop_deadline_s=0.3, exit=exit_), 5)
    assert exits == [STOP_DEADLINE_EXIT_CODE] and host.stops == 1
    assert loop.time() - started >= 0.3
