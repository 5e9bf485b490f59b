"""retrograde for diffrax: :class:`CheckpointAdjoint`, a drop-in ``adjoint=`` for
``diffrax.diffeqsolve`` whose step loop is ``retrograde.while_loop``: reverse-differentiable in
memory bounded by a schedule, and differentiable in every mode (``jax.jvp``, ``vmap``,
``jax.hessian``, gradients of gradients).

Needs the ``diffrax`` extra: ``pip install 'retrograde[diffrax]'`` (diffrax and equinox, in the
versions tested)."""

try:
    import diffrax as _diffrax  # noqa: F401
    import equinox as _equinox  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"retrograde.diffrax needs diffrax and equinox ({e.name or e} is not installed): "
        "install the extra with pip install 'retrograde[diffrax]'."
    ) from e

from ._adjoint import CheckpointAdjoint

__all__ = ["CheckpointAdjoint"]
