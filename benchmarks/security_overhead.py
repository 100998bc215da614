"""TLS and auth on against off, in the same run: what security costs the write paths.

For each mode, a ``quire.sandbox.Sandbox`` in a temporary directory (3 bookie
processes, a segment store with tier-1 ledgers E=3 W=3 A=2, the controller):
``plain`` as ``quire sandbox`` starts it, ``secure`` as ``quire sandbox
--secure`` does (:mod:`quire.sandbox_security`: TLS on the segment store's
wire, the controller's gRPC and every HTTP endpoint, Basic auth on the
controller, delegation tokens checked on the wire).  In each:

1. the real Pravega client (``write_event_async``, ``--event-bytes`` (100) B
   events, ``--outstanding`` (1024) futures in flight, on uvloop) writes for
   ``--seconds`` to a ``--segments`` (3) segment stream (``tls://localhost``
   with Basic credentials in ``secure``);
2. Quire's ``StreamWriter`` (``quire.streams``, with ``StreamAccess``: TLS,
   credentials, delegation tokens) writes the same way;
3. ledger writes through Quire's ledger client, 1 KiB entries, 256
   outstanding, E=3 W=3 A=2, for ``--seconds`` (in ``secure`` with mutual
   TLS to the bookies, as the secure sandbox's segment stores reach them;
   ``--no-ledger`` skips the row).

For every row: events (entries) per second, p50/p99 latency, and the CPU
seconds per 1,000 entries of the client process and of the sandbox's
processes (bookies, segment store, controller: ``/proc/<pid>/stat``).
Goals (issue 36): secure / plain >= 0.8x for both stream writers, >= 0.75x
for ledger writes.  ``--json`` prints one JSON object; progress goes to
stderr.  Run it on a quiet machine: the rows are rates.

    .venv/bin/python benchmarks/security_overhead.py [--seconds 10] [--outstanding 1024]
        [--event-bytes 100] [--segments 3] [--no-ledger] [--json] [--quiet]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pravega_client
import uvloop

from benchmarks._common import Progress
from benchmarks.pravega_write import ROUTING_KEYS, real_client_writes
from quire.bench import WriteBenchParams, bench_write, summarize
from quire.client import Client, ClientConfig
from quire.sandbox import Sandbox
from quire.sandbox_security import SandboxSecurity, prepare
from quire.streams import StreamAccess, StreamWriter

SCOPE, STREAM = "bench", "events"
GOALS = {"pravega_client": 0.8, "quire_stream_writer": 0.8, "ledger": 0.75}
LABELS = {"pravega_client": "pravega client write_event_async",
          "quire_stream_writer": "quire StreamWriter",
          "ledger": "ledger writes E3 W3 A2 1 KiB"}
_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def cpu_of(sandbox: Sandbox, into: dict[str, Any]) -> Iterator[None]:
    """Adds ``client_cpu_s`` and ``servers_cpu_s`` (the sandbox's processes)
    spent in the block to ``into``."""
    pids = [p.proc.pid for p in sandbox.processes if p.proc is not None]
    servers, client = sum(map(process_cpu_s, pids)), own_cpu_s()
    yield
    into["client_cpu_s"] = own_cpu_s() - client
    into["servers_cpu_s"] = sum(map(process_cpu_s, pids)) - servers


def per_thousand(result: dict[str, Any]) -> dict[str, float]:
    entries = max(1, int(result["entries"]))
    return {"client_cpu_ms_per_1k": result["client_cpu_s"] * 1e6 / entries,
            "servers_cpu_ms_per_1k": result["servers_cpu_s"] * 1e6 / entries}


async def quire_writes(access: StreamAccess, args: argparse.Namespace) -> dict[str, Any]:
    """Quire's StreamWriter for ``args.seconds``, ``args.outstanding`` in flight."""
    import asyncio

    controller, segments = access.clients()
    writer = StreamWriter(controller, segments, SCOPE, STREAM)
    await writer.start()
    payload = b"q" * args.event_bytes
    latencies: list[float] = []
    window = asyncio.Semaphore(args.outstanding)
    clock = time.perf_counter

    def acked(t0: float) -> Callable[[Any], None]:
        def done(_future: Any) -> None:
            latencies.append((clock() - t0) * 1000.0)
            window.release()
        return done

    started = clock()
    deadline = started + args.seconds
    i = 0
    try:
        while clock() < deadline:
            await window.acquire()
            writer.write_event(payload, f"key-{i % ROUTING_KEYS}").add_done_callback(
                acked(clock()))
            i += 1
        await writer.flush()
        elapsed = clock() - started
    finally:
        await writer.close()
        await segments.close()
        await controller.close()
    return summarize(latencies, elapsed, args.event_bytes)


async def ledger_writes(metadata_uri: str, security: SandboxSecurity | None,
                        args: argparse.Namespace) -> dict[str, Any]:
    config = ClientConfig() if security is None else ClientConfig(
        tls_ca=str(security.ca_file), tls_cert=str(security.node_cert_file),
        tls_key=str(security.node_key_file))
    client = await Client.connect(metadata_uri, config)
    try:
        return await bench_write(client, WriteBenchParams(
            ensemble_size=3, write_quorum_size=3, ack_quorum_size=2, entry_bytes=1024,
            outstanding=256, duration_s=args.seconds))
    finally:
        await client.close()


def run_mode(mode: str, args: argparse.Namespace, root: Path, progress: Progress
             ) -> dict[str, dict[str, Any]]:
    security = prepare(root / mode / "security") if mode == "secure" else None
    sandbox = Sandbox(root / mode, bookies=3, security=security)
    if security is not None:
        _ensure_admin(sandbox, security)
    progress.note(f"{mode}: starting 3 bookies, a segment store and the controller ...")
    sandbox.start()
    results: dict[str, dict[str, Any]] = {}
    try:
        assert sandbox.controller is not None
        uri = sandbox.controller.uri
        access = StreamAccess(uri)
        if security is not None:
            for name, value in security.client_environment().items():
                os.environ[name] = value
            access = StreamAccess(uri, str(security.ca_file), security.credentials())
        manager = pravega_client.StreamManager(uri, auth_enabled=security is not None,
                                               tls_enabled=security is not None)
        manager.create_scope(SCOPE)
        manager.create_stream(SCOPE, STREAM, args.segments)
        progress.note(f"{mode}: pravega client, {args.seconds:g} s")
        cpu: dict[str, Any] = {}
        with cpu_of(sandbox, cpu):
            real = uvloop.run(real_client_writes(manager, args))
        results["pravega_client"] = {**real, **cpu}
        progress.note(f"{mode}: quire StreamWriter, {args.seconds:g} s")
        cpu = {}
        with cpu_of(sandbox, cpu):
            own = uvloop.run(quire_writes(access, args))
        results["quire_stream_writer"] = {**own, **cpu}
        if args.ledger:
            progress.note(f"{mode}: ledger writes, {args.seconds:g} s")
            cpu = {}
            with cpu_of(sandbox, cpu):
                ledger = uvloop.run(ledger_writes(sandbox.metadata_uri, security, args))
            results["ledger"] = {**ledger, **cpu}
        for result in results.values():
            result.update(per_thousand(result))
        return results
    finally:
        progress.note(f"{mode}: stopping the sandbox ...")
        sandbox.stop()
        for name in ("pravega_client_tls_cert_path", "pravega_client_auth_method",
                     "pravega_client_auth_username", "pravega_client_auth_password"):
            os.environ.pop(name, None)


def _ensure_admin(sandbox: Sandbox, security: SandboxSecurity) -> None:
    from quire.auth import UserDatabase
    from quire.metadata import open_store

    async def ensure() -> None:
        store = await open_store(sandbox.metadata_uri)
        try:
            await security.ensure_admin(UserDatabase(store))
        finally:
            await store.close()

    uvloop.run(ensure())


def _line(label: str, r: dict[str, Any]) -> str:
    return (f"{label:<44} {r['entries_per_s']:>9,.0f}/s  p50 {r['p50_ms']:7.2f} ms  "
            f"p99 {r['p99_ms']:7.2f} ms  cpu/1k: client {r['client_cpu_ms_per_1k']:6.1f} ms, "
            f"servers {r['servers_cpu_ms_per_1k']:6.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each row")
    parser.add_argument("--outstanding", type=int, default=1024)
    parser.add_argument("--event-bytes", type=int, default=100)
    parser.add_argument("--segments", type=int, default=3)
    parser.add_argument("--no-ledger", dest="ledger", action="store_false",
                        help="skip the ledger row")
    parser.add_argument("--tmpdir", type=Path, default=None)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args()
    progress = Progress(not args.quiet)
    root = Path(tempfile.mkdtemp(prefix="quire-security-overhead-", dir=args.tmpdir))
    try:
        plain = run_mode("plain", args, root, progress)
        secure = run_mode("secure", args, root, progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratios = {name: {"ratio": secure[name]["entries_per_s"] / plain[name]["entries_per_s"],
                     "goal": GOALS[name]} for name in plain}
    for ratio in ratios.values():
        ratio["met"] = ratio["ratio"] >= ratio["goal"]
    if args.json:
        print(json.dumps({"params": {"seconds": args.seconds, "outstanding": args.outstanding,
                                     "event_bytes": args.event_bytes,
                                     "segments": args.segments, "tier1": "E=3 W=3 A=2"},
                          "plain": plain, "secure": secure, "ratios": ratios}, indent=2))
        return
    print(f"\n{args.event_bytes} B events, {args.outstanding} outstanding, {args.seconds:g} s "
          f"per row, {args.segments}-segment stream, tier-1 E=3 W=3 A=2")
    for name in plain:
        print(_line(f"{LABELS[name]} (plain)", plain[name]))
        print(_line(f"{LABELS[name]} (secure)", secure[name]))
    for name, ratio in ratios.items():
        print(f"{LABELS[name]}: secure / plain = {ratio['ratio']:.2f}x (goal >= "
              f"{ratio['goal']:.2f}x: {'met' if ratio['met'] else 'NOT met'})")


if __name__ == "__main__":
    main()
