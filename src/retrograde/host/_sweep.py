"""One sweep of a host-driven loop: :class:`Sweep` executes a schedule's actions on arrays,
each after :class:`Checker` (the simulator, with the driver's error messages) proved it valid;
:class:`Lookahead` lets a sweep see the actions ahead (a restore that is a snapshot's last read
hands the stored arrays over). The module docstring of :mod:`._driver` states the ownership and
memory rules these follow.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from jax import tree_util

from .._store import SnapshotError
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
)
from ..schedules import Store as StoreAction  # the action; Store is the snapshot store
from ._trees import accumulate, is_array_leaf, readonly

if TYPE_CHECKING:
    from ._driver import ForwardPass

__all__ = ["Sweep", "Lookahead", "Checker"]


class Lookahead:
    """An action stream that can be peeked ahead; counts the actions taken from it."""

    def __init__(self, actions: Iterable):
        self._it = iter(actions)
        self._ahead: collections.deque = collections.deque()
        self.taken = 0

    def peek(self, k: int = 0):
        while len(self._ahead) <= k:
            try:
                self._ahead.append(next(self._it))
            except StopIteration:
                return None
        return self._ahead[k]

    def take(self):
        a = self.peek()
        if a is not None:
            self._ahead.popleft()
            self.taken += 1
        return a


class Checker(Simulator):
    """The simulator of a sweep; a restore, reverse or free of a slot that does not hold the
    step is a :class:`SnapshotError` here (a missing snapshot is never replaced)."""

    def not_held(self, action, holds):
        step, slot, level = action
        where = f"slot {slot} of level {level} ({self.levels[level].name or 'unnamed'})"
        data = self.data[level].get(slot)
        if type(action) is Reverse:
            if holds is not None:
                what = f"the snapshot of step {holds}"
            else:
                what = "nothing" if data is None else f"the data of step {data}"
            raise SnapshotError(
                f"the data of step {step} is missing: the schedule reverses step {step} from "
                f"{where}, which holds {what} (a missing snapshot is never replaced by a live "
                "value)."
            )
        if type(action) is Restore and data is not None:
            raise SnapshotError(
                f"snapshot of step {step} is missing: {where} holds the data of step {data}, "
                "not a state (a sweep cannot restart from a step's data)."
            )
        if type(action) is Restore and holds is None:
            raise SnapshotError(
                f"snapshot of step {step} is missing: the schedule restores it from {where}, "
                "which holds no snapshot (a missing snapshot is never replaced by a live value)."
            )
        if type(action) is Restore:
            raise SnapshotError(
                f"snapshot of step {step} is missing: {where} holds the snapshot of step {holds}."
            )
        raise SnapshotError(
            f"snapshot of step {step}: the schedule frees {where}, which holds "
            f"{'nothing' if holds is None else f'step {holds}'}."
        )


class Sweep(Executor):
    """Executes a schedule's actions for one sweep of a :class:`ForwardPass`, each after
    ``check`` (a :class:`Checker`) has executed it: so the actions here are valid.

    Holds the state at hand ``state`` (that of step ``check.current``) and the ``slots``
    ((level, slot) -> snapshot). ``temp`` is ``None`` in the first sweep, whose snapshots
    persist, and in a reverse part the set of snapshots it made (freed when it ends); ``keep``
    tells whether first-sweep snapshots survive the reverse part's ``Free``. A reverse part also
    carries the cotangents: ``lam`` (of the state after the next step to record, leaves, ``None``
    for zero) and ``pbar`` (of the parameters), both in arrays of the driver's own.
    """

    def __init__(
        self,
        fp: ForwardPass,
        slots: dict,
        check: Simulator,
        temp: set | None = None,
        keep: bool = True,
    ):
        self.fp = fp
        self.slots = slots
        self.check = check
        self.temp = temp
        self.keep = keep
        self.state = None
        self.ahead: Lookahead | None = None
        self.lam: list = []
        self.pbar: list = []
        self.loss_bar = 0.0
        self.running: list = []

    # Executor.run returns the executor; this one returns the count of actions run (the first
    # sweep's prefix length). TODO: a name of its own.
    def run(  # type: ignore[override]
        self, actions: Iterable, *, first_sweep: bool = False
    ) -> int:
        """Execute ``actions`` up to ``End`` (in the first sweep: up to the first ``Record``,
        ``Reverse`` or ``End``, which stays unexecuted); returns how many were executed."""
        self.ahead = it = Lookahead(actions)
        try:
            while (a := it.peek()) is not None:
                if first_sweep and type(a) in (Record, Reverse, End):
                    break
                it.take()
                self.execute(a)
                if type(a) is End:
                    break
        finally:
            self.ahead = None  # the stream may refer back to this sweep (an online forward)
        return it.taken

    def execute(self, action) -> None:
        self.check.execute(action)  # raises if the action is not valid here
        super().execute(action)

    # ------------------------------------------------------------------ actions
    def advance(self, a: Advance):
        self.advance_to(a.start, a.stop)

    def advance_to(self, start: int, stop: int):
        for n in range(start, stop):
            self.state = self.fp._plain(n, self.state)

    def store(self, a: StoreAction):
        step, slot, level = a
        store = self.fp._stores[level]
        snap = store.put(step, tree_util.tree_leaves(self.state), self.fp._sspec.treedef)
        self.slots[(level, slot)] = snap
        if self.temp is not None:
            self.temp.add(snap)

    def restore(self, a: Restore):
        _step, slot, level = a
        snap = self.slots[(level, slot)]
        self.state = None  # release the state at hand before reading
        take = self._releases(snap) and _last_read(a, self.ahead)
        self.state = tree_util.tree_unflatten(snap.treedef, snap.store.get(snap, take=take))

    def free(self, a: Free):
        _step, slot, level = a
        snap = self.slots.pop((level, slot))
        if self._releases(snap):
            if self.temp is not None:
                self.temp.discard(snap)
            snap.store.free(snap)
        # else: a first-sweep snapshot, kept for later vjp calls

    def record(self, a: Record):
        """The adjoint of step ``n``:
        ``lam_n = vjp_n(lam_{n+1}) + loss_bar * grad running(u_n)``."""
        fp, n = self.fp, a.step
        state, self.state = self.state, None
        g = None  # the running losses read u_n: their gradient before the adjoint may overwrite it
        if n >= 1 and self.running:
            g, gp = self._running_grad(n, state, self.loss_bar)
            self.pbar = [accumulate(x, y, take=True) for x, y in zip(self.pbar, gp)]
            del gp
        lam, self.lam = fp._sspec.materialize(self.lam), None
        res = fp._step.vjp(n, state, fp._params, lam)
        del state, lam
        fp.counts.recorded += 1
        self._adjoint_done(n, res, g, "vjp")

    def _running_grad(self, n, state, scale: float = 1.0) -> tuple[list, list]:
        """``scale`` times the gradient of the running losses at ``u_n``: leaves (``None`` for
        zero) shaped like the state and the parameters, in new arrays of the driver's own."""
        fp = self.fp
        view = readonly(state)
        g: list = [None] * len(fp._sspec)
        gp: list = [None] * len(fp._pspec)
        for L in self.running:
            s_bar, p_bar = fp._loss_grad(L, n, view)
            g = [accumulate(x, y, scale) for x, y in zip(g, s_bar)]
            gp = [accumulate(x, y, scale) for x, y in zip(gp, p_bar)]
        return g, gp

    def _adjoint_done(self, n, res, g, callback):
        """Check the adjoint's ``res = (state_bar, params_bar)`` of step ``n`` (returned by
        ``callback``), add it to the parameters' cotangent; ``lam_n = state_bar + g``."""
        fp = self.fp
        where = fp._step.where(callback, n)
        s_bar = fp._sspec.check_cotangent(res[0], where, "state_bar")
        p_bar = fp._pspec.check_cotangent(res[1], where, "params_bar")
        del res
        self.pbar = [accumulate(x, y) for x, y in zip(self.pbar, p_bar)]
        del p_bar
        self.lam = s_bar if g is None else [accumulate(x, y) for x, y in zip(g, s_bar)]
        fp._bar.update()

    def linearize(self, a: Linearize):
        """Step ``n`` keeping its data (a copy) in a slot; the gradient of the running losses at
        ``u_n`` is stored with it (``Reverse(n)`` has no ``u_n`` to take it from)."""
        n, slot, level = a
        fp = self.fp
        state, self.state = self.state, None
        g = gp = None
        if n >= 1 and self.running:  # before the step, which may overwrite u_n
            g, gp = self._running_grad(n, state)
        fp.counts.linearized += 1
        out, data = fp._step.linearize(n, state, fp._params)
        del state
        where = fp._step.where("linearize", n)
        flat, treedef = tree_util.tree_flatten_with_path(data)
        del data
        leaves = [x for _, x in flat]
        for path, x in flat:
            if not is_array_leaf(x):
                raise TypeError(
                    f"{where} returned data leaf {tree_util.keystr(path)} of type "
                    f"{type(x).__name__}; the data must be a pytree of arrays (it is copied "
                    "into the schedule's slot, in RAM or on disk)."
                )
        extra = [] if g is None else [x for x in (*g, *gp) if x is not None]
        layout = _DataLayout(
            treedef,
            len(leaves),
            None if g is None else tuple(x is not None for x in g),
            None if gp is None else tuple(x is not None for x in gp),
        )
        # copied before the state goes on: the data may alias u_{n+1}
        snap = fp._data_store(level).put(n, [*leaves, *extra], layout)
        del flat, leaves, extra, g, gp
        self.slots[(level, slot)] = snap
        if self.temp is not None:
            self.temp.add(snap)
        self.state = fp._stepped(n, out, "linearize")

    def reverse(self, a: Reverse):
        """The adjoint of step ``n`` from its data: ``lam_n = vjp_from_n(lam_{n+1}) + loss_bar *
        grad running(u_n)`` (that gradient stored by ``Linearize(n)``)."""
        n, slot, level = a
        fp = self.fp
        snap = self.slots[(level, slot)]
        self.state = None  # no state at hand afterwards
        take = self._releases(snap) and _last_read(a, self.ahead)
        leaves = snap.store.get(snap, take=take)
        layout: _DataLayout = snap.treedef
        data = tree_util.tree_unflatten(layout.treedef, leaves[: layout.n])
        g = None
        if self.running and layout.state is not None:
            rest = iter(leaves[layout.n :])
            g = [
                accumulate(None, next(rest), self.loss_bar, take=True) if k else None
                for k in layout.state
            ]
            gp = [
                accumulate(None, next(rest), self.loss_bar, take=True) if k else None
                for k in layout.params
            ]
            self.pbar = [accumulate(x, y, take=True) for x, y in zip(self.pbar, gp)]
            del rest, gp
        del leaves
        lam, self.lam = fp._sspec.materialize(self.lam), None
        res = fp._step.vjp_from(n, data, fp._params, lam)
        del data, lam
        fp.counts.reversed += 1
        self._adjoint_done(n, res, g, "vjp_from")

    # ------------------------------------------------------------------ helpers
    def _releases(self, snap) -> bool:
        """Whether this sweep's ``Free`` of ``snap`` really releases it."""
        return self.temp is None or snap in self.temp or not self.keep


class _DataLayout(NamedTuple):
    """How a step's data is stored (the structure kept with it): the leaves of the data
    (``treedef``, ``n`` of them), then those of the running losses' gradient at ``u_n`` not
    zero (``state``/``params``: which leaves are stored; ``None``: no gradient stored)."""

    treedef: Any
    n: int
    state: tuple[bool, ...] | None
    params: tuple[bool, ...] | None


def _last_read(a: Restore | Reverse, ahead: Lookahead | None) -> bool:
    """Whether the schedule frees the slot read right away (after recording its step)."""
    if ahead is None:
        return False
    nxt = ahead.peek(0)
    if type(nxt) is Record and nxt.step == a.step:
        nxt = ahead.peek(1)
    return type(nxt) is Free and tuple(nxt) == tuple(a)
