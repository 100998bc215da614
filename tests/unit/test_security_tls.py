"""quire.security's TLS on loopback: certificates from the local CA, real
handshakes between asyncio servers and clients (and gRPC), mutual TLS and
roles, and certificates replaced on disk while connections stay open."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509

from quire.errors import InsecureSecretFileError, RoleNotAllowedError, TlsConfigError
from quire.security import (
    ClientCertificates,
    ClientTls,
    SecurityConfig,
    ServerTls,
    certificate_role,
    client_context,
    grpc_channel_credentials,
    require_role,
)
from quire.security.certificates import (
    CertificateAuthority,
    CertificateFiles,
    issue_certificate,
    make_ca,
)


@dataclass
class Pki:
    ca: CertificateAuthority
    server: CertificateFiles
    client: CertificateFiles
    other_ca: CertificateAuthority


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = make_ca(tmp_path / "ca")
    return Pki(ca, issue_certificate(ca, tmp_path / "server", "server", role="bookie",
                                     ip_addresses=("127.0.0.1",)),
               issue_certificate(ca, tmp_path / "client", "client", role="client",
                                 server=False),
               make_ca(tmp_path / "other", "another CA"))


def test_the_ca_and_certificates_are_pem_files_with_private_keys_0600(pki: Pki) -> None:
    for key in (pki.ca.files.key_file, pki.server.key_file, pki.client.key_file):
        assert key.stat().st_mode & 0o777 == 0o600
    cert = x509.load_pem_x509_certificate(pki.server.cert_file.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.issuer == pki.ca.certificate.subject
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    again = CertificateAuthority.load(pki.ca.files.cert_file, pki.ca.files.key_file)
    assert again.certificate == pki.ca.certificate


class Echo:
    """An asyncio TLS echo server that remembers its peers' certificates."""

    def __init__(self) -> None:
        self.peer_certs: list[dict[str, Any] | None] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.peer_certs.append(writer.get_extra_info("peercert"))
        self.writers.append(writer)
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            while data := await reader.read(100):
                writer.write(data)
                await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def echo_server(tls: ServerTls) -> AsyncIterator[tuple[int, Echo]]:
    echo = Echo()
    server = await asyncio.start_server(echo.handle, "127.0.0.1", 0, ssl=tls.context)
    try:
        yield server.sockets[0].getsockname()[1], echo
    finally:
        server.close()
        for writer in echo.writers:
            writer.close()
        await server.wait_closed()


async def connect(port: int, context: ssl.SSLContext, host: str = "localhost"
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname=host), 10)


async def echoes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 data: bytes = b"ping") -> bool:
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(data)), 10) == data


def serial_of(writer: asyncio.StreamWriter) -> int:
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    return int(x509.load_der_x509_certificate(der).serial_number)


def serial_in(files: CertificateFiles) -> int:
    return int(x509.load_pem_x509_certificate(files.cert_file.read_bytes()).serial_number)


async def test_a_handshake_on_loopback_with_host_name_checks(pki: Pki) -> None:
    tls = ServerTls(pki.server.cert_file, pki.server.key_file)
    async with echo_server(tls) as (port, echo):
        trusting = client_context(pki.ca.cert_file)
        reader, writer = await connect(port, trusting)
        assert await echoes(reader, writer)
        assert writer.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
        writer.close()
        reader, writer = await connect(port, trusting, host="127.0.0.1")  # the IP SAN
        assert await echoes(reader, writer)
        writer.close()
        with pytest.raises(ssl.SSLCertVerificationError, match=r"match|mismatch"):
            await connect(port, trusting, host="example.com")
        with pytest.raises(ssl.SSLCertVerificationError):  # a CA that did not sign it
            await connect(port, client_context(pki.other_ca.cert_file))
        assert echo.peer_certs[0] is None  # no client certificate asked


