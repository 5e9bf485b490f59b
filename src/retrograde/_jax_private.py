"""The one home of every JAX internal retrograde uses (``jax._src``).

``jax.extend`` publishes ``Primitive`` and a few core types, but the rules a primitive registers
(JVP, transpose, partial evaluation, DCE, batching, lowering) and the loop machinery they use live
under ``jax._src``, which changes between JAX's minor versions. Importing them here alone keeps
the surface in one place: ``pyproject.toml`` caps ``jax`` at the minor versions tested, and an
upgrade is checked against this list. Each name is re-exported as JAX spells it.

- ``core``: abstract values, jaxprs, ``Var``/``Literal``, effects on jaxprs, ``typeof``.
- ``dispatch``: ``apply_primitive`` for the primitives' eager implementations.
- ``effects``: the ordered-effect registries, ``ordered_effects`` and ``shardable_ordered_effects``
  (the host callbacks of offloaded snapshots, allowed in programs over several devices).
- ``config``: reading ``jax_enable_x64`` and the promotion settings as JAX does.
- ``callback``: ``io_callback``'s primitive, for ordered host callbacks inside compiled loops.
- ``ad``, ``batching``, ``mlir``, ``pe``: the rule registries and helpers of the interpreters.
- ``convert_element_type``: the primitive-level dtype conversion that keeps weak types.
"""

from jax._src import callback, config, core, dispatch, effects
from jax._src.interpreters import ad, batching, mlir
from jax._src.interpreters import partial_eval as pe
from jax._src.lax.lax import _convert_element_type as convert_element_type

__all__ = [
    "ad",
    "batching",
    "callback",
    "config",
    "convert_element_type",
    "core",
    "dispatch",
    "effects",
    "mlir",
    "pe",
]
