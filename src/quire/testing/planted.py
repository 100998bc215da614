"""Product bugs planted in one server process, to show that a fault round's
history checker has teeth (:mod:`quire.simulation.bugs` does the same for
the simulation).

A test starts the server with ``python -m quire.testing.planted`` instead of
``python -m quire.cli.main`` (same arguments) and names the bug in the
environment variable ``QUIRE_PLANTED_BUG``; this module reads it once, at
start, patches the product function for the life of the process, then runs
the command line.  The product never imports this module and has no switch
and no check on any path: a process started without it runs unchanged, at
unchanged speed.

* ``bookie-skip-fencing``: the bookie answers fencing reads (a recovery's,
  a new tier-1 log owner's) without fencing the ledger, so an old writer
  keeps adding, and being acknowledged, past the end a recovery closes the
  ledger at.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from quire.bookie.handlers import RequestHandlers
from quire.errors import StatusCode

ENV = "QUIRE_PLANTED_BUG"
BUGS = ("bookie-skip-fencing",)


def _answer_without_fencing(self: RequestHandlers, ledger_id: int, key: bytes | None,
                            then: Callable[[], None],
                            fail: Callable[[StatusCode], None]) -> None:
    then()  # the bug: no storage.fence(), so later plain adds are still taken


def plant(name: str) -> None:
    """Switch bug ``name`` on in this process for good ("" : none)."""
    if not name:
        return
    if name not in BUGS:
        raise SystemExit(f"{ENV}: unknown planted bug {name!r} (known: {', '.join(BUGS)})")
    if name == "bookie-skip-fencing":
        RequestHandlers._fence_then = _answer_without_fencing  # type: ignore[method-assign]


def main() -> None:
    plant(os.environ.get(ENV, ""))
    from quire.cli.main import main as cli

    cli()


if __name__ == "__main__":
    main()
