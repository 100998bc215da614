"""``quire.cli.common.until_interrupted``: what ``tail -f`` runs its
following in. Ctrl-C ends it even when the work drops its first
cancellation (Python 3.11's ``asyncio.wait_for`` can; a ``quire log tail
-f`` once followed on for good after its Ctrl-C)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from quire.cli.common import until_interrupted


async def test_ctrl_c_ends_work_that_drops_its_first_cancellation() -> None:
    started = asyncio.Event()
    cancellations = 0

    async def stubborn() -> None:
        nonlocal cancellations
        started.set()
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancellations += 1
                if cancellations == 2:
                    raise  # the second one is kept

    running = asyncio.create_task(until_interrupted(stubborn()))
    await started.wait()
    os.kill(os.getpid(), signal.SIGINT)
    await asyncio.wait_for(running, 10)
    assert cancellations == 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # its handler is gone


async def test_the_works_error_passes_through_and_work_that_ends_is_not_interrupted() -> None:
    async def fails() -> None:
        raise ValueError("broken")

    with pytest.raises(ValueError, match="broken"):
        await until_interrupted(fails())

    async def ends() -> None:
        return None

    await until_interrupted(ends())
