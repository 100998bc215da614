"""Running one host as a process: signals, the ready line, the interpreter."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("quire.hosts")

STOP_DEADLINE_S = 30.0
"""How long a clean stop may take before the process exits without it.  A
host whose metadata store or bookies are gone can wait on them for ever;
exiting then is a crash, which every host recovers from (what it
acknowledged is durable), and an operator's stop must stop."""
STOP_DEADLINE_EXIT_CODE = 3
"""The exit status of a process whose clean stop ran out of time."""


class Host(Protocol):
    """What :func:`serve` runs: started once, stopped once (idempotent)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def wait_stopped(self) -> None: ...

    def ready_event(self) -> dict[str, Any]:
        """What the JSON ready line says besides ``"event": "ready"``."""
        ...


async def serve(host: Host, stop_deadline_s: float = STOP_DEADLINE_S,
                exit: Callable[[int], None] = os._exit) -> None:
    """Start ``host``, print one JSON line ``{"event": "ready", ...}`` on
    stdout, and run until SIGTERM or SIGINT stops it cleanly.  A clean stop
    still going after ``stop_deadline_s`` ends the process at once
    (``exit(STOP_DEADLINE_EXIT_CODE)``, logged).  A second signal while
    stopping changes nothing: Ctrl-C in a terminal signals a whole process
    group, whose parent may then pass a SIGTERM on to its children."""
    await host.start()
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []
    deadline: list[asyncio.TimerHandle] = []

    def give_up(why: str) -> None:
        log.error("%s: exiting without a clean stop", why)
        logging.shutdown()
        exit(STOP_DEADLINE_EXIT_CODE)

    def request_stop() -> None:
        if stopping:
            return
        stopping.append(loop.create_task(host.stop()))
        deadline.append(loop.call_later(stop_deadline_s, give_up,
                                        f"the clean stop took more than {stop_deadline_s:g} s"))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, request_stop)
    print(json.dumps({"event": "ready", **host.ready_event()}), flush=True)
    try:
        await host.wait_stopped()
    finally:
        for handle in deadline:
            handle.cancel()


def tune_interpreter(gc_gen0_threshold_allocations: int = 0) -> None:
    """A host process's garbage-collector settings: the gen-0 threshold
    (0: Python's default) and the objects made so far (imports, start-up)
    frozen out of every collection.  A process that hosts containers makes a
    few short-lived objects per append and a few hundred appends are in
    flight at once, so the default threshold (700) collects every few
    bursts, promoting what is in flight; the promotions then trigger full
    collections that walk every object the process holds (tens of ms, all
    outstanding appends waiting).  Benchmarks standing in for a host call
    this too."""
    if gc_gen0_threshold_allocations > 0:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(gc_gen0_threshold_allocations, gen1, gen2)
    gc.freeze()


def run(make_host: Callable[[], Host], gc_gen0_threshold_allocations: int = 0) -> None:
    """Blocking entry point of a host command: the interpreter's settings
    (:func:`tune_interpreter`), logging, then :func:`serve` on uvloop."""
    import uvloop

    tune_interpreter(gc_gen0_threshold_allocations)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvloop.run(serve(make_host()))
