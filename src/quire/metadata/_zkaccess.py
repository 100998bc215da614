"""Who may touch a ``zk://`` store's znodes: digest credentials and ACLs,
TLS to ZooKeeper, and the walk that secures a tree made without ACLs.

The settings are :class:`~quire.security.ZooKeeperSecurityConfig`'s
(``zookeeper_digest_file``, ``zookeeper_tls_ca_file``,
``zookeeper_tls_cert_file``, ``zookeeper_tls_key_file``), options of
``open_store`` for a ``zk://`` URI.

Decisions:

* **Credentials** come from ``zookeeper_digest_file``, a secret file (mode
  0600, else InsecureSecretFileError before any connection) holding one
  line ``user:password`` (the user ends at the first colon).  The session
  authenticates with that digest, and every znode the store creates
  carries one ACL entry: every permission for ``digest:user:<hash>``, none
  for anyone else.  ZooKeeper accepts any digest when a session adds it; a
  wrong password shows at the first request, as NoAuth.
* **What is covered**: the chroot's own node and everything under it (a
  store without a chroot: its top-level nodes, never ``/``).  Nodes above
  the chroot are only a namespace: Quire creates missing ones open to all,
  as ZooKeeper's own ``/`` is, so that clusters with their own credentials
  can share a parent (create them beforehand with an ACL to close them).
* **Without the digest** one can still ask ``exists`` of any path
  (ZooKeeper checks no ACL there): learn whether a guessed path exists and
  its stat (data length, versions, times, the session owning an ephemeral
  node); nothing else: no data, no children, no create, set, delete or
  setACL.
* **Refusals** (NoAuth) are :class:`~quire.errors.MetadataAccessDeniedError`,
  a definite answer naming the fix.  The store checks at open, reading the
  ACL of its ``ledgers`` znode (which needs READ): a process without
  credentials, or with other ones, fails there, at its start.
* **A tree made without ACLs, opened with credentials**, works as it is
  (its znodes are open to all, the authenticated session included); new
  znodes get the ACL, and the store warns that the tree is open.  Securing
  the existing znodes is an explicit step, :func:`secure_tree` (``quire
  metadata secure``), not something the first process given credentials
  does on its own: it changes what every other process may do, so it
  happens when the operator chooses, once every process of the cluster has
  the digest file (a process still running without it is locked out from
  that moment); it walks every znode, which a server's start should not
  wait on; and a command reports its progress and can run again if it was
  interrupted (it is idempotent: a znode that has the ACL is counted, not
  changed).
* **TLS**: with ``zookeeper_tls_ca_file`` kazoo connects over TLS, checks
  the server's certificate and that it names the host the URI gives (an
  IP literal must be an IP SAN), and shows ``zookeeper_tls_cert_file`` if
  set.  The files are loaded once at open, so a bad one is TlsConfigError
  at once rather than a connection that times out.  kazoo builds its own
  context, which also trusts the system's CAs: a certificate a public CA
  issued for the same host name would pass too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kazoo.security import ACL, OPEN_ACL_UNSAFE, make_digest_acl

from quire.errors import ConfigError, MetadataNotFoundError
from quire.metadata._kazoo import KazooBridge
from quire.metadata._znodes import Znodes
from quire.security import ZooKeeperSecurityConfig, client_context, read_secret_text

log = logging.getLogger("quire.metadata.zookeeper")

WALK_BATCH = 256
"""Znodes the securing walk works on at once."""

_DIGEST_SETTING = ("zookeeper_digest_file (quire commands: --zookeeper-digest-file or "
                   "$QUIRE_ZOOKEEPER_DIGEST_FILE)")


@dataclass(frozen=True)
class ZooKeeperAccess:
    """The credentials and TLS of one store's session, loaded from its settings."""

    settings: ZooKeeperSecurityConfig = field(default_factory=ZooKeeperSecurityConfig)
    user: str = ""
    acl: tuple[ACL, ...] = ()
    """The ACL of every znode the store creates (``()``: none, open to all)."""
    credential: str = field(default="", repr=False)
    """``user:password``, for the session's digest authentication."""

    @classmethod
    def load(cls, settings: ZooKeeperSecurityConfig) -> ZooKeeperAccess:
        """Read the digest file and check the TLS files (ConfigError,
        InsecureSecretFileError or TlsConfigError if one is unusable)."""
        if settings.zookeeper_tls_ca_file:
            client_context(settings.zookeeper_tls_ca_file,
                           settings.zookeeper_tls_cert_file or None,
                           settings.zookeeper_tls_key_file or None)
        path = settings.zookeeper_digest_file
        if not path:
            return cls(settings)
        credential = read_secret_text(path)
        user, colon, password = credential.partition(":")
        if not (colon and user and password) or "\n" in credential:
            raise ConfigError(f"ZooKeeper digest file {path} must hold one line "
                              "user:password")
        return cls(settings, user, (make_digest_acl(user, password, all=True),), credential)

    def kazoo_options(self) -> dict[str, Any]:
        """The KazooClient keyword arguments of these credentials and TLS."""
        options: dict[str, Any] = {}
        if self.acl:
            options.update(auth_data=[("digest", self.credential)], default_acl=list(self.acl))
        if self.settings.zookeeper_tls_ca_file:
            options.update(use_ssl=True, ca=self.settings.zookeeper_tls_ca_file,
                           verify_certs=True, check_hostname=True,
                           certfile=self.settings.zookeeper_tls_cert_file or None,
                           keyfile=self.settings.zookeeper_tls_key_file or None)
        return options

    def denied_hint(self) -> str:
        """What to do when ZooKeeper answers NoAuth."""
        if not self.acl:
            return ("Quire's znodes carry digest ACLs and this process has no credentials: "
                    f"set {_DIGEST_SETTING} to the file (mode 0600) holding the cluster's "
                    "user:password")
        return (f"Quire's znodes carry digest ACLs for other credentials than user "
                f"{self.user!r} of zookeeper_digest_file "
                f"{self.settings.zookeeper_digest_file}: it must hold the cluster's "
                "user:password")

    def connect_hint(self) -> str:
        """What to check when no session could be opened."""
        if not self.settings.zookeeper_tls_ca_file:
            return ""
        return (" (over TLS: the URI must name ZooKeeper's secureClientPort, and its "
                "certificate be signed by zookeeper_tls_ca_file's CA and name the host; "
                "a server that asks a client certificate needs zookeeper_tls_cert_file)")


