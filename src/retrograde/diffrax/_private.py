"""The private names of equinox and diffrax that ``retrograde.diffrax`` relies on, in one place.

- ``Buffer``: equinox's ``equinox.internal._loop.common._Buffer``, the buffer type diffrax's step
  dispatches on (``eqxi.buffer_at_set``), which retrograde's buffers subclass.
- ``_MetaBufferItem.__instancecheck__`` (equinox), the runtime check of diffrax's
  ``eqxi.MaybeBuffer[...]`` annotations: replaced on import by one that also unwraps subclasses.
- :func:`with_replaced`: diffrax's step function with another solver, found among the values
  that diffrax's ``loop`` closes over.

Tested with the version ranges pinned in ``pyproject.toml``; a missing name raises ImportError
naming the installed version (``tests/diffrax/test_private.py`` checks them).
"""

from __future__ import annotations

import types

import equinox as eqx

__all__ = ["Buffer", "with_replaced"]


def _missing(what: str, e: Exception) -> ImportError:
    return ImportError(
        f"retrograde.diffrax needs equinox's private {what}, which equinox {eqx.__version__} "
        "does not have; retrograde is tested with the equinox range pinned in its "
        "pyproject.toml."
    )


try:
    from equinox.internal._loop import common as _common

    Buffer = _common._Buffer
    # equinox defines it only when not TYPE_CHECKING
    _MetaBufferItem = _common._MetaBufferItem  # type: ignore[attr-defined]
except (ImportError, AttributeError) as e:  # pragma: no cover (depends on the installed equinox)
    raise _missing(
        "classes equinox.internal._loop.common._Buffer (the buffer type diffrax dispatches on) "
        "and _MetaBufferItem (its runtime type check)",
        e,
    ) from e


def _buffer_item_instancecheck(cls, instance):
    """``isinstance(x, eqxi.MaybeBuffer[T])``: ``x`` unwrapped from every buffer around it
    (``_Buffer`` *or a subclass*: equinox's own check unwraps only ``_Buffer`` itself), then
    checked against ``T``."""
    while isinstance(instance, Buffer):
        instance = instance._array
    return isinstance(instance, cls.annotation)


# Diffrax annotates its save buffers ``eqxi.MaybeBuffer[Real[Array, "times"]]``; under runtime
# type checking (jaxtyping's import hook) equinox's check would reject retrograde's buffers,
# which subclass ``_Buffer``. The same check for every object equinox itself makes.
_MetaBufferItem.__instancecheck__ = _buffer_item_instancecheck


def with_replaced(fun, old, new):
    """``fun`` with ``new`` in place of ``old`` wherever ``fun``, or a function it closes over
    (recursively), closes over ``old`` itself; None if nowhere.

    Diffrax builds its step (``body_fun``) inside ``diffrax._integrate.loop`` as a closure over
    the solver; this rebuilds that closure around another solver (the same solver with another
    ``scan_kind``), sharing every other closed-over value (so ``retrograde.while_loop`` sees the
    same traced constants in both). Only function objects are rebuilt; a step reaching the solver
    another way keeps ``old`` there, which computes the same values.
    """
    out, changed = _rebuild(fun, old, new, {})
    return out if changed else None


def _rebuild(fun, old, new, done: dict):
    if not isinstance(fun, types.FunctionType) or not fun.__closure__:
        return fun, False
    if id(fun) in done:
        return done[id(fun)]
    done[id(fun)] = (fun, False)  # a closure cycle (recursion) keeps the original
    cells, changed = [], False
    for cell in fun.__closure__:
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell (a variable not yet assigned)
            cells.append(cell)
            continue
        if value is old:
            cells.append(types.CellType(new))
            changed = True
            continue
        inner, inner_changed = _rebuild(value, old, new, done)
        cells.append(types.CellType(inner) if inner_changed else cell)
        changed = changed or inner_changed
    if not changed:
        return fun, False
    out = types.FunctionType(
        fun.__code__, fun.__globals__, fun.__name__, fun.__defaults__, tuple(cells)
    )
    out.__kwdefaults__ = fun.__kwdefaults__
    out.__dict__.update(fun.__dict__)
    out.__qualname__ = fun.__qualname__
    done[id(fun)] = (out, True)
    return out, True
