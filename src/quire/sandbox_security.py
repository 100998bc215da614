"""The secure sandbox: ``quire sandbox --secure`` (and ``scripts/sandbox --secure``).

:func:`prepare` makes, under ``<sandbox dir>/security`` (kept across
restarts; made once)::

    ca.crt, ca.key         a local CA (ECDSA P-256, cryptography)
    server.crt/.key        every server's certificate: DNS SAN localhost,
                           IP SAN 127.0.0.1 (the official Pravega client
                           cannot check an IP address, so clients use
                           localhost; Quire's may use either)
    node.crt/.key          a client certificate (role ``node``) for the
                           servers' own connections to bookies (mutual TLS)
    cluster.secret         the cluster secret signing delegation tokens
    credentials.toml       the ``admin`` user: username and a random password

Keys, the secret and the credentials are written 0600.  :class:`SandboxSecurity`
then gives each process its settings: TLS on every port it owns (the
segment store's wire, the controller's gRPC, every HTTP endpoint), auth on,
``advertise_host = "localhost"`` so ``getURI`` answers a name the
certificate covers; and :meth:`SandboxSecurity.ensure_admin` puts the
``admin`` user (ACL ``prn::*,READ_UPDATE``) in the metadata store's user
database with the file's password.

**Hooks for the bookie protocol's TLS** (another change adds it: bookie
mutual TLS and the ledger client's ``tls_ca``/``tls_cert``/``tls_key``):
:meth:`SandboxSecurity.bookie_protocol_settings` and
:meth:`SandboxSecurity.ledger_client_settings` are where their keys go;
today they add nothing, so the bookie protocol stays plain (its HTTP
endpoint is TLS and authenticated already).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quire.auth import UserDatabase
from quire.errors import UserNotFoundError
from quire.security import (
    Acl,
    Credentials,
    Permission,
    read_credentials,
    write_credentials,
    write_secret,
)

ADMIN_USER = "admin"
ADMIN_ACL = Acl.of({"prn::*": Permission.READ_UPDATE})
SERVER_NAME = "localhost"
"""The host name clients use for every sandbox server under TLS."""


@dataclass(frozen=True)
class SandboxSecurity:
    """The secure sandbox's files (see the module docstring)."""

    directory: Path

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def cert_file(self) -> Path:
        return self.directory / "server.crt"

    @property
    def key_file(self) -> Path:
        return self.directory / "server.key"

    @property
    def node_cert_file(self) -> Path:
        return self.directory / "node.crt"

    @property
    def node_key_file(self) -> Path:
        return self.directory / "node.key"

    @property
    def secret_file(self) -> Path:
        return self.directory / "cluster.secret"

    @property
    def credentials_file(self) -> Path:
        return self.directory / "credentials.toml"

    def credentials(self) -> Credentials:
        return read_credentials(self.credentials_file)

    # --- settings, as each process's flat config keys ------------------------------------

    def server_settings(self) -> dict[str, Any]:
        """TLS (a client certificate asked of peers, checked against the
        CA) and authentication: :class:`quire.security.SecurityConfig`'s keys."""
        return {"tls_cert_file": str(self.cert_file), "tls_key_file": str(self.key_file),
                "tls_ca_file": str(self.ca_file), "auth_enabled": True,
                "auth_token_secret_file": str(self.secret_file)}

    def bookie_settings(self) -> dict[str, Any]:
        """A bookie's: its HTTP endpoint on TLS with auth, plus the bookie protocol's."""
        return {**self.server_settings(), **self.bookie_protocol_settings()}

    def bookie_protocol_settings(self) -> dict[str, Any]:
        """HOOK: the bookie protocol's TLS keys (mutual TLS, allowed roles),
        once the bookie protocol has them; nothing yet."""
        return {}

    def ledger_client_settings(self) -> dict[str, Any]:
        """HOOK: a segment store's ledger client's TLS keys (``tls_ca``,
        ``tls_cert = node.crt``, ``tls_key = node.key``) once the ledger
        client has them; nothing yet."""
        return {}

    def segment_store_settings(self) -> dict[str, Any]:
        return {**self.server_settings(), **self.ledger_client_settings(),
                "advertise_host": SERVER_NAME}

    def controller_settings(self) -> dict[str, Any]:
        return {**self.server_settings(), "advertise_host": SERVER_NAME}

    def client_environment(self) -> dict[str, str]:
        """What the official Pravega client reads (the password included)."""
        credentials = self.credentials()
        return {"pravega_client_tls_cert_path": str(self.ca_file.resolve()),
                "pravega_client_auth_method": "Basic",
                "pravega_client_auth_username": credentials.username,
                "pravega_client_auth_password": credentials.password}

    def shell_exports(self) -> list[str]:
        """``export`` lines of :meth:`client_environment`, the password read
        from the credentials file (so it is not printed)."""
        credentials_path = self.credentials_file.resolve()
        return [f"export pravega_client_tls_cert_path={self.ca_file.resolve()}",
                "export pravega_client_auth_method=Basic",
                f"export pravega_client_auth_username={self.credentials().username}",
                "export pravega_client_auth_password=\"$(sed -n 's/^password = \"\\(.*\\)\"$/"
                f"\\1/p' {credentials_path})\""]

    async def ensure_admin(self, users: UserDatabase) -> None:
        """The ``admin`` user with the credentials file's password and full
        rights (added, or its password and ACL set again)."""
        credentials = self.credentials()
        try:
            await users.get(credentials.username)
        except UserNotFoundError:
            await users.add(credentials.username, credentials.password, ADMIN_ACL)
            return
        await users.set_password(credentials.username, credentials.password)
        await users.set_acl(credentials.username, ADMIN_ACL)


def prepare(directory: Path) -> SandboxSecurity:
    """The secure sandbox's files in ``directory`` (made if missing)."""
    from quire.security.certificates import CertificateAuthority, issue_certificate, make_ca

    security = SandboxSecurity(directory)
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    if security.ca_file.exists():
        ca = CertificateAuthority.load(security.ca_file, directory / "ca.key")
    else:
        ca = make_ca(directory, "Quire sandbox CA")
    if not security.cert_file.exists():
        issue_certificate(ca, directory, "server", dns_names=[SERVER_NAME],
                          ip_addresses=["127.0.0.1"], role="server")
    if not security.node_cert_file.exists():
        issue_certificate(ca, directory, "node", dns_names=[SERVER_NAME],
                          ip_addresses=["127.0.0.1"], role="node")
    if not security.secret_file.exists():
        write_secret(security.secret_file, secrets.token_hex(32))
    if not security.credentials_file.exists():
        write_credentials(security.credentials_file,
                          Credentials(ADMIN_USER, secrets.token_urlsafe(24)))
    return security
