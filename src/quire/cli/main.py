"""Entry point of the ``quire`` command."""

from __future__ import annotations

import click

from quire.cli.auth import auth
from quire.cli.autorecovery import autorecovery, decommission, underreplicated
from quire.cli.bench import bench
from quire.cli.bookie import bookie
from quire.cli.common import DEBUG_ENV, QuireGroup
from quire.cli.controller import controller
from quire.cli.cookie import cookie
from quire.cli.ledger import ledger
from quire.cli.log import log
from quire.cli.metadata import metadata
from quire.cli.readergroups import readergroup, txn
from quire.cli.sandbox import sandbox
from quire.cli.segmentstore import segmentstore
from quire.cli.stream_shape import stream_info, stream_scale, stream_truncate, stream_update
from quire.cli.streams import scope, stream
from quire.cli.tier2 import tier2


@click.group(cls=QuireGroup)
@click.version_option(package_name="quire")
@click.option("--debug", is_flag=True, expose_value=False,
              help=f"Show the traceback of an internal error (or set {DEBUG_ENV}=1).")
def cli() -> None:
    """Quire: a replicated log store (BookKeeper ledgers, Pravega segments, Spark).

    An error prints one line, ``error: ...``, on stderr (and ``{"error": ...}``
    on stdout with --json); the exit status is 1, or 2 for a usage error.
    """


cli.add_command(bookie)
cli.add_command(cookie)
cli.add_command(sandbox)
cli.add_command(ledger)
cli.add_command(log)
cli.add_command(bench)
cli.add_command(autorecovery)
cli.add_command(segmentstore)
cli.add_command(controller)
cli.add_command(scope)
cli.add_command(stream)
cli.add_command(readergroup)
for command in (stream_info, stream_update, stream_truncate, stream_scale):
    stream.add_command(command)
cli.add_command(txn)
cli.add_command(tier2)
cli.add_command(auth)
cli.add_command(metadata)
bookie.add_command(decommission)
ledger.add_command(underreplicated)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
