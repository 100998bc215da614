"""The secure sandbox: ``quire sandbox --secure`` (and ``scripts/sandbox --secure``).

:func:`prepare` makes, under ``<sandbox dir>/security`` (kept across
restarts; made once)::

    ca.crt, ca.key         a local CA (ECDSA P-256, cryptography)
    server.crt/.key        every server's certificate: DNS SANs localhost
                           and quire-controllers, IP SANs 127.0.0.1 .. 9
                           (the controllers' addresses; the official client
                           cannot check an IP address, so clients use
                           localhost; Quire's may use either)
    node.crt/.key          a client certificate (role ``node``) for the
                           segment stores' and the CLI's connections to
                           bookies (mutual TLS)
    cluster.secret         the cluster secret signing delegation tokens
    ledger.secret          the segment stores' tier-1 ledger password
    credentials.toml       the ``admin`` user: username and a random password

Keys, the secret and the credentials are written 0600.  :class:`SandboxSecurity`
then gives each process its settings: TLS on every port it owns (the
segment store's wire, the controller's gRPC, every HTTP endpoint), auth on,
``advertised_host = "localhost"`` so ``getURI`` answers a name the
certificate covers; and :meth:`SandboxSecurity.ensure_admin` puts the
``admin`` user (ACL ``prn::*,READ_UPDATE``) in the metadata store's user
database with the file's password.

The bookies serve their protocol over TLS too and ask every client for a
certificate the CA signed with the role ``server`` (a bookie reaching its
peers) or ``node`` (segment stores and the CLI, with ``node.crt``); the
segment stores' tier-1 ledgers use ``ledger.secret`` as their password.
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
CONTROLLERS_NAME = "quire-controllers"
"""The name of all the controllers (see :data:`quire.sandbox.CONTROLLERS_HOST`)."""
LOOPBACK_IPS = [f"127.0.0.{i}" for i in range(1, 10)]
"""The sandbox's addresses (controllers on 127.0.0.1 .. 127.0.0.N)."""
CLIENT_ROLES = ("server", "node")
"""The certificate roles a sandbox bookie lets in: bookies (their server
certificate, reaching peers) and ``node`` (segment stores, the CLI)."""


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
    def ledger_secret_file(self) -> Path:
        return self.directory / "ledger.secret"

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
        """The bookie protocol's: TLS with the server's certificate (its
        ``tls_*_file``), mutual TLS against the CA, the roles let in."""
        return {"tls_allowed_roles": list(CLIENT_ROLES)}

    def ledger_client_settings(self) -> dict[str, Any]:
        """A segment store's tier-1 ledger client: TLS with ``node.crt``,
        and the cluster's ledger password."""
        return {"tier1_tls_ca_file": str(self.ca_file),
                "tier1_tls_cert_file": str(self.node_cert_file),
                "tier1_tls_key_file": str(self.node_key_file),
                "ledger_password_file": str(self.ledger_secret_file)}

    def segment_store_settings(self) -> dict[str, Any]:
        return {**self.server_settings(), **self.ledger_client_settings(),
                "advertised_host": SERVER_NAME}

    def controller_settings(self, index: int = 1, count: int = 1) -> dict[str, Any]:
        """Controller ``index`` of ``count``: alone it is ``localhost``; one of
        several is its own address (127.0.0.<index>, which the certificate
        also covers), while the official client reaches them all as
        ``quire-controllers``."""
        host = SERVER_NAME if count == 1 else f"127.0.0.{index}"
        return {**self.server_settings(), "advertised_host": host}

    def cli_exports(self) -> list[str]:
        """``export`` lines for ``quire`` commands against the sandbox."""
        return [f"export QUIRE_TLS_CA={self.ca_file.resolve()}",
                f"export QUIRE_TLS_CERT={self.node_cert_file.resolve()}",
                f"export QUIRE_TLS_KEY={self.node_key_file.resolve()}",
                f"export QUIRE_CREDENTIALS={self.credentials_file.resolve()}"]

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
        issue_certificate(ca, directory, "server", dns_names=[SERVER_NAME, CONTROLLERS_NAME],
                          ip_addresses=LOOPBACK_IPS, role="server")
    if not security.node_cert_file.exists():
        issue_certificate(ca, directory, "node", dns_names=[SERVER_NAME],
                          ip_addresses=["127.0.0.1"], role="node")
    if not security.secret_file.exists():
        write_secret(security.secret_file, secrets.token_hex(32))
    if not security.ledger_secret_file.exists():
        write_secret(security.ledger_secret_file, secrets.token_hex(32))
    if not security.credentials_file.exists():
        write_credentials(security.credentials_file,
                          Credentials(ADMIN_USER, secrets.token_urlsafe(24)))
    return security
