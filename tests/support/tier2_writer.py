"""A tier-2 writer process for crash tests:
``python -m tests.support.tier2_writer ROOT [--tracking]``.

Opens the ``file://ROOT`` driver and writes chunks ``w/<i % 4>/c.E1.<i>``
(i = 0, 1, 2, ...) of :func:`chunk_bytes` ``(i)``, four writes in flight,
printing ``<name>`` on its own line as each write returns, until it is
killed.  With ``--tracking``, the driver records its fsyncs for
:mod:`quire.testing.tier2_power_loss`.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys

from quire.tier2 import Tier2Config, open_chunk_storage

IN_FLIGHT = 4


def chunk_name(i: int) -> str:
    return f"w/{i % 4}/c.E1.{i}"


def chunk_bytes(i: int) -> bytes:
    """Between 64 KiB and 1 MiB, every byte a function of ``i``."""
    size = 64 * 1024 + (i * 7919) % (960 * 1024)
    block = hashlib.sha256(str(i).encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def index_of(name: str) -> int:
    return int(name.rpartition(".")[2])


async def main(root: str, tracking: bool) -> None:
    storage = await open_chunk_storage(Tier2Config(uri=f"file://{root}",
                                                   power_loss_tracking=tracking))
    counter = iter(range(sys.maxsize))

    async def writer() -> None:
        for i in counter:
            await storage.write_chunk(chunk_name(i), chunk_bytes(i))
            sys.stdout.write(chunk_name(i) + "\n")
            sys.stdout.flush()

    await asyncio.gather(*(writer() for _ in range(IN_FLIGHT)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], "--tracking" in sys.argv[2:]))
