"""retrograde for diffrax: :class:`CheckpointAdjoint`, a drop-in ``adjoint=`` for
``diffrax.diffeqsolve`` whose step loop is ``retrograde.while_loop``: reverse-differentiable in
memory bounded by a schedule, and differentiable in every mode (``jax.jvp``, ``vmap``,
``jax.hessian``, gradients of gradients)."""

from ._adjoint import CheckpointAdjoint

__all__ = ["CheckpointAdjoint"]
