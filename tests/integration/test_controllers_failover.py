"""Three controller processes serve one cluster (a sandbox of one bookie,
one segment store and controllers on 127.0.0.1, .2 and .3, one port, each
pausing 3 s after writing a workflow's intent): ``kill -9`` of the one
running a scale, and of the one committing a transaction of the real
Pravega client; each finishes exactly once on another, and the clients
(Quire's, given every address; the Pravega client, given the name that
resolves to them all) keep working."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pravega_client
import pytest

from quire.errors import ControllerUnavailableError
from quire.sandbox import CONTROLLERS_HOST, ControllerProcess, Sandbox, resolves_to
from quire.streams import ControllerClient, RemoteSegmentStore, controller_resolver
from tests.support.pravega_reading import by_routing_key, read_slices
from tests.support.stream_stack import wait_for

REPO = Path(__file__).resolve().parents[2]
PAUSE_MS = 3000


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    assert resolves_to(CONTROLLERS_HOST, 3), \
        f"{CONTROLLERS_HOST} must resolve to 127.0.0.1 .. 127.0.0.3: run scripts/setup --system"
    cluster = Sandbox(tmp_path_factory.mktemp("controllers"), bookies=1, controllers=3)
    for process in cluster.controllers:
        process.settings["workflow_pause_ms"] = PAUSE_MS
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def pravega_uri(cluster: Sandbox) -> str:
    assert cluster.controller is not None
    return f"tcp://{CONTROLLERS_HOST}:{cluster.controller.settings['port']}"


def run(uri: str, fn: Any) -> Any:
    async def go() -> Any:
        controller = ControllerClient(uri, timeout_ms=20_000)
        segments = RemoteSegmentStore(controller_resolver(controller))
        try:
            return await fn(controller, segments)
        finally:
            await segments.close()
            await controller.close()
    return asyncio.run(go())


def paused(process: ControllerProcess, what: str) -> bool:
    return f"{what} written; pausing" in process.log()


def epochs(cluster: Sandbox, scope: str, stream: str) -> list[dict[str, Any]]:
    async def go(controller: ControllerClient, _s: RemoteSegmentStore) -> list[dict[str, Any]]:
        found = await controller.admin("describeStream", {"scope": scope, "stream": stream})
        return list(found["epochs"])
    return list(run(cluster.controller_uri, go))


def restart_killed(cluster: Sandbox) -> None:
    for process in cluster.controllers:
        if not process.running:
            process.start()


def test_a_scale_whose_controller_is_killed_finishes_once_on_another(
        sandbox: Sandbox) -> None:
    manager = pravega_client.StreamManager(pravega_uri(sandbox))
    assert manager.create_scope("fail")
    assert manager.create_stream("fail", "scaled", 2)
    writer = manager.create_writer("fail", "scaled")
    for n in range(10):
        writer.write_event(f"k{n % 3}:{n // 3}", routing_key=f"k{n % 3}")
    writer.flush()
    victim = sandbox.controllers[1]

    async def scale_on_the_victim() -> None:
        async with ControllerClient(f"tcp://{victim.address}", timeout_ms=20_000) as one:
            with pytest.raises(ControllerUnavailableError):  # it dies under the call
                await one.scale("fail", "scaled", [0], [(0.0, 0.25), (0.25, 0.5)])

    def kill_when_paused() -> None:
        wait_for(lambda: paused(victim, "scale"), "the scale's intent")
        victim.kill9()

    async def both() -> None:
        await asyncio.gather(scale_on_the_victim(), asyncio.to_thread(kill_when_paused))
    asyncio.run(both())

    async def done(controller: ControllerClient, _s: RemoteSegmentStore) -> bool:
        return await controller.scale_done("fail", "scaled", 0)
    wait_for(lambda: run(sandbox.controller_uri, done), "the scale finished by another", 30)
    found = epochs(sandbox, "fail", "scaled")
    assert [(e["epoch"], e["reason"]) for e in found] == [(0, ""), (1, "manual")]
    assert sorted(s["id"] for s in found[1]["segments"]) == [1, (1 << 32) | 2, (1 << 32) | 3]
    for n in range(10, 20):  # the client keeps working: the writer follows the scale
        writer.write_event(f"k{n % 3}:{n // 3}", routing_key=f"k{n % 3}")
    writer.flush()
    reader = manager.create_reader_group("all", "fail", "scaled").create_reader("r")
    got = asyncio.run(read_slices(reader, 20, time.monotonic() + 60))
    assert by_routing_key(got) == {f"k{k}": list(range(len(range(k, 20, 3)))) for k in range(3)}
    restart_killed(sandbox)


def test_a_commit_whose_controller_is_killed_finishes_once_on_another(
        sandbox: Sandbox) -> None:
    manager = pravega_client.StreamManager(pravega_uri(sandbox))
    assert manager.create_scope("txns")
    assert manager.create_stream("txns", "s", 2)
    committer = subprocess.Popen(
        [sys.executable, "-m", "tests.support.pravega_txn", pravega_uri(sandbox), "txns", "s",
         "20"], cwd=REPO, stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
    try:
        assert committer.stdout is not None
        assert "written" in json.loads(committer.stdout.readline())
        wait_for(lambda: any(paused(c, "commit") for c in sandbox.controllers),
                 "the commit's intent")
        victim = next(c for c in sandbox.controllers if paused(c, "commit"))
        victim.kill9()
        outcome = json.loads(committer.stdout.readline())
        assert outcome == {"committed": True}, outcome  # the client retried on another
    finally:
        committer.kill()
        committer.wait(10)
    writer = manager.create_writer("txns", "s")
    writer.write_event("t:20", routing_key="t")
    writer.flush()
    reader = manager.create_reader_group("all", "txns", "s").create_reader("r")
    assert by_routing_key(asyncio.run(read_slices(reader, 21, time.monotonic() + 60))) == \
        {"t": list(range(21))}

    async def states(controller: ControllerClient, _s: RemoteSegmentStore) -> list[str]:
        return [t["state"] for t in await controller.admin(
            "listTransactions", {"scope": "txns", "stream": "s"})]
    assert run(sandbox.controller_uri, states) == ["COMMITTED"]
    restart_killed(sandbox)
