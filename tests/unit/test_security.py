"""quire.security without sockets: secret files, password hashes, Pravega
resources and ACLs, principals and the authorization header, delegation tokens."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import pytest

from quire.errors import (
    AuthenticationError,
    ConfigError,
    InsecureSecretFileError,
    MalformedAclError,
    PermissionDeniedError,
    TokenExpiredError,
    TokenInvalidError,
)
from quire.security import (
    CLUSTER_RESOURCE,
    INTERNAL_RESOURCE,
    INTERNAL_SUBJECT,
    Acl,
    BasicCredentials,
    BearerToken,
    Credentials,
    Permission,
    Principal,
    SecurityConfig,
    TokenSigner,
    basic_authorization,
    hash_password,
    parse_authorization,
    read_credentials,
    read_secret,
    reader_group_resource,
    scope_resource,
    segment_resource,
    stream_info_resource,
    stream_resource,
    verify_password,
    write_credentials,
    write_secret,
)
from quire.security.passwords import DUMMY_HASH, is_password_hash

READ, READ_UPDATE, NONE = Permission.READ, Permission.READ_UPDATE, Permission.NONE

# --- secret files -------------------------------------------------------------------


def test_a_secret_file_open_to_others_is_refused_naming_the_file_and_the_fix(
        tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"s3cret\n")
    for mode in (0o644, 0o640, 0o602, 0o620):
        path.chmod(mode)
        with pytest.raises(InsecureSecretFileError) as refused:
            read_secret(path)
        assert str(path) in str(refused.value) and f"chmod 600 {path}" in str(refused.value)
    path.chmod(0o600)
    assert read_secret(path) == b"s3cret"
    path.chmod(0o400)
    assert read_secret(path) == b"s3cret"


def test_only_one_trailing_newline_is_stripped_and_empty_or_missing_is_an_error(
        tmp_path: Path) -> None:
    path = write_secret(tmp_path / "s", b"a b\n\n")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert read_secret(path) == b"a b\n"
    write_secret(path, "x\r\n")
    assert read_secret(path) == b"x"
    write_secret(path, b"\n")
    with pytest.raises(ConfigError, match="empty"):
        read_secret(path)
    with pytest.raises(ConfigError, match="cannot read"):
        read_secret(tmp_path / "missing")


def test_write_secret_tightens_an_existing_file_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "s"
    path.write_text("old")
    path.chmod(0o644)
    write_secret(path, "new")
    assert os.stat(path).st_mode & 0o777 == 0o600 and read_secret(path) == b"new"


def test_credentials_files_round_trip_any_password(tmp_path: Path) -> None:
    credentials = Credentials("admin", 'p"a\\s s\u00e9=#\n')
    path = write_credentials(tmp_path / "credentials.toml", credentials)
    assert read_credentials(path) == credentials
    assert "p\"a" not in repr(credentials)
    path.write_text('username = "a"\n')
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="username and a password"):
        read_credentials(path)


# --- passwords ----------------------------------------------------------------------


def test_scrypt_hashes_are_self_describing_salted_and_check_only_the_password() -> None:
    first, second = hash_password("correct horse"), hash_password("correct horse")
    assert re.fullmatch(r"scrypt\$16384\$8\$1\$[A-Za-z0-9+/=]+\$[A-Za-z0-9+/=]+", first)
    assert first != second  # a fresh salt each time
    assert verify_password("correct horse", first) and verify_password("correct horse", second)
    assert not verify_password("correct horse!", first)
    assert not verify_password("", first)
    for junk in ("", "plain", "scrypt$16384$8$1$@@$@@", "scrypt$3$8$1$AAAA$" + "A" * 44,
                 "scrypt$4194304$8$1$AAAA$" + "A" * 44):
        assert not is_password_hash(junk) and not verify_password("x", junk)
    assert is_password_hash(DUMMY_HASH) and not verify_password("", DUMMY_HASH)
    with pytest.raises(ValueError):
        hash_password("")


def test_a_cheaper_stored_hash_still_verifies() -> None:
    # the parameters come from the stored text, so the default cost may change
    cheap = hash_password("pw", n=1 << 10, r=4)
    assert cheap.startswith("scrypt$1024$4$1$") and verify_password("pw", cheap)


# --- resources and ACLs -------------------------------------------------------------


def test_resource_builders_give_pravegas_names() -> None:
    assert CLUSTER_RESOURCE == "prn::/"
    assert scope_resource("sc") == "prn::/scope:sc"
    assert stream_resource("sc", "st") == "prn::/scope:sc/stream:st"
    assert reader_group_resource("sc", "rg") == "prn::/scope:sc/reader-group:rg"
    with pytest.raises(ValueError):
        stream_resource("sc", "")


@pytest.mark.parametrize(("segment", "resource"), [
    ("sc/st/0.#epoch.0", "prn::/scope:sc/stream:st"),
    ("sc/st/3.#epoch.2#transaction.00000002000000000000000000000001",
     "prn::/scope:sc/stream:st"),
    ("sc/st/0.#epoch.0#transient.abc", "prn::/scope:sc/stream:st"),
    ("sc/st/0.#epoch.0$attributes", "prn::/scope:sc/stream:st"),
    ("sc/rg_kvtable/0.#epoch.0", "prn::/scope:sc/reader-group:rg"),  # the Rust client's
    ("sc/rg_kvtable/0.#epoch.0$index", "prn::/scope:sc/reader-group:rg"),
    ("sc/_RGrg/0.#epoch.0", "prn::/scope:sc/reader-group:rg"),  # the Java client's
    ("sc/_MARKst/0.#epoch.0", "prn::/scope:sc/stream:st"),
    ("sc/_SPARKst/0.#epoch.0", "prn::/scope:sc/stream:st"),  # Spark's commit records
    ("sc/_SPARKst_kvtable/0.#epoch.0", "prn::/scope:sc/stream:st_kvtable"),
    ("_system/_tables/scopes", INTERNAL_RESOURCE),
    ("_system/containers/storage_metadata_3", INTERNAL_RESOURCE),
    ("_other/x/0", INTERNAL_RESOURCE),
    ("bare-name", INTERNAL_RESOURCE),
    ("/st/0", INTERNAL_RESOURCE),
    ("sc/", INTERNAL_RESOURCE),
])
def test_segments_map_to_the_resource_guarding_them(segment: str, resource: str) -> None:
    assert segment_resource(segment) == resource


def test_a_stream_info_maps_like_its_segments() -> None:
    # what getDelegationToken is asked for a reader group's state table
    assert stream_info_resource("sc", "rg_kvtable") == "prn::/scope:sc/reader-group:rg"
    assert stream_info_resource("sc", "st") == "prn::/scope:sc/stream:st"
    assert stream_info_resource("_system", "x") == INTERNAL_RESOURCE
    assert stream_info_resource("sc", "_kvtable") == "prn::/scope:sc/stream:_kvtable"


def test_acl_text_round_trips_and_tolerates_spaces_and_a_trailing_semicolon() -> None:
    acl = Acl.parse(" prn::/scope:S , READ ;prn::/scope:S/*,READ_UPDATE;")
    assert str(acl) == "prn::/scope:S,READ;prn::/scope:S/*,READ_UPDATE"
    assert Acl.parse(str(acl)) == acl
    assert Acl.parse("") == Acl() and str(Acl()) == ""


def test_acl_matching_with_wildcards_first_match_wins() -> None:
    sc, st = scope_resource("S"), stream_resource("S", "T")
    other = stream_resource("S2", "T")
    assert Acl.parse("prn::*,READ").permission(CLUSTER_RESOURCE) == READ
    assert Acl.parse("prn::*,READ").permission(other) == READ
    inside = Acl.parse("prn::/scope:S/*,READ_UPDATE")
    assert inside.permission(st) == READ_UPDATE
    assert inside.permission(reader_group_resource("S", "g")) == READ_UPDATE
    assert inside.permission(sc) == NONE  # the scope itself is not inside it
    assert inside.permission(stream_resource("S2", "T")) == NONE
    scopes = Acl.parse("prn::/scope:*,READ")
    assert scopes.permission(sc) == READ and scopes.permission(st) == READ  # * crosses '/'
    assert scopes.permission(CLUSTER_RESOURCE) == NONE
    assert Acl.parse("prn::/,READ").permission(sc) == NONE
    assert Acl.parse("prn::/scope:app-*/stream:in,READ").permission(
        stream_resource("app-1", "in")) == READ
    # Pravega's rule: the first matching entry decides, even a lower one
    ordered = Acl.parse("prn::/scope:S/stream:T,READ;prn::/scope:S/*,READ_UPDATE")
    assert ordered.permission(st) == READ
    assert ordered.permission(stream_resource("S", "U")) == READ_UPDATE
    assert Acl.parse("prn::/scope:S/stream:T,NONE;prn::*,READ_UPDATE").permission(st) == NONE
    assert ordered.allows(st, READ) and not ordered.allows(st, READ_UPDATE)
    # only '*' is special: a '.' in a name is a '.'
    assert Acl.parse("prn::/scope:a.b,READ").permission(scope_resource("aXb")) == NONE


@pytest.mark.parametrize(("text", "part"), [
    ("prn::/scope:S", "prn::/scope:S"),
    ("prn::/scope:S,WRITE", "WRITE"),
    ("prn::/scope:S,read", "read"),
    ("prn::/scope:S,READ,READ", "prn::/scope:S,READ,READ"),
    ("prn::/scope:S,READ;prn::/scop:T,READ", "scop:T"),
    ("scope:S,READ", "scope:S"),
    ("prn::scope:S,READ", "scope:S"),
    ("prn::/scope:S/stream:T/segment:0,READ", "scope:S/stream:T/segment:0"),
    ("prn::/stream:T,READ", "stream:T"),
    ("prn::/scope:S/scope:T,READ", "scope:T"),
    ("prn::/scope:,READ", "scope:"),
    (",READ", ""),
])
def test_a_malformed_acl_is_refused_naming_the_bad_part(text: str, part: str) -> None:
    with pytest.raises(MalformedAclError) as refused:
        Acl.parse(text)
    assert refused.value.part == part
    assert repr(part) in str(refused.value) or part == ""


def test_no_acl_reaches_an_internal_resource_only_the_internal_identity_does() -> None:
    everything = Acl.parse("prn::*,READ_UPDATE;prn::/scope:_system,READ_UPDATE")
    admin = Principal("admin", everything)
    internal = Principal(INTERNAL_SUBJECT, Acl(), internal=True)
    system = segment_resource("_system/_tables/scopes")
    assert everything.permission(system) == READ_UPDATE  # the pattern matches...
    assert admin.permission(system) == NONE  # ...but the principal's rule says no
    assert admin.permission(stream_resource("S", "T")) == READ_UPDATE
    assert internal.permission(system) == READ_UPDATE
    with pytest.raises(PermissionDeniedError, match="admin may not READ prn::/scope:_system"):
        admin.require(system, READ)
    internal.require(system, READ_UPDATE)


# --- the authorization header -------------------------------------------------------


def test_basic_and_bearer_headers_parse_and_everything_else_is_refused() -> None:
    header = basic_authorization("alice", "secret:with:colons")
    assert header == "Basic " + base64.b64encode(b"alice:secret:with:colons").decode()
    assert parse_authorization(header) == BasicCredentials("alice", "secret:with:colons")
    assert parse_authorization("basic YWxpY2U6c2VjcmV0") == BasicCredentials("alice", "secret")
    assert parse_authorization("Bearer a.b.c") == BearerToken("a.b.c")
    for bad in (None, "", "  ", "Basic", "Basic !!!", "Basic " + base64.b64encode(
            b"nocolon").decode(), "Basic " + base64.b64encode(b":pw").decode(),
            "Digest x", "Bearer"):
        with pytest.raises(AuthenticationError):
            parse_authorization(bad)
    assert "secret" not in repr(parse_authorization(header))
    with pytest.raises(ValueError):
        basic_authorization("a:b", "pw")


# --- delegation tokens --------------------------------------------------------------

SECRET = b"0123456789abcdef0123456789abcdef"
NOW = 1_700_000_000
GOLDEN = (
    "eyJhbGciOiJIUzUxMiIsInR5cCI6IkpXVCJ9."
    "eyJhY2wiOiJwcm46Oi9zY29wZTpzYy9zdHJlYW06c3QsUkVBRF9VUERBVEUiLCJleHAiOjE3MDAwMDA2MDAsImlh"
    "dCI6MTcwMDAwMDAwMCwic3ViIjoiYWxpY2UifQ==."
    "ZPjrDj2nBP0yQjugrz+wb9I5/HM9Rv4jGgPt8cU9B+ZP7rkMnkG+wG4TFmKP58PJwKPWlpuwOQHhMaPq+gBwpg==")
"""alice's token for READ_UPDATE on sc/st, issued at NOW for 600 s with SECRET."""


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def official_client_accepts(token: str) -> int:
    """The Rust client's rules (pravega-client-rust auth/src/lib.rs): three
    parts, the middle one standard base64 (padding optional), ``"exp":``
    and digits in it; its expiry."""
    parts = token.split(".")
    assert len(parts) == 3
    middle = parts[1]
    assert re.fullmatch(r"[A-Za-z0-9+/]*={0,2}", middle)  # the standard alphabet only
    body = base64.b64decode(middle + "=" * (-len(middle) % 4), validate=True).decode()
    found = re.search(r'"exp":\s?(\d+)', body)
    assert found is not None
    return int(found.group(1))


