"""The bookie's TLS listener in the test's own process, on asyncio's loop
(bookie processes run uvloop, which the integration tests cover): a
certificate with an allowed role is served, one with another role and a
plaintext client are closed, and a bookie stops with a handshake still
waiting."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quire.errors import StatusCode
from quire.protocol import ReadRequest, ReadResponse
from quire.security import SecurityConfig
from tests.support.bookie_node import node_at, node_config
from tests.support.bookies import RawBookieClient
from tests.support.tls import Pki


async def test_tls_and_roles_on_asyncio_and_a_stop_with_a_handshake_waiting(
        tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    own = pki.issue("b1", "bookie")
    config = node_config(tmp_path, tls_allowed_roles=("client",), security=SecurityConfig(
        tls_cert_file=str(own.cert_file), tls_key_file=str(own.key_file),
        tls_ca_file=str(pki.ca.cert_file)))
    async with node_at(config) as node:
        address = node.address
        served = await RawBookieClient.connect(address, pki.context(pki.issue("c", "client")))
        answer = await served.call(ReadRequest(served.next_id(), 7, 0))
        assert isinstance(answer, ReadResponse) and answer.status == StatusCode.NO_SUCH_LEDGER
        served.close()
        for context in (pki.context(pki.issue("other", "bookie")), None):  # role; plaintext
            refused = await RawBookieClient.connect(address, context)
            with pytest.raises(ConnectionError):
                await refused.call(ReadRequest(refused.next_id(), 7, 0), timeout_s=10)
        refusals = node.metrics.connection_refusals
        assert refusals.labels("tls_role")._value.get() == 1
        assert refusals.labels("tls_handshake")._value.get() == 1
        host, port = address.rsplit(":", 1)
        _reader, waiting = await asyncio.open_connection(host, int(port))  # sends nothing
    waiting.close()  # (the bookie stopped with its handshake in progress)
    assert node.server.hub.admitted == 0
