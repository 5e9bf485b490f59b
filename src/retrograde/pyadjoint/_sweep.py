"""One sweep on the tape: :class:`Sweep` executes a schedule's actions on the taped blocks
(recomputing them, storing and restoring block variables' checkpoints, running their adjoints),
each already proven valid by the simulator (the manager's plan). The module docstring of
:mod:`._manager` states what a snapshot holds and when it is released.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from pyadjoint.block_variable import BlockVariable

from ..schedules import (
    Advance,
    End,
    Executor,
    Free,
    Linearize,
    Record,
    Restore,
    Reverse,
    Simulator,
    Store,
)
from ._guard import RUNNING, MissingValueError, describe
from ._slots import Snapshot, materialise

if TYPE_CHECKING:
    from ._manager import CheckpointManager

__all__ = ["Sweep"]


class Sweep(Executor):
    """Executes the actions of one sweep on the tape: each after the simulator ``check``
    (:meth:`run_checked`), or a plan the simulator proved valid (:meth:`replay`).

    ``at``: the step whose state is at hand (in the block variables' checkpoints), ``None``
    after a ``Record``. ``slots``: (level, slot) -> :class:`Snapshot`. ``temp``: ``None`` in a
    first sweep (its snapshots persist), else the set of snapshots this reverse part made (all
    released when it ends, also on an exception).
    """

    def __init__(
        self,
        m: CheckpointManager,
        slots: dict,
        check: Simulator,
        temp: set | None,
        tangent: bool,
        markings: bool,
        hessian: bool = False,
    ):
        self.m = m
        self.g = m.graph
        self.slots = slots
        self.check = check
        self.temp = temp
        self.tangent = tangent
        self.hessian = hessian
        self.markings = markings
        self.at: int | None = None
        self.hold_all = m.hold_all
        # which outputs a block's adjoint reads, watched in first-order sweeps of mixed schedules
        self.watch = m.adjoint_reads if (m.mixed and not tangent) else None
        self.protect = set(self.g.results) | m._controls  # never cleared
        if m.functional is not None:
            self.protect.add(m.functional)
        controls = m._controls
        self.blocks = (
            self.g.steps
            if not controls
            else [
                [b for b in blocks if not any(bv in controls for bv in b.get_outputs())]
                for blocks in self.g.steps
            ]
        )

    def run_checked(self, actions: Iterable) -> None:
        """Execute ``actions`` up to ``End``, each after the simulator ``check``."""
        check, checks, mine = self.check, self.check._kinds, self._kinds
        for a in actions:
            kind = type(a)
            if kind not in mine or check.ended:
                check.execute(a)  # raises the simulator's error
            checks[kind](check, a)
            mine[kind](self, a)
            if kind is End:
                check.ended = self.ended = True
                break

    def replay(self, actions: Iterable) -> None:
        """Execute ``actions`` that the simulator already proved valid (the manager's plan)."""
        mine = self._kinds
        for a in actions:
            mine[type(a)](self, a)

    # ------------------------------------------------------------------ the state at hand
    def hold(self, n: int) -> dict:
        """References to the values (and tangents) of ``u_n``, at hand."""
        tangent = self.tangent
        return {
            bv: (self._value(n, bv), bv.tlm_value if tangent else None) for bv in self.g.live[n]
        }

    def load(self, n: int, values: dict) -> None:
        """Make ``u_n`` (``values``: block variable -> (value, tangent)) the state at hand."""
        for bv in self.g.live[n]:
            try:
                value, tangent = values[bv]
            except KeyError:
                raise MissingValueError(f"step {n}: the snapshot lacks {describe(bv)}.") from None
            bv._checkpoint = value
            if self.tangent:
                bv.tlm_value = tangent
        self.at = n

    def _clear(self, bvs) -> None:
        """Drop the values (and tangents) of ``bvs``, unless protected."""
        protect = self.protect
        for bv in bvs:
            if bv not in protect:
                bv._checkpoint = None
                bv.tlm_value = None

    def _step(self, n: int) -> None:
        """Evaluate step ``n``'s blocks (with tangents in a tangent sweep)."""
        RUNNING.step = n
        if self.tangent:
            markings = self.markings
            for block in self.blocks[n]:
                for bv in block._outputs:
                    if not self.hold_all:  # a block never writes into an object a snapshot holds
                        bv._checkpoint = None
                    bv.tlm_value = None
                block.recompute()
                block.evaluate_tlm(markings=markings)
        elif self.hold_all:
            for block in self.blocks[n]:
                block.recompute()
        else:
            for block in self.blocks[n]:
                for bv in block._outputs:
                    bv._checkpoint = None
                block.recompute()

    def advance_to(self, start: int, stop: int) -> None:
        if self.hold_all or self.tangent:
            dead = () if self.hold_all else self.g.dead
            for n in range(start, stop):
                self._step(n)
                if dead:
                    self._clear(dead[n])
        else:  # the common case, inlined: recompute into fresh outputs, drop what died
            steps, dead, protect = self.blocks, self.g.dead, self.protect
            for n in range(start, stop):
                RUNNING.step = n
                for block in steps[n]:
                    for bv in block._outputs:
                        bv._checkpoint = None
                    block.recompute()
                for bv in dead[n]:
                    if bv not in protect:
                        bv._checkpoint = None
        self.m.counts.steps += stop - start
        self.at = stop

    # ------------------------------------------------------------------ actions
    def advance(self, a: Advance) -> None:
        self.advance_to(a.start, a.stop)

    def store(self, a: Store) -> None:
        step, slot, level = a
        store = self.m.stores[level]
        snap = Snapshot(step, level, store)
        if not self.hold_all:  # (with StoreAll every value stays where it is)
            held = self.hold(step)
            snap.entries = {bv: store.put(step, bv, v, t) for bv, (v, t) in held.items()}
        self.m.counts.writes[level] += 1
        self.slots[(level, slot)] = snap
        if self.temp is not None:
            self.temp.add(snap)

    def restore(self, a: Restore) -> None:
        step, slot, level = a
        snap = self.slots[(level, slot)]
        self.m.counts.reads[level] += 1
        if self.hold_all and not snap.entries:  # stored by this sweep or its first sweep
            self.at = step
            return
        if self.at is not None and not self.hold_all:
            self._clear(self.g.live[self.at])
        store = snap.store
        self.load(step, {bv: store.get(bv, entry) for bv, entry in snap.entries.items()})

    def free(self, a: Free) -> None:
        snap = self.slots.pop((a.level, a.slot))
        if self.temp is not None:
            self.temp.discard(snap)
        snap.release()

    def _value(self, n: int, bv: BlockVariable):
        """``bv``'s value at hand, self-contained (a delegated checkpoint copied out)."""
        value = bv._checkpoint
        if value is None:
            raise MissingValueError(f"step {n}: the state at hand lacks {describe(bv)}.")
        if type(value) is not type(bv.output):  # the common case cannot delegate
            value = materialise(bv, value)
        return value

    def _data(self, n: int) -> list:
        """What the adjoints of step ``n``'s blocks read, just evaluated: every dependency made on
        the tape, and the outputs each block's adjoint was seen to read (all of them before its
        adjoint ran, and in a tangent sweep); controls excepted, as ``(variable, value)``."""
        g, controls = self.g, self.m._controls
        created = g.created
        reads = None if self.tangent else self.m.adjoint_reads
        out: dict = {}
        for block in g.steps[n]:
            for bv in block.get_dependencies():
                if bv in created and bv not in controls and bv not in out:
                    out[bv] = self._value(n, bv)
            known = None if reads is None else reads.get(block)
            for bv in block.get_outputs():
                if bv in controls or bv in out or bv._checkpoint is None:
                    continue  # (an output a block did not recompute is not read either)
                if known is None or bv in known:
                    out[bv] = self._value(n, bv)
        return list(out.items())

    def linearize(self, a: Linearize) -> None:
        """Step ``n`` evaluated from ``u_n``, its data kept in a slot (with tangents in a tangent
        sweep); ``u_{n+1}`` is at hand afterwards."""
        n, slot, level = a
        if self.at != n:
            raise MissingValueError(f"step {n} is linearized without its state at hand.")
        m = self.m
        self._step(n)
        store = m.stores[level]
        snap = Snapshot(n, level, store, data=True)
        tangent = self.tangent
        snap.entries = {
            bv: store.put(n, bv, value, bv.tlm_value if tangent else None)
            for bv, value in self._data(n)
        }
        m.counts.linearized += 1
        m.counts.data_writes[level] += 1
        self.slots[(level, slot)] = snap
        if self.temp is not None:
            self.temp.add(snap)
        if not self.hold_all:
            self._clear(self.g.dead[n])
        self.at = n + 1

    def reverse(self, a: Reverse) -> None:
        """Step ``n``'s adjoint (and second-order adjoint) from its data: no recomputation."""
        n, slot, level = a
        g, m = self.g, self.m
        snap = self.slots[(level, slot)]
        m.counts.data_reads[level] += 1
        if self.at is not None and self.at < g.n_steps and not self.hold_all:
            self._clear(g.live[self.at])  # (nothing but the protected results is made for u_N)
        store, controls, tangent = snap.store, m._controls, self.tangent
        loaded = []
        for bv, entry in snap.entries.items():
            if bv in controls:
                continue
            value, t = store.get(bv, entry)
            bv._checkpoint = value
            if tangent:
                bv.tlm_value = t
            loaded.append(bv)
        self._adjoint(n)
        m.counts.reversed += 1
        self._clear(loaded)
        self._reset_outputs(n)
        self.at = None

    def _adjoint(self, n: int) -> None:
        """The adjoints (and in a Hessian sweep the second-order adjoints) of step ``n``'s blocks,
        last first; in a first-order sweep of a mixed schedule, the outputs a block's adjoint reads
        are noted the first time it runs (pyadjoint's conditions: an adjoint input, and with
        ``markings`` a dependency the controls affect)."""
        RUNNING.step = n
        markings = self.markings
        blocks = reversed(self.g.steps[n])
        if self.hessian:
            for block in blocks:
                block.evaluate_adj(markings=markings)
                block.evaluate_hessian(markings=markings)
            return
        watch = self.watch
        for block in blocks:
            if watch is None or block in watch:
                block.evaluate_adj(markings=markings)
                continue
            outputs = block.get_outputs()
            runs = any(bv.adj_value is not None for bv in outputs) and (
                not markings or any(bv.is_control_dependent for bv in block.get_dependencies())
            )
            seen: set = set()
            RUNNING.reads = seen
            try:
                block.evaluate_adj(markings=markings)
            finally:
                RUNNING.reads = None
            if runs:
                watch[block] = frozenset(bv for bv in outputs if bv in seen)

    def _reset_outputs(self, n: int) -> None:
        """Step ``n`` is reversed: drop its outputs' adjoints, values and tangents (controls'
        adjoints and protected values stay)."""
        controls, protect = self.m._controls, self.protect
        for bv in self.g.outs[n]:
            if bv not in controls:
                bv.adj_value = None
                bv.hessian_value = None
            if bv not in protect:
                bv._checkpoint = None
                bv.tlm_value = None

    def record(self, a: Record) -> None:
        """Step ``n``'s adjoint (and second-order adjoint): its blocks recomputed from ``u_n``,
        unless every value the step makes is still held (``StoreAll``), then reversed."""
        n = a.step
        g = self.g
        if self.at != n:
            raise MissingValueError(f"step {n} is recorded without its state at hand.")
        outs = g.outs[n]
        rerun = not self.hold_all
        if not rerun:
            for bv in outs:
                if bv._checkpoint is None:
                    rerun = True
                    break
        if rerun:
            self._step(n)
            self.m.counts.rerun += 1
        self._adjoint(n)
        self.m.counts.recorded += 1
        if not self.hold_all:
            self._clear(g.live[n])
        self._reset_outputs(n)
        self.at = None
