"""The user database: named records of the metadata store, where every server sees them.

One record per user, ``auth/users/<name>``, holding JSON::

    {"acl": "prn::/scope:S,READ_UPDATE;prn::/scope:S/*,READ_UPDATE",
     "password": "scrypt$16384$8$1$<salt>$<hash>"}

Decisions:

* The metadata store, not a password file per server (Pravega's
  ``PasswordAuthHandler`` reads a file on each controller): every
  controller, segment store and bookie already shares it, so ``quire auth
  user add`` on one host is seen by all of them, and nothing is copied
  around.  Whoever can write the metadata store can therefore add users;
  the store is guarded by its own means (ZooKeeper digest ACLs).
* Only the scrypt hash is stored (:mod:`quire.security.passwords`), never
  the password.
* Names: 1 to 128 of letters, digits, ``.``, ``_``, ``@`` and ``-``, not
  starting with ``_`` (kept for the internal identity,
  :data:`quire.security.tokens.INTERNAL_SUBJECT`) or ``.`` (the metadata
  store's own).  No ``:``, which Basic authentication splits on.
* Updates are compare-and-set on the record's version, retried when a
  concurrent update wins, so a password change never undoes an ACL change
  made at the same moment (or the reverse).
* :meth:`UserDatabase.authenticate` gives one answer, "wrong user name or
  password", for an unknown user and a wrong password, and does the same
  scrypt work for both (an unknown user is checked against
  :data:`~quire.security.passwords.DUMMY_HASH`).  Hashing runs on a worker
  thread.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

from quire.errors import (
    AuthenticationError,
    MetadataError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionError,
    UserExistsError,
    UserNotFoundError,
)
from quire.metadata import MetadataStore
from quire.security import (
    DUMMY_HASH,
    Acl,
    Principal,
    hash_password,
    verify_password,
)

USERS_PREFIX = "auth/users/"
USER_NAME = re.compile(r"[A-Za-z0-9@-][A-Za-z0-9._@-]{0,127}")
WRONG_CREDENTIALS = "wrong user name or password"
_CAS_ATTEMPTS = 10


def check_user_name(name: str) -> None:
    """ValueError unless ``name`` may name a user (module docstring)."""
    if not isinstance(name, str) or not USER_NAME.fullmatch(name):
        raise ValueError(f"invalid user name {name!r}: 1 to 128 of [A-Za-z0-9._@-], not "
                         "starting with '_' or '.'")


def user_key(name: str) -> str:
    """The metadata record of user ``name``."""
    check_user_name(name)
    return USERS_PREFIX + name


@dataclass(frozen=True)
class User:
    """One user as stored (``version`` is its record's)."""

    name: str
    acl: Acl
    password_hash: str = field(repr=False)
    version: int = 0

    def principal(self) -> Principal:
        return Principal(self.name, self.acl)

    def encode(self) -> bytes:
        return json.dumps({"acl": str(self.acl), "password": self.password_hash},
                          sort_keys=True).encode()

    @classmethod
    def decode(cls, name: str, data: bytes, version: int) -> User:
        try:
            doc: Any = json.loads(data)
            acl, password = doc["acl"], doc["password"]
            if not isinstance(acl, str) or not isinstance(password, str):
                raise TypeError("field types")
        except (ValueError, KeyError, TypeError):
            raise MetadataError(f"the record of user {name} ({USERS_PREFIX}{name}) is "
                                "corrupt") from None
        return cls(name, Acl.parse(acl), password, version)


class UserDatabase:
    """Users, their password hashes and ACLs in ``store`` (module docstring)."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    async def get(self, name: str) -> User:
        """The user; UserNotFoundError if there is none."""
        key = user_key(name)
        try:
            stored = await self._store.read_record(key)
        except MetadataNotFoundError:
            raise UserNotFoundError(f"no user {name}") from None
        return User.decode(name, stored.value, stored.version)

    async def list(self) -> list[User]:
        """Every user, sorted by name (one deleted meanwhile is left out)."""
        users = []
        for key in await self._store.list_records(USERS_PREFIX):
            name = key[len(USERS_PREFIX):]
            if "/" in name or not USER_NAME.fullmatch(name):
                continue
            try:
                users.append(await self.get(name))
            except UserNotFoundError:
                continue
        return users

    async def add(self, name: str, password: str, acl: Acl) -> User:
        """A new user; UserExistsError if the name is taken."""
        key = user_key(name)
        user = User(name, acl, await asyncio.to_thread(hash_password, password))
        try:
            version = await self._store.create_record(key, user.encode())
        except MetadataExistsError:
            raise UserExistsError(f"user {name} exists already") from None
        return User(name, acl, user.password_hash, version)

    async def set_password(self, name: str, password: str) -> User:
        """Change a user's password (its ACL kept)."""
        password_hash = await asyncio.to_thread(hash_password, password)
        return await self._update(name, lambda u: User(name, u.acl, password_hash))

    async def set_acl(self, name: str, acl: Acl) -> User:
        """Replace a user's ACL (its password kept)."""
        return await self._update(name, lambda u: User(name, acl, u.password_hash))

    async def _update(self, name: str, change: Any) -> User:
        for _ in range(_CAS_ATTEMPTS):
            current = await self.get(name)
            updated: User = change(current)
            try:
                version = await self._store.write_record(user_key(name), updated.encode(),
                                                         current.version)
            except MetadataVersionError:
                continue  # changed meanwhile: apply the change to what is there now
            except MetadataNotFoundError:
                raise UserNotFoundError(f"no user {name}") from None
            return User(name, updated.acl, updated.password_hash, version)
        raise MetadataError(f"user {name} kept changing; try again")

    async def delete(self, name: str) -> None:
        """Remove a user; UserNotFoundError if there is none."""
        try:
            await self._store.delete_record(user_key(name))
        except MetadataNotFoundError:
            raise UserNotFoundError(f"no user {name}") from None

    async def authenticate(self, name: str, password: str) -> Principal:
        """The user's principal if ``password`` is theirs; otherwise
        AuthenticationError, the same for an unknown user (module docstring)."""
        user: User | None = None
        if USER_NAME.fullmatch(name):
            try:
                user = await self.get(name)
            except UserNotFoundError:
                user = None
        stored_hash = user.password_hash if user is not None else DUMMY_HASH
        matches = await asyncio.to_thread(verify_password, password, stored_hash)
        if user is None or not matches:
            raise AuthenticationError(WRONG_CREDENTIALS)
        return user.principal()
