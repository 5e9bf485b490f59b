"""A NumPy-backed pyadjoint type that behaves like a Firedrake ``Function``.

Firedrake cannot be installed everywhere (it needs its own PETSc build), so retrograde's tests,
``examples/pyadjoint_heat.py`` and ``benchmarks/pyadjoint_manager.py`` use :class:`Vec`, which
mimics the semantics of Firedrake's adjoint (read from ``firedrake/adjoint_utils``) that a
checkpoint manager meets:

- **In-place assignment.** ``u.assign(...)`` and :func:`evolve` overwrite ``u``'s array and give
  ``u`` a new block variable; the old block variable's ``output`` is the same, overwritten,
  object (so pyadjoint's fallback to the live ``output`` reads a wrong value).
- **Delegated checkpoints.** ``u.assign(v)`` leaves ``u``'s checkpoint as a
  :class:`DelegatedCheckpoint` of ``v``'s block variable (Firedrake's
  ``DelegatedFunctionCheckpoint``): restoring it reads ``v``'s value, sharing its array; its
  recompute returns the delegated checkpoint unchanged.
- **In-place recompute.** A :func:`evolve` block recomputes into its output's checkpoint when
  that checkpoint is a ``Vec`` (Firedrake's ``SolveBlock.recompute_component``), and its
  adjoint may read its output (a nonlinear solve linearises at its solution).
- **Package data.** :class:`DiskPackage` is tape package data (Firedrake's ``DiskCheckpointer``):
  while it is continued, ``Vec._ad_create_checkpoint`` writes a :class:`FileCheckpoint` to its
  directory instead of copying; it is paused otherwise.

:func:`evolve` is a pointwise update ``out = f(x_1, ..., x_k)`` given with its first and second
derivatives, enough for adjoints, tangents and Hessians.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence

import numpy as np
from pyadjoint import AdjFloat, Block, OverloadedType, annotate_tape, get_working_tape
from pyadjoint.tape import TapePackageData, stop_annotating

__all__ = [
    "Vec",
    "evolve",
    "inner",
    "matvec",
    "react",
    "DiskPackage",
    "DelegatedCheckpoint",
    "FileCheckpoint",
    "RECOMPUTES",
]

#: Block recomputations by block class name (tests count them).
RECOMPUTES: dict[str, int] = {}

_disk: list[DiskPackage] = []  # the package whose disk checkpointing is continued, if any


class DelegatedCheckpoint:
    """A checkpoint that delegates to another block variable (``other``)."""

    def __init__(self, other):
        self.other = other

    def restore(self) -> Vec:
        saved = self.other.saved_output
        return Vec(saved.data, share=True)


class FileCheckpoint:
    """A checkpoint written to a file of a :class:`DiskPackage`."""

    def __init__(self, vec: Vec, package: DiskPackage):
        package.files += 1
        self.path = os.path.join(package.directory, f"cp{package.files}.npy")
        np.save(self.path, vec.data)

    def restore(self) -> Vec:
        return Vec(np.load(self.path))


class Vec(OverloadedType):
    """A mutable vector of float64, overloaded for pyadjoint (like a Firedrake ``Function``)."""

    def __init__(self, data, share: bool = False):
        super().__init__()
        self.data = data if share else np.array(data, dtype=np.float64)

    # --- values
    def __repr__(self):
        return f"Vec({self.data!r})"

    def assign(self, other: Vec, annotate: bool = True) -> Vec:
        """``self <- other`` in place; leaves a delegated checkpoint, as Firedrake does."""
        annotate = annotate and annotate_tape() and other is not self
        if annotate:
            block = AssignBlock(self, other)
            get_working_tape().add_block(block)
        self.data[...] = other.data
        if annotate:
            bv = self.create_block_variable()
            block.add_output(bv)
            bv._checkpoint = DelegatedCheckpoint(other.block_variable)
        return self

    # --- pyadjoint's interface
    @classmethod
    def _ad_init_object(cls, obj):
        return cls(obj.data if isinstance(obj, Vec) else obj)

    def _ad_init_zero(self, dual=False):
        return Vec(np.zeros_like(self.data))

    def _ad_convert_riesz(self, value, riesz_map=None):
        return Vec(value.data)

    def _ad_create_checkpoint(self):
        if _disk:
            return FileCheckpoint(self, _disk[-1])
        return Vec(self.data)

    def _ad_restore_at_checkpoint(self, checkpoint):
        if isinstance(checkpoint, (DelegatedCheckpoint, FileCheckpoint)):
            return checkpoint.restore()
        return checkpoint

    def _ad_mul(self, other):
        return Vec(self.data * other)

    def _ad_add(self, other):
        return Vec(self.data + other.data)

    def _ad_dot(self, other, options=None):
        return float(np.dot(self.data, other.data))

    def _ad_imul(self, other):
        self.data *= other
        return self

    def _ad_iadd(self, other):
        self.data += other.data
        return self

    def __iadd__(self, other):
        self.data += other.data
        return self

    @staticmethod
    def _ad_assign_numpy(dst, src, offset):
        n = dst.data.size
        dst.data[...] = np.asarray(src[offset : offset + n]).reshape(dst.data.shape)
        return dst, offset + n

    @staticmethod
    def _ad_to_list(m):
        return m.data.ravel().tolist()

    def _ad_copy(self):
        return Vec(self.data)

    def _ad_dim(self):
        return self.data.size


def _value(x):
    return x.data if isinstance(x, Vec) else float(x)


def _dual(dep, total):
    """A contribution ``total`` (an array) to the adjoint of ``dep``: summed for a scalar."""
    return Vec(total) if isinstance(dep.output, Vec) else float(np.sum(total))


def _tangent_array(t):
    return 0.0 if t is None else _value(t)


class EvolveBlock(Block):
    """``out = f(x_1, ..., x_k)`` pointwise, with ``df`` (the k partials) and ``d2f`` (k x k)."""

    def __init__(self, f, df, d2f, deps, uses_output: bool):
        super().__init__()
        self.f, self.df, self.d2f, self.uses_output = f, df, d2f, uses_output
        for d in deps:
            self.add_dependency(d)

    def _partials(self, xs):
        if self.uses_output:  # a solve's adjoint linearises at its solution
            return self.df(*xs, out=self.get_outputs()[0].saved_output.data)
        return self.df(*xs)

    def recompute_component(self, inputs, block_variable, idx, prepared):
        RECOMPUTES[type(self).__name__] = RECOMPUTES.get(type(self).__name__, 0) + 1
        value = self.f(*[_value(x) for x in inputs])
        if isinstance(block_variable.checkpoint, Vec):  # in place, as Firedrake's SolveBlock
            block_variable.checkpoint.data[...] = value
            return block_variable.checkpoint
        return Vec(value)

    def evaluate_adj_component(self, inputs, adj_inputs, block_variable, idx, prepared=None):
        parts = self._partials([_value(x) for x in inputs])
        return _dual(block_variable, adj_inputs[0].data * parts[idx])

    def evaluate_tlm_component(self, inputs, tlm_inputs, block_variable, idx, prepared=None):
        parts = self._partials([_value(x) for x in inputs])
        total = 0.0
        for p, t in zip(parts, tlm_inputs):
            total = total + p * _tangent_array(t)
        return Vec(np.broadcast_to(total, block_variable.output.data.shape))

    def evaluate_hessian_component(
        self,
        inputs,
        hessian_inputs,
        adj_inputs,
        block_variable,
        idx,
        relevant_dependencies,
        prepared=None,
    ):
        xs = [_value(x) for x in inputs]
        parts = self._partials(xs)
        second = self.d2f(*xs)
        tlms = [_tangent_array(d.tlm_value) for d in self.get_dependencies()]
        total = hessian_inputs[0].data * parts[idx]
        for j, t in enumerate(tlms):
            total = total + adj_inputs[0].data * second[idx][j] * t
        return _dual(block_variable, total)


class AssignBlock(Block):
    """``out <- other`` (Firedrake's ``FunctionAssignBlock``)."""

    def __init__(self, out: Vec, other: Vec):
        super().__init__()
        self.add_dependency(other)

    def recompute_component(self, inputs, block_variable, idx, prepared):
        RECOMPUTES["AssignBlock"] = RECOMPUTES.get("AssignBlock", 0) + 1
        if isinstance(block_variable.checkpoint, DelegatedCheckpoint):
            return block_variable.checkpoint
        return Vec(inputs[0].data)

    def evaluate_adj_component(self, inputs, adj_inputs, block_variable, idx, prepared=None):
        return Vec(adj_inputs[0].data)

    def evaluate_tlm_component(self, inputs, tlm_inputs, block_variable, idx, prepared=None):
        return None if tlm_inputs[0] is None else Vec(tlm_inputs[0].data)

    def evaluate_hessian_component(
        self,
        inputs,
        hessian_inputs,
        adj_inputs,
        block_variable,
        idx,
        relevant_dependencies,
        prepared=None,
    ):
        return Vec(hessian_inputs[0].data)


class InnerBlock(Block):
    """``J = sum(w * u * v)`` (an ``AdjFloat``), ``w`` a fixed weight."""

    def __init__(self, u: Vec, v: Vec, weight: float):
        super().__init__()
        self.weight = weight
        self.add_dependency(u)
        self.add_dependency(v)

    def recompute_component(self, inputs, block_variable, idx, prepared):
        RECOMPUTES["InnerBlock"] = RECOMPUTES.get("InnerBlock", 0) + 1
        return AdjFloat(self.weight * float(np.dot(inputs[0].data, inputs[1].data)))

    def evaluate_adj_component(self, inputs, adj_inputs, block_variable, idx, prepared=None):
        return Vec(self.weight * float(adj_inputs[0]) * inputs[1 - idx].data)

    def evaluate_tlm_component(self, inputs, tlm_inputs, block_variable, idx, prepared=None):
        total = 0.0
        for k in range(2):
            if tlm_inputs[k] is not None:
                total += self.weight * float(np.dot(tlm_inputs[k].data, inputs[1 - k].data))
        return AdjFloat(total)

    def evaluate_hessian_component(
        self,
        inputs,
        hessian_inputs,
        adj_inputs,
        block_variable,
        idx,
        relevant_dependencies,
        prepared=None,
    ):
        other = self.get_dependencies()[1 - idx]
        h = self.weight * float(hessian_inputs[0]) * inputs[1 - idx].data
        if other.tlm_value is not None:
            h = h + self.weight * float(adj_inputs[0]) * other.tlm_value.data
        return Vec(h)


def evolve(
    out: Vec, f: Callable, df: Callable, d2f: Callable, deps: Sequence, uses_output: bool = False
) -> Vec:
    """``out <- f(*deps)`` in place, taped as one block (``deps`` may include ``out``).

    ``f(*xs)`` returns the new array; ``df(*xs)`` its partials (one per dep, arrays or scalars;
    with ``uses_output=True`` also given ``out=`` the result, as a solve's adjoint is); ``d2f(*xs)``
    the k x k second partials. Scalars (``AdjFloat``) broadcast.
    """
    annotate = annotate_tape()
    if annotate:
        block = EvolveBlock(f, df, d2f, deps, uses_output)
        get_working_tape().add_block(block)
    with stop_annotating():
        out.data[...] = f(*[_value(x) for x in deps])
    if annotate:
        block.add_output(out.create_block_variable())
    return out


def react(u: Vec, v: Vec, p) -> Vec:
    """``u <- u + 0.05 v + 0.1 p u^2`` in place, taped (``v`` a diffusion term, ``p`` a rate):
    the nonlinear step of the tests' and benchmarks' loops."""
    return evolve(
        u,
        lambda u, v, p: u + 0.05 * v + 0.1 * p * u * u,
        lambda u, v, p: [1 + 0.2 * p * u, 0.05, 0.1 * u * u],
        lambda u, v, p: [[0.2 * p, 0, 0.2 * u], [0, 0, 0], [0.2 * u, 0, 0]],
        [u, v, p],
    )


def inner(u: Vec, v: Vec, weight: float = 1.0) -> AdjFloat:
    """``weight * sum(u * v)``, taped."""
    value = AdjFloat(weight * float(np.dot(u.data, v.data)))
    if annotate_tape():
        block = InnerBlock(u, v, weight)
        get_working_tape().add_block(block)
        block.add_output(value.create_block_variable())
    return value


class DiskPackage(TapePackageData):
    """Tape package data with disk checkpointing (Firedrake's ``DiskCheckpointer``): while
    continued, checkpoints of a :class:`Vec` are files in ``directory``."""

    def __init__(self, directory: str | None = None):
        self.directory = directory or tempfile.mkdtemp(prefix="vec-disk-")
        self.files = 0
        self.calls: list[str] = []

    def clear(self):
        self.calls.append("clear")

    def reset(self):
        self.calls.append("reset")

    def checkpoint(self):
        return None

    def restore_from_checkpoint(self, state):
        pass

    def copy(self):
        return self

    def continue_checkpointing(self):
        self.calls.append("continue")
        if self not in _disk:
            _disk.append(self)

    def pause_checkpointing(self):
        self.calls.append("pause")
        if self in _disk:
            _disk.remove(self)


class MatVecBlock(Block):
    """``out = A @ x`` (``A`` a fixed matrix)."""

    def __init__(self, A, x: Vec):
        super().__init__()
        self.A = A
        self.add_dependency(x)

    def recompute_component(self, inputs, block_variable, idx, prepared):
        RECOMPUTES["MatVecBlock"] = RECOMPUTES.get("MatVecBlock", 0) + 1
        return Vec(self.A @ inputs[0].data)

    def evaluate_adj_component(self, inputs, adj_inputs, block_variable, idx, prepared=None):
        return Vec(self.A.T @ adj_inputs[0].data)

    def evaluate_tlm_component(self, inputs, tlm_inputs, block_variable, idx, prepared=None):
        return None if tlm_inputs[0] is None else Vec(self.A @ tlm_inputs[0].data)

    def evaluate_hessian_component(
        self,
        inputs,
        hessian_inputs,
        adj_inputs,
        block_variable,
        idx,
        relevant_dependencies,
        prepared=None,
    ):
        return Vec(self.A.T @ hessian_inputs[0].data)


def matvec(out: Vec, A, x: Vec) -> Vec:
    """``out <- A @ x`` in place, taped (``x`` may be ``out``)."""
    annotate = annotate_tape()
    if annotate:
        block = MatVecBlock(A, x)
        get_working_tape().add_block(block)
    out.data[...] = A @ x.data
    if annotate:
        block.add_output(out.create_block_variable())
    return out
