"""Memory of CheckpointAdjoint's second-order derivative (compile only, nothing is run).

d/d(model) |d loss / d y0|^2 through 4000 constant Tsit5 steps of a neural ODE on a batch of 64
initial values, SaveAt(ts=...) at 100 times: temp memory at most 2 MiB with the default schedule
(Online(88) at 4000 steps, RecursiveCheckpointAdjoint's memory rule; measured 1.80 MiB) and with
Online(16) (measured 1.48 MiB), and independent of the number of steps (slow: 1000 vs 4000, and
DirectAdjoint's figure, which grows with the steps).
"""

from __future__ import annotations

import diffrax
import pytest

from retrograde.schedules import Online

from ._diffrax_problems import checkpoint_adjoint, second_order_temp_bytes

MiB = 2**20


# Online(16) is slow: the same loop as the default's Online(88) with fewer slots (a second 10-20 s
# compile); the slow test below compiles it again at 4000 steps.
@pytest.mark.parametrize(
    "schedule",
    [None, pytest.param(Online(16), marks=pytest.mark.slow)],
    ids=["default", "Online16"],
)
def test_second_order_temp_memory_4000_steps(schedule):
    temp = second_order_temp_bytes(checkpoint_adjoint(schedule=schedule), 4000)
    assert temp <= 2 * MiB, f"{temp / MiB:.2f} MiB"


@pytest.mark.slow
def test_second_order_temp_memory_does_not_grow_with_steps():
    small = second_order_temp_bytes(checkpoint_adjoint(schedule=Online(16)), 1000)
    large = second_order_temp_bytes(checkpoint_adjoint(schedule=Online(16)), 4000)
    assert large <= 1.05 * small + 4096, (small, large)
    ref = second_order_temp_bytes(diffrax.DirectAdjoint(), 4000)
    assert ref > 10 * large, (ref, large)
