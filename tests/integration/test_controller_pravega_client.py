"""The real Pravega client (PyPI ``pravega`` 0.3.8, unmodified) administers
scopes and streams through Quire's controller."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from tests.support.controller import make_cluster

ROOT = Path(__file__).resolve().parents[2]


async def test_the_pravega_client_creates_lists_seals_and_deletes() -> None:
    cluster = await make_cluster()
    try:
        assert cluster.controller is not None
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.support.pravega_admin", str(cluster.controller.port),
            cwd=ROOT, stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0
        answers = {line["call"]: line for line in map(json.loads, out.decode().splitlines())}
    finally:
        await cluster.stop()
        await cluster.metadata.close()

    def result(call: str) -> object:
        assert "error" not in answers[call], answers[call]
        return answers[call]["result"]

    assert (result("create_scope"), result("create_scope_again")) == (True, False)
    assert (result("create_stream"), result("create_stream_again")) == (True, False)
    assert result("create_stream_auto_scaled") is True
    assert result("create_stream_with_policy") is True
    assert result("tags") == ["t1", "t2"]
    assert result("update_stream") is True
    assert result("tags_updated") == ["t3"]
    assert result("list_scope") == ["sc"]
    assert sorted(result("list_stream")) == ["auto", "st", "tagged"]  # type: ignore[call-overload]
    assert "Not Sealed" in answers["delete_unsealed"]["error"]
    assert "not empty" in answers["delete_scope_with_streams"]["error"]
    for call in ("seal", "delete", "seal_auto", "delete_auto", "seal_tagged", "delete_tagged",
                 "delete_scope"):
        assert result(call) is True
    assert result("delete_scope_again") is False
