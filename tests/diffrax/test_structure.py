"""What the lowered first-order gradient of a CheckpointAdjoint solve holds (issue #33): exact
counts of the saved values' evaluations in XLA's optimized program, no wall clock.

The save function ``SaveAt(ts=..., fn=cbrt)`` puts one ``cbrt`` per evaluation of the saved
values into the program. The step that the forward pass, recomputation and first-order VJPs
execute (``first_order_body_fun``) runs its save loop once per save, its VJP a ``custom_vjp``
(``bounded_while_loop(first_order=True)``), so the optimized program holds three: the forward
sweep, and the recorded step's VJP (its forward loop and its reverse loop); recomputations never
write the buffers, and XLA removes what they would save. With the save loop of six row-count
tiers (a ``switch`` of six vectorised copies) it held 18. ``RecursiveCheckpointAdjoint``
holds two.
"""

from __future__ import annotations

import re

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from retrograde.diffrax import CheckpointAdjoint

TS = jnp.linspace(0.0, 1.0, 50)  # 50 save times: every tier of 2, 4, ..., 32, 50 rows


def _loss(adjoint):
    def loss(k, y0):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, a: -a * y + jnp.sin(t)),
            diffrax.Tsit5(),
            0.0,
            1.0,
            0.05,
            y0,
            args=k,
            saveat=diffrax.SaveAt(ts=TS, fn=lambda t, y, a: jnp.cbrt(y)),
            stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8),
            adjoint=adjoint,
            max_steps=64,
        )
        return jnp.sum(sol.ys**2)

    return loss


def test_first_order_gradient_evaluates_saved_values_in_three_places():
    k, y0 = jnp.float64(0.7), jnp.asarray([1.0, 2.0])
    grad = jax.jit(jax.grad(_loss(CheckpointAdjoint()), (0, 1)))
    optimized = grad.lower(k, y0).compile().as_text()
    assert len(re.findall(r"[ )]cbrt\(", optimized)) == 3
    got = grad(k, y0)
    want = jax.jit(jax.grad(_loss(diffrax.DirectAdjoint()), (0, 1)))(k, y0)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-14)
