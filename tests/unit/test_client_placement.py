"""Placement and striping rules (pure functions, no I/O)."""

from __future__ import annotations

import random

import pytest

from quire.client.placement import RandomPlacement, write_set, write_set_table
from quire.errors import NotEnoughBookiesError


def test_write_sets_without_striping_are_the_whole_ensemble_rotated() -> None:
    assert write_set_table(3, 3) == ((0, 1, 2), (1, 2, 0), (2, 0, 1))
    assert write_set(7, 3, 3) == (1, 2, 0)


def test_striped_write_sets_follow_e_plus_i_mod_e() -> None:
    for entry_id in range(20):
        assert write_set(entry_id, 5, 3) == tuple((entry_id + i) % 5 for i in range(3))
    # every bookie holds W/E of the entries
    counts = [0] * 5
    for entry_id in range(100):
        for index in write_set(entry_id, 5, 3):
            counts[index] += 1
    assert counts == [60] * 5


def test_write_set_table_refuses_bad_sizes() -> None:
    with pytest.raises(ValueError):
        write_set_table(2, 3)


def test_new_ensemble_picks_distinct_writable_bookies() -> None:
    placement = RandomPlacement(random.Random(7))
    bookies = [f"b{i}" for i in range(6)]
    seen: set[str] = set()
    for _ in range(50):
        ensemble = placement.new_ensemble(3, bookies, exclude={"b0"})
        assert len(set(ensemble)) == 3
        assert "b0" not in ensemble
        seen.update(ensemble)
    assert seen == set(bookies) - {"b0"}  # random, not always the same three


def test_not_enough_bookies() -> None:
    placement = RandomPlacement()
    with pytest.raises(NotEnoughBookiesError):
        placement.new_ensemble(3, ["a", "b"])
    with pytest.raises(NotEnoughBookiesError):
        placement.new_ensemble(2, ["a", "b"], exclude={"a"})


def test_replacement_avoids_the_ensemble_and_the_excluded() -> None:
    placement = RandomPlacement()
    for _ in range(20):
        assert placement.replace_bookie(["a", "b", "c"], ["a", "b", "c", "d", "e"],
                                        exclude={"e"}) == "d"
    with pytest.raises(NotEnoughBookiesError):
        placement.replace_bookie(["a", "b", "c"], ["a", "b", "c", "d"], exclude={"d"})
