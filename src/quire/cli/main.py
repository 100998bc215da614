"""Entry point of the ``quire`` command."""

from __future__ import annotations

import click

from quire.cli.bench import bench
from quire.cli.bookie import bookie
from quire.cli.cookie import cookie
from quire.cli.ledger import ledger
from quire.cli.sandbox import sandbox


@click.group()
@click.version_option(package_name="quire")
def cli() -> None:
    """Quire: a replicated log store (BookKeeper ledgers, Pravega segments, Spark)."""


cli.add_command(bookie)
cli.add_command(cookie)
cli.add_command(sandbox)
cli.add_command(ledger)
cli.add_command(bench)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
