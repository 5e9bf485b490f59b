"""Executing a schedule's actions on a host-driven loop.

:class:`ForwardPass` runs the *first sweep* of a schedule (every action before the first
``Record``; for an online schedule every ``on_step``), keeps the snapshots that sweep laid, and
then, on every :meth:`ForwardPass.vjp`, executes the *reverse part* of the schedule from the state
the first sweep ended on. Snapshots made by a reverse part are freed when that ``vjp`` returns;
the first sweep's snapshots stay until :meth:`ForwardPass.close`.

A :class:`._sweep.Sweep` executes the actions of one sweep: it holds the state at hand and the
slots, and has one method per action kind (a :class:`~retrograde.schedules.Executor`). Every action
is first executed by the simulator (``Simulator.for_schedule``: the schedule's levels, and for a
mixed schedule its data size and weighted memory budget), so that the driver runs only actions
proven valid: the state it needs is at hand or in the slot it names, and the slots held stay within
the schedule's budget.

Mixed schedules: ``Linearize(n, slot, level)`` evaluates step ``n`` with the step's
``linearize`` (for a JAX step, ``jax.vjp``: the data are the residuals its function holds) and
stores a copy of the returned data in ``slot``, in a second store of that level (the level's
state store and data store are opened from the same storage specification, so that each counts
its own bytes and shares unchanged leaves with its own kind); ``Reverse(n, slot, level)`` hands
that data to ``vjp_from``. With running losses, ``Linearize(n)`` also stores their gradient at
``u_n`` (shaped like the state and the parameters), since ``Reverse(n)`` has no state to take it
from.

Arrays (see :mod:`._trees` for the ownership rules): the driver copies a state when it stores a
snapshot, and when it restores one that is read again later; a restore that is the snapshot's last
read (the schedule frees it right after recording that step) hands the stored arrays over instead.
Step data are handled alike. Cotangents are accumulated in place in arrays the driver allocated.
Memory of a reverse sweep beyond its snapshots: the state at hand, the cotangent, the parameters'
cotangent, and what the step's adjoint allocates.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, cast

import jax
import numpy as np

from .._store import MemoryStore, Snapshot, Store
from ..schedules import (
    OfflineSchedule,
    OnlineSchedule,
    Schedule,
    ScheduleError,
    check_steps,
)
from ._step import LossImpl, PyTree, StepImpl
from ._storage import StorageSpec, resolve_storage
from ._sweep import Checker, Sweep
from ._trees import TreeSpec, accumulate, dtype_of, private, readonly

__all__ = ["ForwardPass", "Grads", "Counts", "PROGRESS_THRESHOLD"]

#: ``progress=None`` shows a bar when the loop has at least this many steps (or an unknown
#: number) and standard error is a terminal.
PROGRESS_THRESHOLD = 1000

tree_util = jax.tree_util


class Grads(NamedTuple):
    """Cotangents of the inputs: ``params`` (structure of ``params``) and ``state0`` (of the
    initial state). They are the caller's: the driver keeps no reference to them.

    Example: ``J, g = rh.value_and_grad(...)``; ``g.params`` has the structure of
    ``params`` and ``g.state0`` that of the initial state.
    """

    params: Any
    state0: Any


@dataclasses.dataclass
class Counts:
    """What a :class:`ForwardPass` executed so far (its first sweep and every ``vjp``).

    ``plain``: step evaluations without adjoint (the first sweep, recomputations and the final
    step that produces ``u_N``); ``recorded``: adjoint evaluations; ``writes``/``reads``:
    snapshot stores/restores per storage level; ``shared_leaves``: leaves stored by reference.
    Mixed schedules: ``linearized``: evaluations keeping the step's data (``Linearize``);
    ``reversed``: steps reversed from their data (``Reverse``); ``data_writes``/``data_reads``:
    data stored/read per level. ``state_bytes``/``data_bytes``: the most bytes of state
    snapshots/of step data held at once on each level (shared leaves once).

    Example: ``fp.counts.plain`` after ``fp = rh.forward(...)`` is the number of plain step
    evaluations so far.
    """

    plain: int = 0
    recorded: int = 0
    writes: tuple[int, ...] = ()
    reads: tuple[int, ...] = ()
    shared_leaves: tuple[int, ...] = ()
    linearized: int = 0
    reversed: int = 0
    data_writes: tuple[int, ...] = ()
    data_reads: tuple[int, ...] = ()
    state_bytes: tuple[int, ...] = ()
    data_bytes: tuple[int, ...] = ()


def copy_tree(tree, dtypes=None):
    """NumPy copies of the leaves (cast to ``dtypes`` when given)."""
    leaves, treedef = tree_util.tree_flatten(tree)
    dtypes = dtypes or [None] * len(leaves)
    return tree_util.tree_unflatten(
        treedef, [np.array(x, dtype=d, copy=True) for x, d in zip(leaves, dtypes)]
    )


def initial_state(state0, is_jax: bool):
    """A private NumPy copy of ``state0`` (the step may update it in place); for a JAX step in the
    dtypes JAX computes in (:func:`dtype_of`: float32 for float64 leaves and for Python floats
    unless ``jax_enable_x64``)."""
    dtypes = None
    if is_jax:
        dtypes = [dtype_of(x, jax_step=True) for x in tree_util.tree_leaves(state0)]
    return copy_tree(state0, dtypes)


class _Progress:
    """A tqdm bar over one sweep (or nothing); a context manager."""

    def __init__(self, enabled: bool = False, total: int | None = None, desc: str = ""):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="step", leave=False, file=sys.stderr)

    def update(self, k: int = 1):
        if self.bar is not None:
            self.bar.update(k)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _progress_enabled(progress, n_steps) -> bool:
    if progress is None:
        try:
            tty = sys.stderr.isatty()
        except (AttributeError, ValueError):
            tty = False
        return tty and (n_steps is None or n_steps >= PROGRESS_THRESHOLD)
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be None (automatic), True or False; got {progress!r}.")
    return progress


class ForwardPass:
    """The result of :func:`retrograde.host.forward`: the final state, the loss, and the
    snapshots from which :meth:`vjp` reverses the loop, as often as needed.

    Attributes:
        state: the final state ``u_N`` (a NumPy copy; mutating it changes nothing here).
        value: the loss ``J`` (a float), or ``None`` when no loss was given.
        n_steps: ``N``, the number of steps taken (known only now for an online schedule).
        counts: a :class:`Counts` of what was executed so far.

    ``state0`` and ``params`` are copied when the handle is made, and the cotangents given to
    :meth:`vjp` when it is called: changing them afterwards changes nothing here.

    Use it as a context manager (or call :meth:`close`) so that its snapshots, and any snapshot
    directory on disk, are released; it is also released when garbage collected.

    Example::

        with rh.forward(step, u0, params, 1000, schedule=Revolve(10), loss=loss) as fp:
            g1 = fp.vjp()                         # gradient of the loss
            g2 = fp.vjp(state_bar=w)              # another functional, no new forward sweep
    """

    _reached: int  # steps reached by the forward sweep so far (set when it starts)

    def __init__(
        self,
        step: StepImpl,
        losses: tuple[LossImpl, ...],
        state0: PyTree,
        params: PyTree,
        n_steps: int | None,
        *,
        schedule: Schedule,
        storage: StorageSpec = None,
        until: Callable[[int, Any], Any] | None = None,
        progress: bool | None = None,
        single: bool = False,
    ):
        # single: one vjp(keep=False) follows at once (value_and_grad, hvp): no copy of params,
        # no published final state, the final loss gradient becomes the first cotangent.
        if not isinstance(schedule, Schedule):
            raise TypeError(
                f"schedule must be a retrograde.schedules.Schedule such as Revolve(10); got "
                f"{schedule!r}."
            )
        self._step = step
        self._losses = losses
        self._single = single
        self._schedule = schedule
        self._levels = schedule.levels
        self._progress = _progress_enabled(progress, n_steps)
        self._bar = _Progress()
        self._stores: list[Store] = []
        self._specs: list = []
        self._data_stores: list[Store | None] = []
        self._hand_store = MemoryStore("state at hand")
        self._hand: Snapshot | None = None
        self._closed = False
        self._spent = False
        self._persistent: dict[tuple[int, int], Any] = {}
        self._final_grad: tuple[list, list] | None = None
        self.counts = Counts()
        self.value: float | None = None
        self.state = None
        state = initial_state(state0, step.is_jax)
        self._sspec = TreeSpec(state, "state", step.is_jax)
        self._pspec = TreeSpec(params, "params", step.is_jax)
        self._params = private(params, copy=not single)
        if step.is_jax:  # a JAX step gets its parameters on the device once, not at every call
            self._params = jax.device_put(self._params)
        specs = resolve_storage(storage, self._levels)
        try:
            for i, (spec, lvl) in enumerate(zip(specs, self._levels)):
                self._stores.append(spec.open(f"level {i} ({lvl.name or 'unnamed'})"))
            self._specs = specs
            self._data_stores = [None] * len(specs)  # opened by the first Linearize on the level
            self._run_forward(state, n_steps, until)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ public
    def __enter__(self) -> ForwardPass:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Free every snapshot and remove any snapshot directory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        errors = []
        opened = [s for s in self._data_stores if s is not None]
        for store in [*self._stores, *opened, self._hand_store]:
            try:
                store.close()
            except Exception as e:  # noqa: BLE001 - keep closing the others; raised below
                errors.append(e)
        self._persistent.clear()
        self._final_grad = None
        if errors:
            raise errors[0]

    @property
    def closed(self) -> bool:
        return self._closed

    def vjp(
        self, state_bar: PyTree | None = None, *, loss_bar: float | None = None, keep: bool = True
    ) -> Grads:
        """Reverse the loop once: cotangents of ``params`` and of the initial state.

        Args:
            state_bar: cotangent of the final state ``u_N`` (a pytree like the state), or
                ``None`` for zero. It is copied, never modified.
            loss_bar: cotangent of the loss ``J``; default ``1.0`` when a loss was given.
            keep: ``True`` keeps the first sweep's snapshots (and step data, with a mixed
                schedule) for further ``vjp`` calls (memory: up to the schedule's slots twice
                over during this call: those the first sweep holds, ``S_f |u| + sum_{n in D_f}
                |d_n|``, kept, plus those of this reverse part; ``|u|`` a state's bytes, ``|d_n|``
                step ``n``'s data, ``D_f`` the steps whose data the first sweep keeps). ``False``
                frees each of them as soon as the schedule frees it (memory: the schedule's
                slots); the handle can then not ``vjp`` again.

        Returns:
            :class:`Grads` ``(params, state0)``: ``d<state_bar, u_N> + loss_bar * dJ`` with respect
            to ``params`` and ``u_0``; new arrays, the caller's.

        Cost: the reverse part of the schedule (its recomputations, its ``Linearize`` steps, and
        ``N`` adjoint steps, by ``vjp`` or ``vjp_from``); the first sweep is not repeated, and its
        step data are read again (copied), not recomputed. Snapshots and data made here are freed
        before returning.
        """
        if self._closed:
            raise ValueError(
                "vjp() on a closed ForwardPass: its snapshots were released. Call vjp inside the "
                "`with retrograde.host.forward(...) as fp:` block, before fp.close()."
            )
        if self._spent:
            raise ValueError(
                "vjp() after vjp(keep=False): the first sweep's snapshots were released. Use "
                "keep=True (the default) on every vjp call but the last."
            )
        if loss_bar is None:
            loss_bar = 1.0 if self._losses else 0.0
        elif not self._losses:
            raise ValueError(
                "vjp(loss_bar=...) was given but forward(...) had no loss; pass loss=Running(f) "
                "or Final(f) to forward, or give only state_bar."
            )
        loss_bar = float(loss_bar)
        if state_bar is None and not self._losses:
            raise ValueError(
                "vjp() needs state_bar (the cotangent of the final state) when forward(...) was "
                "given no loss."
            )
        if self._single:
            keep = False
        lam, pbar = self._first_cotangents(state_bar, loss_bar)
        if not keep:
            self._spent = True
        if self.n_steps == 0:
            return self._grads(pbar, lam)
        return self._run_reverse(lam, pbar, loss_bar, keep)

    # ------------------------------------------------------------------ helpers
    def _grads(self, pbar, lam) -> Grads:
        return Grads(self._pspec.materialize(pbar), self._sspec.materialize(lam))

    def _first_cotangents(self, state_bar, loss_bar):
        """The cotangent of ``u_N`` and the parameters' so far: ``state_bar + loss_bar * dJ/du_N``
        in arrays of the driver's own."""
        gs, gp = self._final_grad
        take = self._single  # the single vjp consumes the final gradient
        if take:
            self._final_grad = None
        lam, pbar = [None] * len(self._sspec), [None] * len(self._pspec)
        if loss_bar != 0.0:
            lam = [accumulate(None, x, loss_bar, take=take) for x in gs]
            pbar = [accumulate(None, x, loss_bar, take=take) for x in gp]
        if state_bar is not None:
            given = self._sspec.check_cotangent(state_bar, "vjp", "state_bar", verb="got")
            lam = [accumulate(x, y) for x, y in zip(lam, given)]
        return lam, pbar

    def _loss_grad(self, L: LossImpl, n, view):
        """Checked leaves (``None`` for zero) of a loss gradient at ``u_n``."""
        s_bar, p_bar = L.grad(n, view, self._params)
        if L.is_jax and not self._step.is_jax:  # a hand-written adjoint gets NumPy arrays
            s_bar, p_bar = tree_util.tree_map(np.asarray, (s_bar, p_bar))
        where = L.where("grad", n)
        return (
            self._sspec.check_cotangent(s_bar, where, "state_bar"),
            self._pspec.check_cotangent(p_bar, where, "params_bar"),
        )

    def _plain(self, n, state):
        """One plain step ``u_n -> u_{n+1}`` (checked)."""
        self.counts.plain += 1
        out = self._step.forward(n, state, self._params)
        return self._stepped(n, out, "forward")

    def _stepped(self, n, out, callback):
        """``u_{n+1}``, returned by ``callback``, checked; the first time it is reached, add the
        running losses and tick the progress bar."""
        out = self._sspec.check_primal(out, self._step.where(callback, n))
        if n + 1 > self._reached:
            self._reached = n + 1
            running = [L for L in self._losses if L.running]
            if running:
                view = readonly(out)
                for L in running:
                    self._J += L.value(n + 1, view, self._params)
            self._bar.update()
        return out

    def _until(self, until, n, state) -> bool:
        res = until(n, readonly(state))
        try:
            return bool(res)
        except (TypeError, ValueError):
            shape = getattr(res, "shape", None)
            raise TypeError(
                f"until at step {n} returned {type(res).__name__}"
                + ("" if shape is None else f" of shape {tuple(shape)}")
                + "; it must return a bool (stop before step n?)."
            ) from None

    def _data_store(self, level: int) -> Store:
        """The store of step data on ``level``, opened from the level's storage specification the
        first time (so that a schedule without ``Linearize`` opens none)."""
        store = self._data_stores[level]
        if store is None:
            name = self._levels[level].name or "unnamed"
            store = self._data_stores[level] = self._specs[level].open(
                f"level {level} ({name}) step data"
            )
        return store

    def _sync_counts(self):
        self.counts.writes = tuple(s.writes for s in self._stores)
        self.counts.reads = tuple(s.reads for s in self._stores)
        self.counts.shared_leaves = tuple(s.shared_leaves for s in self._stores)
        self.counts.state_bytes = tuple(s.peak_nbytes for s in self._stores)
        data = self._data_stores
        self.counts.data_writes = tuple(0 if s is None else s.writes for s in data)
        self.counts.data_reads = tuple(0 if s is None else s.reads for s in data)
        self.counts.data_bytes = tuple(0 if s is None else s.peak_nbytes for s in data)

    # ------------------------------------------------------------------ forward
    def _check_length(self, n_steps, until) -> tuple[int | None, bool]:
        sched = self._schedule
        online = isinstance(sched, OnlineSchedule)
        if n_steps is None and not online:
            raise ValueError(
                f"n_steps=None (a loop of unknown length) needs an online schedule such as "
                f"retrograde.schedules.Online(...); {type(sched).__name__} is offline. Give "
                "n_steps, or use an online schedule."
            )
        if n_steps is None and until is None:
            raise ValueError("n_steps=None needs until=lambda n, state: <stop?>; give either.")
        if until is not None and not online:
            raise ValueError(
                f"until= stops a loop of unknown length and needs an online schedule; "
                f"{type(sched).__name__} is offline: give n_steps instead."
            )
        if n_steps is not None:
            n_steps = check_steps(n_steps)
        if not online and not isinstance(sched, OfflineSchedule):
            raise TypeError(f"schedule {sched!r} is neither offline nor online.")
        return n_steps, online

    def _run_forward(self, state, n_steps, until):
        n_steps, online = self._check_length(n_steps, until)
        check = Checker.for_schedule(self._schedule, None if online else n_steps)
        m = Sweep(self, self._persistent, check)
        m.state = state
        del state
        m.running = [L for L in self._losses if L.running]  # stored with a step's data
        self._J, self._reached = 0.0, 0
        with _Progress(self._progress, n_steps, "forward") as self._bar:
            if online:
                run = self._online_run = cast(OnlineSchedule, self._schedule).start()

                def more(n):  # asked with u_n at hand
                    return (n_steps is None or n < n_steps) and not (
                        until is not None and self._until(until, n, m.state)
                    )

                m.run(run.forward(more))
                N = check.current
                check.stopped(N)
                self._prefix_len = None
                try:
                    self._online_saved = copy.deepcopy(run)
                except Exception:  # noqa: BLE001 - not copyable: later vjp calls replay the run
                    self._online_saved = None
            else:
                N = n_steps
                self._prefix_len = m.run(
                    cast(OfflineSchedule, self._schedule).actions(N), first_sweep=True
                )
            self.n_steps = N
            self._checked = check  # where every reverse sweep's checks start from
            cur = check.current
            if cur < N:  # the reverse part starts here: keep a copy, go on to u_N
                self._hand = self._hand_store.put(
                    cur, tree_util.tree_leaves(m.state), self._sspec.treedef
                )
                m.advance_to(cur, N)
        self._bar = _Progress()
        self._finish(m.state)
        self._vjp_calls = 0
        self._sync_counts()

    def _finish(self, final):
        """The final loss and its gradient at ``u_N``; publish ``u_N`` (a copy)."""
        N = self.n_steps
        J = self._J
        gs, gp = [None] * len(self._sspec), [None] * len(self._pspec)
        view = readonly(final)
        for L in self._losses:
            if not L.running:
                J += L.value(N, view, self._params)
            if N == 0 and L.running:
                continue  # the running sum starts at u_1
            s_bar, p_bar = self._loss_grad(L, N, view)
            # copies: u_N (which s_bar may alias) is published or dropped, later vjp calls read them
            gs = [accumulate(x, y) for x, y in zip(gs, s_bar)]
            gp = [accumulate(x, y) for x, y in zip(gp, p_bar)]
        del view
        self._final_grad = (gs, gp)
        self.value = J if self._losses else None
        if not self._single:
            self.state = copy_tree(final)  # the step may own (and later reuse) its output arrays

    # ------------------------------------------------------------------ reverse
    def _reverse_actions(self) -> Iterator:
        sched: Any = self._schedule  # offline if there is a prefix to skip, otherwise online
        N = self.n_steps
        if self._prefix_len is not None:
            it = sched.actions(N)
            for _ in range(self._prefix_len):
                next(it)
            return it
        if self._online_saved is not None:  # a copy of the run as the forward sweep left it
            return copy.deepcopy(self._online_saved).reverse(N)
        if self._vjp_calls == 0:
            return self._online_run.reverse(N)
        # a later vjp, and the run could not be copied: replay it (it is deterministic)
        run = sched.start()
        for n in range(N):
            run.on_step(n)
        return run.reverse(N)

    def _run_reverse(self, lam, pbar, loss_bar, keep) -> Grads:
        slots = dict(self._persistent) if keep else self._persistent
        if not keep:
            self._persistent = {}
        m = Sweep(self, slots, self._checked.copy(), temp=set(), keep=keep)
        # move the cotangents into the sweep (the caller's lists must not keep the arrays)
        m.lam, m.pbar, m.loss_bar = lam[:], pbar[:], loss_bar
        lam.clear()
        pbar.clear()
        m.running = [L for L in self._losses if L.running] if loss_bar != 0.0 else []
        hand = self._hand  # the state the first sweep ended on (None: it ended on u_N)
        if hand is not None:
            leaves = self._hand_store.get(hand, take=not keep)
            if not keep:
                self._hand_store.free(hand)
                self._hand = None
            m.state = tree_util.tree_unflatten(hand.treedef, leaves)
            del leaves
        actions = self._reverse_actions()
        self._vjp_calls += 1
        try:
            with _Progress(self._progress, self.n_steps, "reverse") as self._bar:
                m.run(actions)
            if m.check.next_record != -1:
                raise ScheduleError(
                    f"the schedule ended before step {m.check.next_record} was recorded."
                )
        finally:
            self._bar = _Progress()
            m.state = None
            for snap in m.temp:
                snap.store.free(snap)
            if not keep:
                for snap in slots.values():
                    snap.store.free(snap)
            self._sync_counts()
        return self._grads(m.pbar, m.lam)
