"""Bookie processes serving TLS with mutual TLS (roles ``bookie`` and
``client`` allowed): an E3 W3 A2 round trip through the client and the CLI;
peers without a certificate, with a role not allowed, or with another CA's
certificate refused before a request is read; plaintext and garbage on the
TLS port close that connection only; certificates replaced on disk serve new
handshakes while open connections keep working.  And, on the same cluster,
a ledger whose metadata record predates the derived keys (it holds the
password): it opens and recovers, and its next write migrates it."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import sqlite3
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from cryptography import x509

from quire.client import Client, ClientConfig
from quire.errors import (
    BookieUnavailableError,
    EntryNotAvailableError,
    StatusCode,
    UnauthorizedError,
)
from quire.metadata import serialize
from quire.protocol import ReadRequest, ReadResponse
from quire.security.certificates import issue_certificate, make_ca
from quire.types import LedgerState
from tests.support.bookies import RawBookieClient
from tests.support.cluster import Cluster
from tests.support.repair import scrape
from tests.support.tls import Pki, secure_bookies

Connect = Callable[..., Awaitable[Client]]
PW = b"tls pw"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("tls-cluster"), 3, metrics_port=0,
                      tls_reload_interval_ms=0)
    secure_bookies(cluster, pki)
    yield cluster.start()
    cluster.close()


@pytest.fixture
async def written(tls_cluster: Cluster, connect: Connect) -> AsyncIterator[int]:
    """A closed E3 W3 A2 ledger of 20 entries, written over TLS."""
    client = await connect(tls_cluster)
    ledger = await client.create_ledger(3, 3, 2, password=PW)
    await asyncio.gather(*(ledger.append(b"entry %d" % i) for i in range(20)))
    await ledger.close()
    yield ledger.ledger_id


def requests_served(cluster: Cluster, index: int) -> float:
    """Requests bookie ``index`` answered so far (every op, every status)."""
    return sum(value for name, value in scrape(cluster.bookies[index]).items()
               if name.startswith("quire_bookie_") and "_request_count" in name)


def refusals(cluster: Cluster, index: int, reason: str) -> float:
    return scrape(cluster.bookies[index]).get(
        f'quire_bookie_connection_refusals_total{{reason="{reason}"}}', 0.0)


async def closed_without_an_answer(raw: RawBookieClient, ledger_id: int) -> None:
    """A request on ``raw`` gets no answer: the connection closes."""
    with pytest.raises(ConnectionError):
        await raw.call(ReadRequest(raw.next_id(), ledger_id, 0), timeout_s=10)
    await asyncio.wait_for(raw.closed, 10)


async def served_entry_0(raw: RawBookieClient, ledger_id: int) -> None:
    answer = await raw.call(ReadRequest(raw.next_id(), ledger_id, 0))
    assert isinstance(answer, ReadResponse) and answer.status == StatusCode.OK
    assert answer.entry is not None and answer.entry.endswith(b"entry 0")


async def test_an_e3_w3_a2_round_trip_over_tls_through_the_client_and_the_cli(
        tls_cluster: Cluster, connect: Connect, written: int, pki: Pki) -> None:
    reader = await (await connect(tls_cluster)).open_ledger(written, password=PW,
                                                            recovery=True)
    assert [e.data for e in await reader.read(0, 19)] == [b"entry %d" % i for i in range(20)]
    tls = tls_cluster.client_settings
    env = {**os.environ, "QUIRE_TLS_CA": tls["tls_ca"], "QUIRE_TLS_CERT": tls["tls_cert"],
           "QUIRE_TLS_KEY": tls["tls_key"], "QUIRE_LEDGER_PASSWORD": PW.decode()}
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "quire.cli.main", "ledger", "read", str(written),
                         "--first", "18", "--metadata", tls_cluster.metadata_uri, "--json"],
        capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert [base64.b64decode(e["payload"]) for e in json.loads(done.stdout)] == [
        b"entry 18", b"entry 19"]


async def test_peers_without_an_accepted_certificate_are_refused_before_a_request_is_read(
        tls_cluster: Cluster, written: int, pki: Pki, tmp_path: Path) -> None:
    address = tls_cluster.bookies[0].address
    served = await asyncio.to_thread(requests_served, tls_cluster, 0)
    handshakes = await asyncio.to_thread(refusals, tls_cluster, 0, "tls_handshake")
    roles = await asyncio.to_thread(refusals, tls_cluster, 0, "tls_role")
    stranger = make_ca(tmp_path / "other-ca", "another CA")
    peers = {
        "no certificate": pki.context(None),
        "a role not allowed": pki.context(pki.issue("intruder", "intruder")),
        "another CA's certificate": pki.context(issue_certificate(
            stranger, tmp_path / "stranger", "stranger", role="client")),
    }
    for context in peers.values():
        try:
            raw = await RawBookieClient.connect(address, context)
        except (ssl.SSLError, ConnectionError):
            continue  # refused in the handshake itself (TLS 1.2 ends it there)
        await closed_without_an_answer(raw, written)  # (TLS 1.3: right after it)
        raw.close()
    assert await asyncio.to_thread(refusals, tls_cluster, 0, "tls_handshake") == handshakes + 2
    assert await asyncio.to_thread(refusals, tls_cluster, 0, "tls_role") == roles + 1
    assert await asyncio.to_thread(requests_served, tls_cluster, 0) == served

    # the ledger client without a certificate: refused at once, not timed out
    client = await Client.connect(tls_cluster.metadata_uri, ClientConfig(
        tls_ca=str(pki.ca.cert_file), read_timeout_ms=30_000))
    try:
        started = asyncio.get_running_loop().time()
        reader = await client.open_ledger(written, password=PW, recovery=False)
        with pytest.raises((EntryNotAvailableError, BookieUnavailableError)):
            await reader.read(0, 0)
        assert asyncio.get_running_loop().time() - started < 10
    finally:
        await client.close()


async def test_plaintext_and_garbage_on_the_tls_port_close_that_connection_only(
        tls_cluster: Cluster, connect: Connect, written: int) -> None:
    address = tls_cluster.bookies[1].address
    before = await asyncio.to_thread(refusals, tls_cluster, 1, "tls_handshake")
    plain = await RawBookieClient.connect(address)  # a bookie client without TLS
    await closed_without_an_answer(plain, written)
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as garbage:
        garbage.sendall(os.urandom(64))
        assert garbage.recv(100) == b""  # closed
    assert await asyncio.to_thread(refusals, tls_cluster, 1, "tls_handshake") == before + 2
    raw = await RawBookieClient.connect(address, tls_cluster.client_tls)  # still serving
    try:
        await served_entry_0(raw, written)
    finally:
        raw.close()


def serial_of(raw: RawBookieClient) -> int:
    assert raw.transport is not None
    der = raw.transport.get_extra_info("ssl_object").getpeercert(binary_form=True)
    return int(x509.load_der_x509_certificate(der).serial_number)


async def test_replaced_certificates_serve_new_handshakes_while_open_connections_work(
        tls_cluster: Cluster, pki: Pki, written: int) -> None:
    bookie = tls_cluster.bookies[2]
    address, cert_file = bookie.address, Path(bookie.settings["tls_cert_file"])
    before = await RawBookieClient.connect(address, tls_cluster.client_tls)
    try:
        old_serial = serial_of(before)
        renewed = pki.issue(bookie.bookie_id, "bookie")  # the same files, rewritten
        assert renewed.cert_file == cert_file
        new_serial = x509.load_pem_x509_certificate(cert_file.read_bytes()).serial_number
        assert new_serial != old_serial
        after = await RawBookieClient.connect(address, tls_cluster.client_tls)
        try:
            assert serial_of(after) == new_serial
            for raw in (before, after):  # the open connection keeps working, as the new one
                await served_entry_0(raw, written)
        finally:
            after.close()
    finally:
        before.close()


def rewrite_as_version_1(metadata_db: Path, ledger_id: int, password: bytes) -> None:
    """Put the ledger's metadata back in the format written before the
    derived keys: version 1, the password itself."""
    with sqlite3.connect(metadata_db) as db:
        data, = db.execute("SELECT data FROM ledgers WHERE id = ?", (ledger_id,)).fetchone()
        doc = json.loads(data)
        del doc["master_key"], doc["mac_key"]
        doc.update(format_version=1, password=base64.b64encode(password).decode())
        db.execute("UPDATE ledgers SET data = ? WHERE id = ?",
                   (json.dumps(doc).encode(), ledger_id))


def stored_doc(metadata_db: Path, ledger_id: int) -> dict[str, object]:
    with sqlite3.connect(metadata_db) as db:
        data, = db.execute("SELECT data FROM ledgers WHERE id = ?", (ledger_id,)).fetchone()
    return json.loads(data)  # type: ignore[no-any-return]


async def test_a_record_holding_the_password_opens_recovers_and_is_migrated_at_its_next_write(
        tls_cluster: Cluster, connect: Connect) -> None:
    db = tls_cluster.root / "metadata.db"
    writer = await connect(tls_cluster)
    ledger = await writer.create_ledger(3, 3, 2, password=PW)
    await asyncio.gather(*(ledger.append(b"old %d" % i) for i in range(10)))
    await writer.close()  # the writer is gone, its ledger OPEN
    rewrite_as_version_1(db, ledger.ledger_id, PW)
    assert stored_doc(db, ledger.ledger_id)["format_version"] == 1

    client = await connect(tls_cluster)
    reader = await client.open_ledger(ledger.ledger_id, password=PW, recovery=False)
    assert reader.metadata.state is LedgerState.OPEN
    with pytest.raises(UnauthorizedError):
        await client.open_ledger(ledger.ledger_id, password=b"wrong", recovery=False)
    assert stored_doc(db, ledger.ledger_id)["format_version"] == 1  # read as it is

    recovered = await client.open_ledger(ledger.ledger_id, password=PW, recovery=True)
    assert recovered.metadata.state is LedgerState.CLOSED
    assert recovered.metadata.last_entry_id == 9
    assert [e.data for e in await recovered.read(0, 9)] == [b"old %d" % i for i in range(10)]
    migrated = stored_doc(db, ledger.ledger_id)  # the recovery's writes: version 2, the keys
    assert migrated["format_version"] == 2 and "password" not in migrated
    assert json.loads(serialize(recovered.metadata)) == migrated
