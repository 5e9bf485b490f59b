"""The band rule of mixed checkpointing in the graph (``loops/_mixed_rule.py``) against its
reference, ``Mixed.split`` and ``Mixed.leaf_size``: exactly, over every level and a grid of
segment lengths, for several leaf tuples."""

from __future__ import annotations

from fractions import Fraction

import jax
import numpy as np
import pytest

from retrograde.loops import _mixed_rule
from retrograde.loops._binomial import CAP
from retrograde.schedules import Mixed

SCHEDULES = [
    Mixed(6),  # d = 1: the closed form's leaves
    Mixed(12, 2),  # runs of two levels
    Mixed(Fraction(15, 2), 3),  # a fractional budget, runs of three
    Mixed(5, 9),  # no data fits: Revolve's leaves
    Mixed(40, 4),
]
LENGTHS = np.array([*range(1, 161), 1000, 4321, 10**5, 123_457, CAP - 1], np.int32)


def _twin(leaves):
    batched = jax.vmap(lambda n, level: _mixed_rule.split(leaves, n, level))
    return jax.jit(batched)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=repr)
def test_split_matches_python(schedule):
    leaves = schedule._leaves
    top = len(leaves) - 1
    levels = np.repeat(np.arange(top + 1, dtype=np.int32), len(LENGTHS))
    lengths = np.tile(LENGTHS, top + 1)
    keep = (levels < top) | (lengths <= leaves[top])  # a reversible segment
    levels, lengths = levels[keep], lengths[keep]
    got = np.asarray(_twin(leaves)(lengths, levels))
    want = [schedule.split(int(n), int(k)) for n, k in zip(lengths, levels)]
    assert got.tolist() == want


def test_leaf_size_matches_python():
    for schedule in SCHEDULES:
        leaves = schedule._leaves
        got = jax.jit(jax.vmap(lambda k, leaves=leaves: _mixed_rule.leaf_size(leaves, k)))(
            np.arange(len(leaves), dtype=np.int32)
        )
        assert np.asarray(got).tolist() == [schedule.leaf_size(k) for k in range(len(leaves))]


@pytest.mark.parametrize("schedule", [Mixed(6, 1.5), Mixed(6, 0.5)], ids=repr)
def test_leaves_without_a_band_rule_are_refused(schedule):
    with pytest.raises(ValueError, match="no band rule"):
        _mixed_rule.split(schedule._leaves, 10, 0)
