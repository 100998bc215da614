"""Users and who a request comes from (rank 3: over :mod:`quire.metadata`
and :mod:`quire.security`).

* :class:`UserDatabase`: users, their scrypt password hashes and Pravega
  ACLs, kept as records of the metadata store (``auth/users/<name>``);
* :class:`UserAuthenticator`: the :class:`quire.security.Authenticator`
  of every server (Basic against the database, with a small cache; Bearer
  for tokens Quire issued);
* :func:`server_security`: a server's TLS and authenticator from its
  :class:`quire.security.SecurityConfig`, what each process assembles.
"""

from __future__ import annotations

from dataclasses import dataclass

from quire.auth.authenticator import UserAuthenticator
from quire.auth.users import (
    USERS_PREFIX,
    WRONG_CREDENTIALS,
    User,
    UserDatabase,
    check_user_name,
    user_key,
)
from quire.metadata import MetadataStore
from quire.security import (
    Authenticator,
    ClientCertificates,
    SecurityConfig,
    ServerTls,
    TokenSigner,
)


@dataclass(frozen=True)
class ServerSecurity:
    """What a server's :class:`SecurityConfig` asks for: its TLS (None:
    plain) and its authenticator (None: open)."""

    tls: ServerTls | None = None
    authenticator: Authenticator | None = None


def server_security(config: SecurityConfig, store: MetadataStore,
                    client_certs: ClientCertificates | None = None) -> ServerSecurity:
    """The TLS (:meth:`ServerTls.from_config`) and, with ``auth_enabled``,
    a :class:`UserAuthenticator` over ``store``'s user database, taking
    Bearer tokens when ``auth_token_secret_file`` is set.  Raises
    ConfigError (TlsConfigError, InsecureSecretFileError) for files that
    are missing, bad or open to others: a server does not start on them."""
    tls = ServerTls.from_config(config, client_certs)
    authenticator = None
    if config.auth_enabled:
        tokens = (TokenSigner.from_file(config.auth_token_secret_file)
                  if config.auth_token_secret_file else None)
        authenticator = UserAuthenticator(UserDatabase(store), tokens)
    return ServerSecurity(tls, authenticator)


__all__ = [
    "USERS_PREFIX",
    "WRONG_CREDENTIALS",
    "ServerSecurity",
    "User",
    "UserAuthenticator",
    "UserDatabase",
    "check_user_name",
    "server_security",
    "user_key",
]