@pytest.mark.parametrize("reloaded", [False, True])
async def test_mutual_tls_gives_the_peers_role(pki: Pki, tmp_path: Path, reloaded: bool) -> None:
    tls = ServerTls(pki.server.cert_file, pki.server.key_file, pki.ca.cert_file,
                    client_certs=ClientCertificates.REQUIRED, reload_interval_ms=0)
    if reloaded:  # handshakes moved onto a reloaded context check clients alike
        issue_certificate(pki.ca, tmp_path / "server", "server", role="bookie")
        assert tls.check() and tls.generation == 1
    async with echo_server(tls) as (port, echo):
        with_cert = client_context(pki.ca.cert_file, pki.client.cert_file, pki.client.key_file)
        reader, writer = await connect(port, with_cert)
        assert await echoes(reader, writer)
        writer.close()
        peer = echo.peer_certs[-1]
        assert certificate_role(peer) == "client"
        assert certificate_role(peer, "CN") == "client"
        assert require_role(peer, {"client", "bookie"}) == "client"
        with pytest.raises(RoleNotAllowedError, match=r"'client'.*bookie"):
            require_role(peer, {"bookie"})
        with pytest.raises(RoleNotAllowedError, match="no certificate"):
            require_role(None, {"client"})
        with pytest.raises(RoleNotAllowedError, match="no O role"):
            require_role(peer, {"client"}, field="O")
        # no certificate: the handshake fails (TLS 1.3 reports it on the first read)
        reader, writer = await connect(port, client_context(pki.ca.cert_file))
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await echoes(reader, writer)
        writer.close()
        assert len(echo.peer_certs) == 1  # the server never served it


def test_role_fields_by_short_or_long_name_and_comma_lists() -> None:
    cert = {"subject": ((("commonName", "b1"),), (("organizationalUnitName", "bookie,ops"),))}
    assert certificate_role(cert) == "bookie"
    assert certificate_role(cert, "organizationalUnitName") == "bookie"
    assert certificate_role(cert, "cn") == "b1"
    assert certificate_role({}, "OU") is None and certificate_role(None) is None


async def test_replaced_certificate_files_serve_new_handshakes_and_keep_open_connections(
        pki: Pki, tmp_path: Path) -> None:
    tls = ServerTls(pki.server.cert_file, pki.server.key_file, reload_interval_ms=0)
    trusting = client_context(pki.ca.cert_file)
    async with echo_server(tls) as (port, _echo):
        old_reader, old_writer = await connect(port, trusting)
        old_serial = serial_of(old_writer)
        assert old_serial == serial_in(pki.server)
        renewed = issue_certificate(pki.ca, tmp_path / "server", "server", role="bookie")
        assert renewed == pki.server and serial_in(renewed) != old_serial  # same files
        renewed_serial = serial_in(renewed)
        reader, writer = await connect(port, trusting)
        assert serial_of(writer) == renewed_serial  # the new handshake: the new one
        assert tls.generation == 1
        assert await echoes(reader, writer)
        assert await echoes(old_reader, old_writer, b"still open")  # the old one lives on
        writer.close()
        # a certificate without its key (a half-done replacement) is not taken
        stray = issue_certificate(pki.ca, tmp_path / "stray", "server")
        pki.server.cert_file.write_bytes(stray.cert_file.read_bytes())
        reader, writer = await connect(port, trusting)
        assert serial_of(writer) == renewed_serial and tls.generation == 1
        writer.close()
        pki.server.key_file.write_bytes(stray.key_file.read_bytes())  # now the pair is whole
        reader, writer = await connect(port, trusting)
        assert serial_of(writer) == serial_in(stray) and tls.generation == 2
        writer.close()
        assert await echoes(old_reader, old_writer)
        old_writer.close()