# --- the layout and the check at open ---------------------------------------------


async def has_layout(kazoo: KazooBridge, paths: Znodes) -> bool:
    """Whether the store's top-level znodes exist (``exists`` needs no ACL)."""
    found = await asyncio.gather(*(
        kazoo.call("store layout", kazoo.client.exists_async, path)
        for path in paths.top_level()))
    return all(stat is not None for stat in found)


async def ensure_layout(kazoo: KazooBridge, paths: Znodes) -> None:
    """Create the missing top-level znodes: the chroot's ancestors open to
    all, the chroot and below with the session's default ACL."""
    if paths.above_root:
        await kazoo.call("store layout", kazoo.client.ensure_path_async, paths.above_root,
                         OPEN_ACL_UNSAFE)
    await asyncio.gather(*(
        kazoo.call("store layout", kazoo.client.ensure_path_async, path)
        for path in paths.top_level()))


async def check_access(kazoo: KazooBridge, paths: Znodes, access: ZooKeeperAccess, *,
                       warn_if_open: bool = True) -> None:
    """MetadataAccessDeniedError if this session may not read the store;
    a warning if it has credentials and the tree is open to all."""
    acls, _ = await kazoo.call("the ledgers znode's ACL", kazoo.client.get_acls_async,
                               paths.ledgers)
    if warn_if_open and access.acl and any(acl.id.scheme == "world" for acl in acls):
        log.warning("%s: the znodes carry no ACL: whoever reaches ZooKeeper can read and "
                    "change them; once every process of the cluster has "
                    "zookeeper_digest_file, run: quire metadata secure --metadata %s",
                    kazoo.uri, kazoo.uri)


# --- securing a tree made without ACLs -----------------------------------------------


@dataclass
class SecuredTree:
    """How far :func:`secure_tree` got (also its progress reports)."""

    znodes: int = 0
    """Znodes walked."""
    secured: int = 0
    """Znodes whose ACL the walk set (the others had it already)."""


async def secure_tree(kazoo: KazooBridge, paths: Znodes, access: ZooKeeperAccess,
                      progress: Callable[[SecuredTree], None] | None = None) -> SecuredTree:
    """Give every znode Quire owns (:meth:`Znodes.own_roots` and below) the
    ACL of ``access``'s credentials, top down, :data:`WALK_BATCH` at a
    time; ``progress`` is called after each batch.  Idempotent."""
    if not access.acl:
        raise ConfigError(f"securing a ZooKeeper tree needs {_DIGEST_SETTING}")
    done = SecuredTree()
    wanted = _acl_key(access.acl)
    frontier = paths.own_roots()
    while frontier:
        batch, frontier = frontier[:WALK_BATCH], frontier[WALK_BATCH:]
        below = await asyncio.gather(*(_secure(kazoo, path, access.acl, wanted, done)
                                       for path in batch))
        frontier.extend(child for children in below for child in children)
        if progress is not None:
            progress(done)
    return done


async def _secure(kazoo: KazooBridge, path: str, acl: Sequence[ACL],
                  wanted: frozenset[tuple[int, str, str]], done: SecuredTree) -> list[str]:
    """Set ``path``'s ACL if it differs; its children's paths."""
    what = f"znode {path}"
    try:
        acls, _ = await kazoo.call(what, kazoo.client.get_acls_async, path)
        if _acl_key(acls) != wanted:
            await kazoo.call(what, kazoo.client.set_acls_async, path, list(acl))
            done.secured += 1
        names: list[str] = await kazoo.call(what, kazoo.client.get_children_async, path)
    except MetadataNotFoundError:
        return []  # gone meanwhile (a ledger id's node, a leased record)
    done.znodes += 1
    return [f"{path}/{name}" for name in names]


def _acl_key(acls: Sequence[ACL]) -> frozenset[tuple[int, str, str]]:
    return frozenset((acl.perms, acl.id.scheme, acl.id.id) for acl in acls)
