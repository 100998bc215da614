"""Watching BP-46's phase two of a bookie process through its metrics."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable

from quire.security import client_context
from tests.support.bookies import BookieProcess

REPAIR = "quire_bookie_repair_"


def scrape(process: BookieProcess) -> dict[str, float]:
    """The bookie's metrics (``metrics_port`` must be set), by sample name
    (over TLS, trusting its ``tls_ca_file``, when it serves TLS)."""
    assert process.metrics_address, f"{process.bookie_id} serves no metrics"
    settings = process.settings
    tls = client_context(settings["tls_ca_file"]) if settings.get("tls_cert_file") else None
    scheme = "https" if tls is not None else "http"
    with urllib.request.urlopen(f"{scheme}://{process.metrics_address}/metrics", timeout=10,
                                context=tls) as r:
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def repair_metrics(process: BookieProcess) -> dict[str, float]:
    """The ``quire_bookie_repair_*`` metrics, without the prefix."""
    return {name[len(REPAIR):]: value for name, value in scrape(process).items()
            if name.startswith(REPAIR)}


async def wait_for_repair(process: BookieProcess,
                          done: Callable[[dict[str, float]], bool] | None = None,
                          timeout_s: float = 60.0) -> dict[str, float]:
    """Poll the repair metrics until ``done`` holds (default: a pass completed
    and nothing in limbo); return them."""
    done = done or (lambda m: m["passes_total"] >= 1 and m["limbo_ledgers"] == 0)
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = await asyncio.to_thread(repair_metrics, process)
        if metrics and done(metrics):
            return metrics
        assert time.monotonic() < deadline, (
            f"{process.bookie_id}: repair not done: {metrics}\n{process.log()[-3000:]}")
        await asyncio.sleep(0.1)