def test_reloads_are_looked_for_at_most_every_interval(pki: Pki, tmp_path: Path) -> None:
    now = [100.0]
    tls = ServerTls(pki.server.cert_file, pki.server.key_file, reload_interval_ms=1000,
                    clock=lambda: now[0])
    issue_certificate(pki.ca, tmp_path / "server", "server")
    now[0] += 0.5
    assert not tls.check()  # too soon to look
    now[0] += 0.6
    assert tls.check() and tls.generation == 1
    assert not tls.check(force=True)  # nothing changed since


def test_a_long_lived_clients_files_are_reloaded_when_they_change(
        pki: Pki, tmp_path: Path) -> None:
    now = [100.0]
    tls = ClientTls(pki.ca.cert_file, pki.client.cert_file, pki.client.key_file,
                    reload_interval_ms=1000, clock=lambda: now[0])
    first = tls.context()
    assert tls.context() is first  # nothing changed: the same context
    renewed = issue_certificate(pki.ca, tmp_path / "client", "client", role="client")
    assert renewed == pki.client
    assert tls.context() is first  # too soon to look
    now[0] += 1.1
    second = tls.context()
    assert second is not first  # the renewed certificate, from the next connection on
    pki.client.key_file.write_bytes(b"not a key")  # a half-done replacement: kept the last
    now[0] += 1.1
    assert tls.context() is second
    with pytest.raises(TlsConfigError):
        ClientTls(pki.ca.cert_file, pki.client.cert_file, pki.client.key_file)


def test_bad_files_refuse_the_start(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(TlsConfigError, match="cannot load the certificate"):
        ServerTls(pki.server.cert_file, pki.client.key_file)  # not its key
    with pytest.raises(TlsConfigError, match=r"cannot read|cannot load"):
        ServerTls(tmp_path / "missing.crt", pki.server.key_file)
    with pytest.raises(TlsConfigError, match="tls_ca_file"):
        ServerTls(pki.server.cert_file, pki.server.key_file,
                  client_certs=ClientCertificates.OPTIONAL)
    pki.server.key_file.chmod(0o644)
    with pytest.raises(InsecureSecretFileError, match="chmod 600"):
        ServerTls(pki.server.cert_file, pki.server.key_file)


def test_from_config_asks_client_certificates_only_with_a_ca(pki: Pki) -> None:
    assert ServerTls.from_config(SecurityConfig()) is None
    plain = ServerTls.from_config(SecurityConfig(tls_cert_file=str(pki.server.cert_file),
                                                 tls_key_file=str(pki.server.key_file)))
    assert plain is not None and plain.client_certs is ClientCertificates.NONE
    assert plain.context.verify_mode == ssl.CERT_NONE
    mutual = ServerTls.from_config(SecurityConfig(
        tls_cert_file=str(pki.server.cert_file), tls_key_file=str(pki.server.key_file),
        tls_ca_file=str(pki.ca.cert_file)))
    assert mutual is not None and mutual.context.verify_mode == ssl.CERT_OPTIONAL


async def test_grpc_credentials_reload_like_the_context(pki: Pki, tmp_path: Path) -> None:
    tls = ServerTls(pki.server.cert_file, pki.server.key_file, reload_interval_ms=0)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Echo", {
        "Echo": grpc.unary_unary_rpc_method_handler(lambda request, _context: request)}),))
    port = server.add_secure_port("127.0.0.1:0", tls.grpc_credentials())
    await server.start()

    async def call(ca: Path) -> bytes:
        async with grpc.aio.secure_channel(
                f"localhost:{port}", grpc_channel_credentials(ca)) as channel:
            answer: bytes = await channel.unary_unary("/t.Echo/Echo")(b"hi", timeout=10)
            return answer

    try:
        assert await call(pki.ca.cert_file) == b"hi"
        with pytest.raises(grpc.aio.AioRpcError):  # the other CA's clients are refused...
            await call(pki.other_ca.cert_file)
        issue_certificate(pki.other_ca, tmp_path / "server", "server")  # ...until it signs
        assert await call(pki.other_ca.cert_file) == b"hi"
        assert tls.generation == 1
    finally:
        await server.stop(None)
