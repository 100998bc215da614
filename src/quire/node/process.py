"""The bookie process: ``quire bookie start`` runs :func:`run`."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import signal
import sys

from quire.bookie.config import BookieConfig
from quire.node.bookie_node import BookieNode


async def serve(config: BookieConfig) -> None:
    """Run one bookie until SIGTERM or SIGINT, then shut down cleanly.

    Prints one JSON line ``{"event": "ready", ...}`` on stdout once it serves.
    """
    node = BookieNode(config)
    await node.start()
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []

    def request_stop() -> None:
        if not stopping:
            stopping.append(loop.create_task(node.stop()))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, request_stop)
    print(json.dumps({"event": "ready", "bookie_id": node.bookie_id,
                      "address": node.address, "metrics": node.metrics_address,
                      "read_only": node.read_only}), flush=True)
    await node.wait_stopped()


def run(config: BookieConfig) -> None:
    """Blocking entry point used by ``quire bookie start``: the process's
    interpreter settings, logging, then :func:`serve` on uvloop."""
    import uvloop

    sys.setswitchinterval(config.gil_switch_interval_us / 1e6)
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(config.gc_gen0_threshold_allocations, gen1, gen2)
    gc.freeze()

    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvloop.run(serve(config))
