"""quire.auth over an in-memory metadata store: the user database and the
authenticator (Basic with its cache, Bearer tokens), and the assembly of a
server's security from its settings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from quire.auth import (
    WRONG_CREDENTIALS,
    UserAuthenticator,
    UserDatabase,
    server_security,
    user_key,
)
from quire.errors import (
    AuthenticationError,
    ConfigError,
    InsecureSecretFileError,
    TokenExpiredError,
    TokenInvalidError,
    UserExistsError,
    UserNotFoundError,
)
from quire.metadata import MetadataStore, open_store
from quire.security import (
    Acl,
    Permission,
    Principal,
    SecurityConfig,
    TokenSigner,
    basic_authorization,
    bearer_authorization,
    stream_resource,
    write_secret,
)

ACL = Acl.parse("prn::/scope:S,READ_UPDATE;prn::/scope:S/*,READ")
SECRET = b"a cluster secret of 32 bytes...."


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    opened = await open_store("memory://")
    yield opened
    await opened.close()


async def test_users_are_records_holding_a_hash_and_an_acl(store: MetadataStore) -> None:
    users = UserDatabase(store)
    alice = await users.add("alice", "s3cret pw", ACL)
    assert (alice.name, alice.acl, alice.version) == ("alice", ACL, 0)
    raw = (await store.read_record(user_key("alice"))).value
    assert b"s3cret" not in raw and b'"password": "scrypt$16384$8$1$' in raw
    assert b"prn::/scope:S,READ_UPDATE;prn::/scope:S/*,READ" in raw
    with pytest.raises(UserExistsError, match="alice"):
        await users.add("alice", "other", Acl())
    await users.add("bob", "pw", Acl())
    assert [u.name for u in await users.list()] == ["alice", "bob"]
    assert "s3cret" not in repr(await users.get("alice"))
    await users.delete("bob")
    with pytest.raises(UserNotFoundError, match="bob"):
        await users.get("bob")
    with pytest.raises(UserNotFoundError):
        await users.delete("bob")
    with pytest.raises(UserNotFoundError):
        await users.set_password("bob", "pw")
    assert [u.name for u in await users.list()] == ["alice"]


@pytest.mark.parametrize("name", ["", "_internal", ".hidden", "a:b", "a/b", "a b", "x" * 129])
async def test_reserved_and_malformed_user_names_are_refused(store: MetadataStore,
                                                             name: str) -> None:
    with pytest.raises(ValueError, match="invalid user name"):
        await UserDatabase(store).add(name, "pw", Acl())


async def test_password_and_acl_changes_keep_each_other(store: MetadataStore) -> None:
    users = UserDatabase(store)
    await users.add("alice", "old", Acl())
    new_acl = Acl.parse("prn::*,READ")
    await asyncio.gather(users.set_password("alice", "new"), users.set_acl("alice", new_acl))
    alice = await users.get("alice")
    assert alice.acl == new_acl and alice.version == 2
    principal = await users.authenticate("alice", "new")
    assert principal == Principal("alice", new_acl)
    with pytest.raises(AuthenticationError):
        await users.authenticate("alice", "old")


async def test_an_unknown_user_and_a_wrong_password_get_the_same_answer(
        store: MetadataStore) -> None:
    users = UserDatabase(store)
    await users.add("alice", "pw", ACL)
    messages = set()
    for name, password in (("alice", "wrong"), ("nobody", "pw"), ("_internal", "pw"),
                           ("alice", "")):
        with pytest.raises(AuthenticationError) as refused:
            await users.authenticate(name, password)
        messages.add(str(refused.value))
    assert messages == {WRONG_CREDENTIALS}


class CountingUsers(UserDatabase):
    """Counts the password checks that reach the database."""

    checks = 0

    async def authenticate(self, name: str, password: str) -> Principal:
        self.checks += 1
        return await super().authenticate(name, password)


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_successful_basic_check_is_cached_for_a_while_and_failures_never(
        store: MetadataStore) -> None:
    users = CountingUsers(store)
    await users.add("alice", "pw", ACL)
    clock = Clock()
    auth = UserAuthenticator(users, cache_ttl_ms=10_000, clock=clock)
    header = basic_authorization("alice", "pw")
    principal = await auth.authenticate(header)
    assert principal.allows(stream_resource("S", "T"), Permission.READ)
    assert not principal.allows(stream_resource("S", "T"), Permission.READ_UPDATE)
    assert await auth.authenticate(header) == principal and users.checks == 1
    # concurrent requests with a header not yet checked share one scrypt run
    other = basic_authorization("alice", "wrong")
    results = await asyncio.gather(*(auth.authenticate(other) for _ in range(5)),
                                   return_exceptions=True)
    assert all(isinstance(r, AuthenticationError) for r in results) and users.checks == 2
    with pytest.raises(AuthenticationError):  # failures are not remembered
        await auth.authenticate(other)
    assert users.checks == 3
    await users.set_password("alice", "changed")
    assert await auth.authenticate(header) == principal  # the cache, for a while...
    clock.now += 10.1
    with pytest.raises(AuthenticationError, match=WRONG_CREDENTIALS):
        await auth.authenticate(header)  # ...then the database again
    assert users.checks == 4


async def test_the_cache_is_bounded(store: MetadataStore) -> None:
    users = CountingUsers(store)
    await users.add("alice", "pw", Acl())
    auth = UserAuthenticator(users, cache_max_entries=1)
    first, second = basic_authorization("alice", "pw"), "basic " + basic_authorization(
        "alice", "pw").split()[1]
    for header in (first, second, first):
        await auth.authenticate(header)
    assert users.checks == 3  # the second header pushed the first out


async def test_bearer_tokens_are_checked_with_the_cluster_secret(store: MetadataStore) -> None:
    clock = Clock()
    signer = TokenSigner(SECRET, clock=clock)
    auth = UserAuthenticator(UserDatabase(store), signer)
    token = signer.issue("alice", {stream_resource("S", "T"): Permission.READ}, ttl_s=60)
    principal = await auth.authenticate(bearer_authorization(token))
    assert principal.name == "alice" and principal.allows(stream_resource("S", "T"),
                                                          Permission.READ)
    with pytest.raises(TokenInvalidError):
        await auth.authenticate(bearer_authorization(token[:-4] + "AAA="))
    clock.now += 60
    with pytest.raises(TokenExpiredError):
        await auth.authenticate(bearer_authorization(token))
    with pytest.raises(AuthenticationError, match="not accepted here"):
        await UserAuthenticator(UserDatabase(store)).authenticate(bearer_authorization(token))
    with pytest.raises(AuthenticationError, match="no credentials"):
        await auth.authenticate(None)


async def test_server_security_follows_the_settings(store: MetadataStore,
                                                    tmp_path: Path) -> None:
    assert server_security(SecurityConfig(), store).tls is None
    assert server_security(SecurityConfig(), store).authenticator is None
    secure = server_security(SecurityConfig(auth_enabled=True), store)
    assert isinstance(secure.authenticator, UserAuthenticator)
    assert secure.authenticator.tokens is None
    secret = write_secret(tmp_path / "token-secret", SECRET)
    with_tokens = server_security(SecurityConfig(auth_enabled=True,
                                                 auth_token_secret_file=str(secret)), store)
    assert isinstance(with_tokens.authenticator, UserAuthenticator)
    assert with_tokens.authenticator.tokens is not None
    secret.chmod(0o640)
    with pytest.raises(InsecureSecretFileError):
        server_security(SecurityConfig(auth_enabled=True, auth_token_secret_file=str(secret)),
                        store)
    with pytest.raises(ConfigError):
        server_security(SecurityConfig(auth_enabled=True,
                                       auth_token_secret_file=str(tmp_path / "none")), store)
