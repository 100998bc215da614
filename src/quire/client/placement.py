"""Where entries go: ensemble placement and the round-robin write sets.

Placement picks distinct writable bookies at random (BookKeeper's default
policy without racks).  Striping: with ``E`` bookies in the ensemble and a
write quorum of ``W``, entry ``e`` is written to the bookies at indices
``(e + i) % E`` for ``i`` in ``0..W-1`` (its *write set*), so with
``E > W`` consecutive entries spread over the whole ensemble.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Collection, Sequence

from quire.errors import NotEnoughBookiesError


@functools.lru_cache(maxsize=64)
def write_set_table(ensemble_size: int, write_quorum_size: int) -> tuple[tuple[int, ...], ...]:
    """The write set of every residue: ``table[e % E]`` are entry ``e``'s
    ensemble indices, in the order reads try them."""
    if not 1 <= write_quorum_size <= ensemble_size:
        raise ValueError(f"need 1 <= write quorum ({write_quorum_size}) <= ensemble "
                         f"({ensemble_size})")
    return tuple(tuple((first + i) % ensemble_size for i in range(write_quorum_size))
                 for first in range(ensemble_size))


def write_set(entry_id: int, ensemble_size: int, write_quorum_size: int) -> tuple[int, ...]:
    """Ensemble indices entry ``entry_id`` is written to."""
    return write_set_table(ensemble_size, write_quorum_size)[entry_id % ensemble_size]


def write_set_bookies(ensemble: Sequence[str], entry_id: int,
                      write_quorum_size: int) -> tuple[str, ...]:
    """The bookies of ``ensemble`` that entry ``entry_id`` is written to."""
    return tuple(ensemble[i] for i in write_set(entry_id, len(ensemble), write_quorum_size))


class RandomPlacement:
    """Chooses distinct writable bookies uniformly at random."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def new_ensemble(self, ensemble_size: int, writable: Sequence[str],
                     exclude: Collection[str] = ()) -> tuple[str, ...]:
        """``ensemble_size`` distinct bookies from ``writable`` minus ``exclude``;
        :class:`NotEnoughBookiesError` if there are fewer."""
        candidates = sorted(set(writable) - set(exclude))
        if len(candidates) < ensemble_size:
            raise NotEnoughBookiesError(
                f"need {ensemble_size} writable bookies, only {len(candidates)} available"
                + (f": {', '.join(candidates)}" if candidates else ""))
        return tuple(self._rng.sample(candidates, ensemble_size))

    def replace_bookie(self, ensemble: Sequence[str], writable: Sequence[str],
                       exclude: Collection[str] = ()) -> str:
        """One writable bookie that is neither in ``ensemble`` nor excluded."""
        candidates = sorted(set(writable) - set(ensemble) - set(exclude))
        if not candidates:
            raise NotEnoughBookiesError(
                f"no writable bookie left to replace one of {', '.join(ensemble)}")
        return self._rng.choice(candidates)