def test_a_token_has_the_shape_the_official_client_accepts_golden() -> None:
    signer = TokenSigner(SECRET, clock=Clock())
    token = signer.issue("alice", {stream_resource("sc", "st"): READ_UPDATE}, ttl_s=600)
    assert token == GOLDEN
    assert official_client_accepts(token) == NOW + 600
    claims = signer.verify(token)
    assert (claims.subject, claims.issued_at_s, claims.expires_at_s) == ("alice", NOW, NOW + 600)
    principal = claims.principal()
    assert principal.allows(stream_resource("sc", "st"), READ_UPDATE)
    assert principal.permission(stream_resource("sc", "other")) == NONE  # one stream only
    assert not principal.internal


def test_tokens_with_many_grants_never_hold_base64url_characters() -> None:
    signer = TokenSigner(SECRET, clock=Clock())
    for i in range(200):  # bodies of every length mod 3, odd characters in names
        token = signer.issue(f"user{i}", {stream_resource(f"s-{i}~?", "t" * (i + 1)): READ}, 60)
        assert "-" not in token.split(".")[1] and "_" not in token.split(".")[1]
        official_client_accepts(token)


def test_a_tampered_token_is_invalid_not_expired() -> None:
    signer = TokenSigner(SECRET, clock=Clock())
    header, body, signature = GOLDEN.split(".")
    forged_body = base64.b64encode(base64.b64decode(body).replace(
        b"stream:st", b"stream:s2")).decode()
    flipped = signature[:10] + ("A" if signature[10] != "A" else "B") + signature[11:]
    none_header = base64.b64encode(b'{"alg":"none"}').decode()
    for bad in (f"{header}.{forged_body}.{signature}", f"{header}.{body}.{flipped}",
                f"{none_header}.{body}.{signature}", f"{header}.{body}", f"{header}.{body}.",
                f"{header}.{body}.{signature}.x", "", "x" * 20_000, f"{header}.{body}.!!"):
        with pytest.raises(TokenInvalidError):
            signer.verify(bad)
    with pytest.raises(TokenInvalidError):  # another cluster's secret
        TokenSigner(b"another secret of 32 bytes......", clock=Clock()).verify(GOLDEN)


