"""Quire's security building blocks, below every server (rank 1: it imports
only :mod:`quire.errors`).

* :mod:`~quire.security.secrets`: secrets and credentials in files (0600);
* :mod:`~quire.security.tls`: server TLS that reloads its certificate,
  client contexts, gRPC credentials, peer-certificate roles;
* :mod:`~quire.security.certificates`: a local CA and its certificates
  (imported on its own: it loads the ``cryptography`` library);
* :mod:`~quire.security.passwords`: scrypt password hashes;
* :mod:`~quire.security.resources` and :mod:`~quire.security.acl`:
  Pravega's resources (``prn::/scope:S/stream:T``) and ACLs;
* :mod:`~quire.security.principal`: principals, the ``authorization``
  header, the :class:`Authenticator` seam;
* :mod:`~quire.security.tokens`: delegation tokens and the internal identity;
* :mod:`~quire.security.ledger_keys`: a ledger's keys (master key, MAC key)
  derived from its password, what the metadata store keeps;
* :mod:`~quire.security.config`: the TLS and auth settings servers share,
  and how a process reaches a ``zk://`` metadata store.

The user database and the authenticator over it are :mod:`quire.auth`'s;
the HTTP server is :mod:`quire.http`'s.
"""

from quire.security.acl import Acl, AclEntry, Permission, format_acl, parse_acl
from quire.security.config import SecurityConfig, ZooKeeperSecurityConfig
from quire.security.ledger_keys import LedgerKeys
from quire.security.passwords import DUMMY_HASH, hash_password, verify_password
from quire.security.principal import (
    Authenticator,
    BasicCredentials,
    BearerToken,
    Principal,
    basic_authorization,
    bearer_authorization,
    parse_authorization,
)
from quire.security.resources import (
    CLUSTER_RESOURCE,
    INTERNAL_RESOURCE,
    check_resource_pattern,
    is_internal_resource,
    key_value_table_resource,
    reader_group_resource,
    scope_resource,
    segment_resource,
    stream_info_resource,
    stream_resource,
)
from quire.security.secrets import (
    Credentials,
    check_secret_file,
    read_credentials,
    read_secret,
    read_secret_text,
    write_credentials,
    write_secret,
)
from quire.security.tls import (
    ClientCertificates,
    ClientTls,
    ServerTls,
    certificate_role,
    client_context,
    grpc_channel_credentials,
    require_role,
    server_context,
)
from quire.security.tokens import INTERNAL_SUBJECT, TokenClaims, TokenSigner

__all__ = [
    "CLUSTER_RESOURCE",
    "DUMMY_HASH",
    "INTERNAL_RESOURCE",
    "INTERNAL_SUBJECT",
    "Acl",
    "AclEntry",
    "Authenticator",
    "BasicCredentials",
    "BearerToken",
    "ClientCertificates",
    "ClientTls",
    "Credentials",
    "LedgerKeys",
    "Permission",
    "Principal",
    "SecurityConfig",
    "ServerTls",
    "TokenClaims",
    "TokenSigner",
    "ZooKeeperSecurityConfig",
    "basic_authorization",
    "bearer_authorization",
    "certificate_role",
    "check_resource_pattern",
    "check_secret_file",
    "client_context",
    "format_acl",
    "grpc_channel_credentials",
    "hash_password",
    "is_internal_resource",
    "key_value_table_resource",
    "parse_acl",
    "parse_authorization",
    "read_credentials",
    "read_secret",
    "read_secret_text",
    "reader_group_resource",
    "require_role",
    "scope_resource",
    "segment_resource",
    "server_context",
    "stream_info_resource",
    "stream_resource",
    "verify_password",
    "write_credentials",
    "write_secret",
]
