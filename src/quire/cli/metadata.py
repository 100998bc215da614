"""``quire metadata secure``: give the znodes of a ZooKeeper store made
without ACLs Quire's digest ACL (the upgrade in place; the decisions are in
:mod:`quire.metadata._zkaccess`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from quire.cli.common import (
    default_metadata_uri,
    emit_json,
    json_option,
    metadata_option,
    run_async,
    zookeeper_settings,
)

if TYPE_CHECKING:
    from quire.metadata import SecuredTree


@click.group()
def metadata() -> None:
    """The metadata store itself."""


@metadata.command("secure")
@metadata_option
@json_option
@click.option("--quiet", is_flag=True, help="No progress line on stderr.")
def secure(metadata_uri: str | None, as_json: bool, quiet: bool) -> None:
    """Give every znode of a zk:// store (its chroot's node and everything
    under it) the ACL of --zookeeper-digest-file: all permissions for that
    user, none for anyone else.

    Run it once every process of the cluster has zookeeper_digest_file: a
    process without it is locked out from then on.  Znodes that have the
    ACL are left as they are, so running it again (after an interruption,
    or to cover znodes an old process made meanwhile) is safe.
    """
    from quire.metadata import secure_store

    uri = metadata_uri or default_metadata_uri()
    settings = zookeeper_settings()
    shown = [False]

    def show(done: SecuredTree) -> None:
        if not (quiet or as_json):
            click.echo(f"\r{done.znodes:>10,} znodes walked, {done.secured:>10,} secured",
                       nl=False, err=True)
            shown[0] = True

    result = run_async(lambda: secure_store(uri, settings, progress=show))
    if shown[0]:
        click.echo("", err=True)
    if as_json:
        emit_json({"metadata": uri, "znodes": result.znodes, "secured": result.secured})
    else:
        click.echo(f"{uri}: {result.secured} znodes given the digest ACL, "
                   f"{result.znodes - result.secured} had it already")
