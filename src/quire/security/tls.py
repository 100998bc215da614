"""TLS for Quire's servers and clients: contexts, certificate reloading, peer roles.

Servers take a :class:`ServerTls` built from PEM files (``tls_cert_file``,
``tls_key_file``, and ``tls_ca_file`` when peers must show certificates):
its :attr:`ServerTls.context` goes to ``asyncio``/``aiohttp`` servers and
:meth:`ServerTls.grpc_credentials` to a gRPC server.  Clients take
:func:`client_context` (or :func:`grpc_channel_credentials`), or a
:class:`ClientTls` when they live long (a bookie's, a segment store's
connections to bookies): its context is rebuilt when the files change.
TLS 1.2 is the oldest version either side speaks.

**Reloading** (BookKeeper #2154: rotate certificates without a restart).
Decisions:

* The files are watched by their ``stat`` (device, inode, size, mtime in
  ns), looked at during a handshake at most every ``reload_interval_ms``
  (0: at every one); there is no watcher task or thread.  A change is seen
  by the first handshake after it plus at most that interval.
* A change builds a **new** ``SSLContext`` from the files; only if it
  loads (the key matches the certificate, the PEM parses) does it replace
  the current one.  A half-written pair therefore never breaks the
  server: it keeps presenting the old certificate (a warning is logged
  once per bad state) until the files make sense again.
* The context handed to the server stays the same object all along; its
  ClientHello callback (``sni_callback``, which OpenSSL calls for every
  handshake, with or without SNI) moves each new handshake onto the
  current context (``SSLObject.context = ...``, how SNI picks a
  certificate).  Open connections keep the context they started with, so
  nothing open is dropped; new handshakes present the new certificate.
* gRPC: ``grpc.dynamic_ssl_server_credentials`` asks its fetcher before
  every new connection's handshake; the fetcher runs the same check and
  answers the new PEM when the generation changed.  It runs on gRPC's
  threads, hence the lock.
* The private key is a secret file: it is refused when its group or
  others may read or write it (:func:`~quire.security.secrets.check_secret_file`).

**Roles** (BookKeeper's ``BookieAuthZFactory``): a peer's role is the
first value of a configurable subject field of its verified certificate
(``OU`` by default; a value ``a,b`` gives the role ``a``), and
:func:`require_role` refuses a role outside the allowed set.
"""

from __future__ import annotations

import enum
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from quire.errors import ConfigError, RoleNotAllowedError, TlsConfigError
from quire.security.config import SecurityConfig
from quire.security.secrets import check_secret_file

log = logging.getLogger("quire.security")

MIN_TLS_VERSION = ssl.TLSVersion.TLSv1_2


class ClientCertificates(enum.Enum):
    """Whether a server asks its clients for a certificate."""

    NONE = "none"
    """Not asked (anyone may connect; authenticate some other way)."""
    OPTIONAL = "optional"
    """Asked, and verified against the CA if shown; a client may show none."""
    REQUIRED = "required"
    """A client without a certificate the CA signed fails the handshake."""


