"""``quire auth user add|passwd|acl|list|delete``: the users servers authenticate.

Users live in the metadata store (:mod:`quire.auth`), so every server sees
a change at once (within its cache period, 10 s).  ACLs are Pravega's text
(``prn::/scope:S,READ_UPDATE;prn::/scope:S/*,READ``, see
:mod:`quire.security.acl`).

A password is never a command-line argument (``ps``, ``/proc`` and shell
histories show those to others): it is read from ``--password-file`` (a
secret file, mode 0600), else asked twice at the terminal, else read from
standard input when that is not a terminal (one trailing newline
stripped), e.g. ``pwgen 24 1 | quire auth user add app --acl ...``.
``--password`` exists only to say so.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from quire.cli.common import (
    COMMAND_LINE_SHOWS_SECRETS,
    emit_json,
    json_option,
    metadata_option,
    with_store,
)

if TYPE_CHECKING:
    from quire.auth import User
    from quire.metadata import MetadataStore
    from quire.security import Acl

F = TypeVar("F", bound=Callable[..., Any])

PASSWORD_ARGUMENT_REFUSED = (
    f"a password is not taken on the command line ({COMMAND_LINE_SHOWS_SECRETS}): type it "
    "at the prompt, pipe it on stdin, or use --password-file PATH")


@click.group()
def auth() -> None:
    """Users and their permissions (Pravega ACLs), kept in the metadata store."""


@auth.group()
def user() -> None:
    """Add, change, list and delete the users servers authenticate."""


def password_options(func: F) -> F:
    func = click.option("--password", "password_argument", default=None, hidden=True,
                        help="Refused: see --password-file.")(func)
    return click.option(
        "--password-file", type=click.Path(dir_okay=False), default=None,
        help="Read the password from this file (mode 0600) instead of the prompt or "
             "stdin.")(func)


def read_password(password_file: str | None, password_argument: str | None) -> str:
    """The new password, from the file, the terminal (twice) or stdin."""
    from quire.security import read_secret_text

    if password_argument is not None:
        raise click.UsageError(PASSWORD_ARGUMENT_REFUSED)
    if password_file:
        return read_secret_text(password_file)
    stdin = sys.stdin
    if stdin.isatty():
        password: str = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    else:
        password = stdin.read()
        password = password[:-1] if password.endswith("\n") else password
        password = password[:-1] if password.endswith("\r") else password
    if not password:
        raise click.UsageError("the password may not be empty")
    return password


def parse_acl_option(text: str) -> Acl:
    from quire.errors import MalformedAclError
    from quire.security import Acl

    try:
        return Acl.parse(text)
    except MalformedAclError as e:
        raise click.BadParameter(str(e), param_hint="--acl") from None


def checked_name(name: str) -> str:
    from quire.auth import check_user_name

    try:
        check_user_name(name)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="NAME") from None
    return name


def describe(user: User) -> dict[str, Any]:
    return {"name": user.name, "acl": str(user.acl), "version": user.version}


acl_option = click.option(
    "--acl", "acl_text", required=True, metavar="ACL",
    help='Pravega ACL, e.g. "prn::/scope:S,READ_UPDATE;prn::/scope:S/*,READ" '
         '("" grants nothing).')


@user.command("add")
@click.argument("name")
@acl_option
@password_options
@metadata_option
@json_option
def add(name: str, acl_text: str, password_file: str | None, password_argument: str | None,
        metadata_uri: str | None, as_json: bool) -> None:
    """Add user NAME with the ACL given and a password (prompt, stdin or file)."""
    from quire.auth import UserDatabase

    acl = parse_acl_option(acl_text)
    password = read_password(password_file, password_argument)

    async def go(store: MetadataStore) -> User:
        return await UserDatabase(store).add(checked_name(name), password, acl)

    added = with_store(metadata_uri, go, create=True)
    emit_json(describe(added)) if as_json else click.echo(f"user {name} added")


@user.command("passwd")
@click.argument("name")
@password_options
@metadata_option
@json_option
def passwd(name: str, password_file: str | None, password_argument: str | None,
           metadata_uri: str | None, as_json: bool) -> None:
    """Change the password of user NAME (prompt, stdin or file)."""
    from quire.auth import UserDatabase

    checked_name(name)
    password = read_password(password_file, password_argument)

    async def go(store: MetadataStore) -> User:
        return await UserDatabase(store).set_password(name, password)

    changed = with_store(metadata_uri, go)
    emit_json(describe(changed)) if as_json else click.echo(f"password of {name} changed")


@user.command("acl")
@click.argument("name")
@acl_option
@metadata_option
@json_option
def set_acl(name: str, acl_text: str, metadata_uri: str | None, as_json: bool) -> None:
    """Replace the ACL of user NAME."""
    from quire.auth import UserDatabase

    checked_name(name)
    acl = parse_acl_option(acl_text)

    async def go(store: MetadataStore) -> User:
        return await UserDatabase(store).set_acl(name, acl)

    changed = with_store(metadata_uri, go)
    emit_json(describe(changed)) if as_json else click.echo(f"ACL of {name}: {changed.acl}")


@user.command("list")
@metadata_option
@json_option
def list_users(metadata_uri: str | None, as_json: bool) -> None:
    """Every user and its ACL (never a password or its hash)."""
    from quire.auth import UserDatabase

    async def go(store: MetadataStore) -> list[User]:
        return await UserDatabase(store).list()

    users = with_store(metadata_uri, go)
    if as_json:
        emit_json([describe(u) for u in users])
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("user", "acl")
    for u in users:
        table.add_row(u.name, str(u.acl) or "(none)")
    Console().print(table)


@user.command("delete")
@click.argument("name")
@metadata_option
@json_option
def delete(name: str, metadata_uri: str | None, as_json: bool) -> None:
    """Delete user NAME."""
    from quire.auth import UserDatabase

    checked_name(name)

    async def go(store: MetadataStore) -> None:
        await UserDatabase(store).delete(name)

    with_store(metadata_uri, go)
    emit_json({"name": name, "deleted": True}) if as_json else click.echo(
        f"user {name} deleted")