def test_an_expired_token_is_refused_as_expired() -> None:
    clock = Clock()
    signer = TokenSigner(SECRET, clock=clock)
    clock.now = NOW + 599.9
    assert signer.verify(GOLDEN).subject == "alice"
    clock.now = NOW + 600
    with pytest.raises(TokenExpiredError, match="alice"):
        signer.verify(GOLDEN)
    assert not issubclass(TokenExpiredError, TokenInvalidError)  # the wire answers them apart


def test_the_internal_identity_is_a_token_only_secret_holders_make() -> None:
    signer = TokenSigner(SECRET, clock=Clock())
    claims = signer.verify(signer.internal_token(ttl_s=60))
    assert claims.subject == INTERNAL_SUBJECT and claims.internal
    principal = claims.principal()
    assert principal.allows(segment_resource("_system/_tables/scopes"), READ_UPDATE)
    assert principal.allows(CLUSTER_RESOURCE, READ_UPDATE)
    for reserved in (INTERNAL_SUBJECT, "_x", ""):
        with pytest.raises(ValueError):
            signer.issue(reserved, {"prn::*": READ_UPDATE}, 60)
    with pytest.raises(ValueError):
        signer.issue("alice", {"prn::*": READ}, 0)


def test_a_short_secret_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        TokenSigner(b"short")
    path = write_secret(tmp_path / "token-secret", SECRET + b"\n")
    assert TokenSigner.from_file(path, clock=Clock()).verify(GOLDEN).subject == "alice"


# --- the shared settings ------------------------------------------------------------


def test_security_settings_need_a_certificate_and_its_key_together() -> None:
    assert not SecurityConfig().tls_enabled and not SecurityConfig().auth_enabled
    assert SecurityConfig(tls_cert_file="c", tls_key_file="k").tls_enabled
    with pytest.raises(ConfigError, match="tls_cert_file and tls_key_file"):
        SecurityConfig(tls_cert_file="c")
    with pytest.raises(ConfigError):
        SecurityConfig(tls_reload_interval_ms=-1)