def _load_chain(context: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    check_secret_file(key_file)
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as e:
        raise TlsConfigError(f"cannot load the certificate {cert_file} with the key "
                             f"{key_file}: {e}") from None


def _load_ca(context: ssl.SSLContext, ca_file: str) -> None:
    try:
        context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise TlsConfigError(f"cannot load the CA certificates {ca_file}: {e}") from None


def server_context(cert_file: str, key_file: str, ca_file: str | None = None,
                   client_certs: ClientCertificates = ClientCertificates.NONE
                   ) -> ssl.SSLContext:
    """A server context of these files (TlsConfigError if they do not load)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MIN_TLS_VERSION
    _load_chain(context, cert_file, key_file)
    if client_certs is not ClientCertificates.NONE:
        if not ca_file:
            raise TlsConfigError("asking clients for certificates needs tls_ca_file")
        _load_ca(context, ca_file)
        context.verify_mode = (ssl.CERT_REQUIRED if client_certs is ClientCertificates.REQUIRED
                               else ssl.CERT_OPTIONAL)
    return context


def client_context(ca_file: str | Path, cert_file: str | Path | None = None,
                   key_file: str | Path | None = None) -> ssl.SSLContext:
    """A client context trusting only ``ca_file``'s CAs, checking the
    server's host name, and showing ``cert_file``/``key_file`` if given."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
    context.minimum_version = MIN_TLS_VERSION
    _load_ca(context, str(ca_file))
    if bool(cert_file) != bool(key_file):
        raise TlsConfigError("a client certificate and its key go together")
    if cert_file and key_file:
        _load_chain(context, str(cert_file), str(key_file))
    return context


def grpc_channel_credentials(ca_file: str | Path, cert_file: str | Path | None = None,
                             key_file: str | Path | None = None) -> Any:
    """``grpc.ssl_channel_credentials`` of the same files as :func:`client_context`."""
    import grpc

    def read(path: str | Path | None) -> bytes | None:
        try:
            return Path(path).read_bytes() if path else None
        except OSError as e:
            raise TlsConfigError(f"cannot read {path}: {e.strerror or e}") from None

    if key_file:
        check_secret_file(key_file)
    return grpc.ssl_channel_credentials(read(ca_file), read(key_file), read(cert_file))


_Signature = tuple[tuple[int, int, int, int] | None, ...]


def _signature(paths: tuple[str, ...]) -> _Signature:
    out: list[tuple[int, int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
            continue
        out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


class ServerTls:
    """A server's TLS, reloaded when its files change (module docstring).

    ``clock`` is monotonic seconds.  Construction loads the files once
    (TlsConfigError if they do not load: a server does not start on a bad
    certificate); later failures only log.
    """

    def __init__(self, cert_file: str | Path, key_file: str | Path,
                 ca_file: str | Path | None = None, *,
                 client_certs: ClientCertificates = ClientCertificates.NONE,
                 reload_interval_ms: int = 1000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cert_file, self.key_file = str(cert_file), str(key_file)
        self.ca_file = str(ca_file) if ca_file else None
        self.client_certs = client_certs
        self._paths = tuple(p for p in (self.cert_file, self.key_file, self.ca_file) if p)
        self._interval_s = reload_interval_ms / 1000
        self._clock = clock
        self._lock = threading.Lock()
        self._bad: _Signature | None = None
        self.generation = 0
        """+1 at each reload."""
        self._signature, self._current, self._pem = self._load()
        self.context = self._current
        """The context to give the server: the same object for the server's
        life; each handshake is moved onto the current certificate."""
        self.context.sni_callback = self._on_hello
        self._checked_at = clock()

    @classmethod
    def from_config(cls, config: SecurityConfig,
                    client_certs: ClientCertificates | None = None) -> ServerTls | None:
        """The TLS of a server's :class:`SecurityConfig` (None without
        ``tls_cert_file``); clients' certificates are asked (OPTIONAL) when
        ``tls_ca_file`` is set, unless ``client_certs`` says otherwise."""
        if not config.tls_enabled:
            return None
        if client_certs is None:
            client_certs = (ClientCertificates.OPTIONAL if config.tls_ca_file
                            else ClientCertificates.NONE)
        return cls(config.tls_cert_file, config.tls_key_file, config.tls_ca_file or None,
                   client_certs=client_certs, reload_interval_ms=config.tls_reload_interval_ms)

    def _load(self) -> tuple[_Signature, ssl.SSLContext, tuple[bytes, bytes, bytes | None]]:
        """The files' signature, a context and the PEM bytes of them.  The
        signature is taken first: a change during the load is seen again."""
        signature = _signature(self._paths)
        try:
            pem = (Path(self.cert_file).read_bytes(), Path(self.key_file).read_bytes(),
                   Path(self.ca_file).read_bytes() if self.ca_file else None)
        except OSError as e:
            raise TlsConfigError(f"cannot read {e.filename}: {e.strerror or e}") from None
        context = server_context(self.cert_file, self.key_file, self.ca_file,
                                 self.client_certs)
        return signature, context, pem

    def check(self, force: bool = False) -> bool:
        """Reload if the files changed (looked at most every interval unless
        ``force``); True if a new certificate is now served."""
        with self._lock:
            now = self._clock()
            if not force and now - self._checked_at < self._interval_s:
                return False
            self._checked_at = now
            signature = _signature(self._paths)
            if signature == self._signature or signature == self._bad:
                return False
            try:
                self._signature, self._current, self._pem = self._load()
            except TlsConfigError as e:
                self._bad = signature
                log.warning("TLS files changed but do not load; still serving the previous "
                            "certificate: %s", e)
                return False
            self.generation += 1
            log.info("TLS certificate %s reloaded (generation %d)", self.cert_file,
                     self.generation)
            return True

    def _on_hello(self, ssl_object: ssl.SSLObject | ssl.SSLSocket, _server_name: str | None,
                  context: ssl.SSLContext) -> None:
        self.check()
        current = self._current
        if current is not context:
            ssl_object.context = current

    def grpc_credentials(self) -> Any:
        """``grpc.dynamic_ssl_server_credentials`` of these files, reloaded
        like the context.  gRPC's choice is "required or not asked": a
        client certificate is required only with REQUIRED."""
        import grpc

        def configuration() -> Any:
            cert, key, ca = self._pem
            return grpc.ssl_server_certificate_configuration(
                [(key, cert)], root_certificates=ca if self.client_certs is not
                ClientCertificates.NONE else None)

        served = [self.generation]

        def fetch() -> Any:
            self.check()
            if self.generation == served[0]:
                return None
            served[0] = self.generation
            return configuration()

        return grpc.dynamic_ssl_server_credentials(
            configuration(), fetch,
            require_client_authentication=self.client_certs is ClientCertificates.REQUIRED)


class ClientTls:
    """A long-lived client's TLS: :func:`client_context` of these files,
    built again when they change (a renewed client certificate is shown
    from the next connection on; open connections keep theirs).  The files
    are looked at when :meth:`context` is called (once per connection
    made), at most every ``reload_interval_ms``; files that do not load
    keep the previous context (logged once per bad state).  Construction
    loads them (TlsConfigError if they do not load)."""

    def __init__(self, ca_file: str | Path, cert_file: str | Path | None = None,
                 key_file: str | Path | None = None, *, reload_interval_ms: int = 1000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ca_file = str(ca_file)
        self.cert_file = str(cert_file) if cert_file else None
        self.key_file = str(key_file) if key_file else None
        self._paths = tuple(p for p in (self.ca_file, self.cert_file, self.key_file) if p)
        self._interval_s = reload_interval_ms / 1000
        self._clock = clock
        self._signature = _signature(self._paths)
        self._bad: _Signature | None = None
        self._context = client_context(self.ca_file, self.cert_file, self.key_file)
        self._checked_at = clock()

    def context(self) -> ssl.SSLContext:
        """The context for a new connection (reloaded if the files changed)."""
        now = self._clock()
        if now - self._checked_at >= self._interval_s:
            self._checked_at = now
            signature = _signature(self._paths)
            if signature != self._signature and signature != self._bad:
                try:
                    self._context = client_context(self.ca_file, self.cert_file, self.key_file)
                    self._signature = signature
                    log.info("client TLS files reloaded (%s)", self.cert_file or self.ca_file)
                except ConfigError as e:  # TlsConfigError, InsecureSecretFileError
                    self._bad = signature
                    log.warning("client TLS files changed but do not load; still using the "
                                "previous ones: %s", e)
        return self._context


_FIELDS = {"CN": "commonName", "OU": "organizationalUnitName", "O": "organizationName",
           "C": "countryName", "L": "localityName", "ST": "stateOrProvinceName",
           "SERIALNUMBER": "serialNumber", "UID": "userId"}


def certificate_role(certificate: Mapping[str, Any] | None, field: str = "OU") -> str | None:
    """The role in a verified peer certificate (``getpeercert()``'s dict,
    e.g. ``transport.get_extra_info("peercert")``): the first value of
    subject field ``field`` (``OU``, ``CN``... or a long name such as
    ``organizationalUnitName``), up to a comma; None without one."""
    if not certificate:
        return None
    name = _FIELDS.get(field.upper(), field)
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == name:
                role = str(value).split(",")[0].strip()
                return role or None
    return None


def require_role(certificate: Mapping[str, Any] | None, allowed: Collection[str],
                 field: str = "OU") -> str:
    """The peer's role if it is one of ``allowed``; RoleNotAllowedError
    (naming what was found) otherwise, a peer without a certificate
    included."""
    if not certificate:
        raise RoleNotAllowedError("the peer showed no certificate")
    role = certificate_role(certificate, field)
    if role is None:
        raise RoleNotAllowedError(f"the peer's certificate has no {field} role")
    if role not in allowed:
        raise RoleNotAllowedError(f"role {role!r} (certificate {field}) is not one of "
                                  f"{', '.join(sorted(allowed))}")
    return role
