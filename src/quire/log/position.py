"""Positions in a named log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """Where an entry sits in a log: ``(ledger_seq, entry_id)``.

    ``ledger_seq`` numbers the log's ledgers in the order they joined it
    (0, 1, 2, ...; a number is never reused, even after the ledger is
    truncated away); ``entry_id`` is the entry's id in that ledger.  Positions
    are totally ordered, lexicographically, which is log order.  A position
    need not name an existing entry: ``Position(s, n)`` past the end of
    ledger ``s`` is the same place as the start of the next ledger.

    The text form is ``"seq:entry"`` (see :meth:`parse` and ``str()``).
    """

    ledger_seq: int
    entry_id: int

    START: ClassVar[Position]
    """The first position of every log: ``Position(0, 0)``."""

    def __post_init__(self) -> None:
        if type(self.ledger_seq) is not int or type(self.entry_id) is not int:
            raise TypeError(f"Position takes two ints, got {self.ledger_seq!r}, "
                            f"{self.entry_id!r}")
        if self.ledger_seq < 0 or self.entry_id < 0:
            raise ValueError(f"Position fields must be >= 0, got {self.ledger_seq}:"
                             f"{self.entry_id}")

    @classmethod
    def parse(cls, text: str) -> Position:
        """Parse ``"seq:entry"`` (ValueError if malformed)."""
        seq, sep, entry = text.strip().partition(":")
        if not sep:
            raise ValueError(f"a position is 'seq:entry', got {text!r}")
        try:
            return cls(int(seq), int(entry))
        except (TypeError, ValueError) as e:
            raise ValueError(f"a position is 'seq:entry' with ints >= 0, got {text!r}") from e

    def next(self) -> Position:
        """The position right after this one in the same ledger."""
        return Position(self.ledger_seq, self.entry_id + 1)

    def __str__(self) -> str:
        return f"{self.ledger_seq}:{self.entry_id}"


Position.START = Position(0, 0)
