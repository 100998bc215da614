"""Secrets kept in files: read them safely, write them readable by their owner only.

Every secret Quire uses (the cluster's token-signing secret, the segment
stores' ledger password, ZooKeeper digest credentials, a user's credentials
file, a TLS private key) lives in a file named in configuration, never in
code or on a command line (``ps`` and shell histories show those).

Decisions:

* A secret file that its group or others may read **or write**
  (``mode & 0o077``) is refused with
  :class:`~quire.errors.InsecureSecretFileError`, naming the file and the
  fix (``chmod 600``): a writable secret is as bad as a readable one (the
  writer picks the next secret).  The owner is not checked: a service may
  run as another user than the one who wrote the file.
* One trailing newline (``\\n`` or ``\\r\\n``) is stripped, since editors
  add one; anything else is the secret, byte for byte.  An empty secret
  is refused.
* Files are written with ``O_CREAT`` and mode 0600 from the start (never
  written then chmodded, which leaves a window), and an existing file is
  made 0600 before it is truncated and rewritten.
* A credentials file is TOML with ``username`` and ``password`` (what the
  secure sandbox prints and ``quire`` commands take with ``--credentials``).
"""

from __future__ import annotations

import os
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path

from quire.errors import ConfigError, InsecureSecretFileError

SECRET_FILE_MODE = 0o600


def check_secret_file(path: Path | str) -> None:
    """Refuse (InsecureSecretFileError) a file its group or others may
    read or write; ConfigError if it cannot be examined."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise ConfigError(f"cannot read secret file {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(f"secret file {path} is not a regular file")
    if mode & 0o077:
        raise InsecureSecretFileError(
            f"secret file {path} is readable or writable by group or others "
            f"(mode {stat.S_IMODE(mode):04o}); run: chmod 600 {path}")


def read_secret(path: Path | str) -> bytes:
    """The secret in ``path``, one trailing newline stripped (see the module
    docstring); InsecureSecretFileError or ConfigError if it is unsafe,
    unreadable or empty."""
    check_secret_file(path)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read secret file {path}: {e.strerror or e}") from None
    if data.endswith(b"\r\n"):
        data = data[:-2]
    elif data.endswith(b"\n"):
        data = data[:-1]
    if not data:
        raise ConfigError(f"secret file {path} is empty")
    return data


def read_secret_text(path: Path | str) -> str:
    """:func:`read_secret` as UTF-8 text."""
    data = read_secret(path)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ConfigError(f"secret file {path} is not UTF-8 text") from None


def write_secret(path: Path | str, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` readable and writable by its owner only
    (created 0600; an existing file is made 0600 first); the path."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, SECRET_FILE_MODE)
    try:
        os.fchmod(fd, SECRET_FILE_MODE)
        os.write(fd, raw)
    finally:
        os.close(fd)
    return path


@dataclass(frozen=True)
class Credentials:
    """A user name and password, as a credentials file holds them."""

    username: str
    password: str

    def __repr__(self) -> str:  # never the password in a log line or a traceback
        return f"Credentials(username={self.username!r}, password=<hidden>)"


def read_credentials(path: Path | str) -> Credentials:
    """The ``username`` and ``password`` of a TOML credentials file
    (checked like any secret file)."""
    text = read_secret_text(path)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"credentials file {path} is not valid TOML: {e}") from None
    username, password = doc.get("username"), doc.get("password")
    if not isinstance(username, str) or not username or not isinstance(password, str) \
            or not password:
        raise ConfigError(f"credentials file {path} needs a username and a password "
                          "(TOML strings)")
    return Credentials(username, password)


def write_credentials(path: Path | str, credentials: Credentials) -> Path:
    """Write a credentials file (0600) that :func:`read_credentials` reads."""
    def quoted(value: str) -> str:  # a TOML basic string
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return '"' + "".join(c if c.isprintable() else f"\\u{ord(c):04x}"
                             for c in escaped) + '"'

    return write_secret(path, f"username = {quoted(credentials.username)}\n"
                              f"password = {quoted(credentials.password)}\n")
