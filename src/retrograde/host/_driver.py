"""Executing a schedule's actions on a host-driven loop.

:class:`ForwardPass` runs the *first sweep* of a schedule (every action before the first
``Record``; for an online schedule every ``on_step``), keeps the snapshots that sweep laid, and
then, on every :meth:`ForwardPass.vjp`, executes the *reverse part* of the schedule from a copy of
the state the first sweep ended on. Snapshots made by a reverse part are freed when that
``vjp`` returns; the first sweep's snapshots stay until :meth:`ForwardPass.close`.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import numpy as np

from ..schedules import (
    Advance,
    End,
    Free,
    OfflineSchedule,
    OnlineSchedule,
    Record,
    Restore,
    Schedule,
    ScheduleError,
    Store,
)
from ._step import _LossImpl, _StepImpl, zeros_like_tree
from ._storage import SnapshotError, _LiveStore, _MemoryStore, resolve_storage

__all__ = ["ForwardPass", "Grads", "Counts", "PROGRESS_THRESHOLD"]

#: ``progress=None`` shows a bar when the loop has at least this many steps (or an unknown
#: number) and standard error is a terminal.
PROGRESS_THRESHOLD = 1000

tree_map = jax.tree_util.tree_map


class Grads(NamedTuple):
    """Cotangents of the inputs: ``params`` (structure of ``params``) and ``state0`` (of the
    initial state).

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

    Example: ``fp.counts.plain`` after ``fp = rh.forward(...)`` is the number of plain step
    evaluations so far.
    """

    plain: int = 0
    recorded: int = 0
    writes: tuple[int, ...] = ()
    reads: tuple[int, ...] = ()
    shared_leaves: tuple[int, ...] = ()


def _copy_tree(tree):
    return tree_map(lambda x: np.array(x, copy=True), tree)


def _is_plain_zero(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 0


def _add(a, b):
    """Sum of two cotangent pytrees; ``None`` or a plain ``0``/``0.0`` stands for zeros."""
    if a is None or _is_plain_zero(a):
        return b
    if b is None or _is_plain_zero(b):
        return a
    return tree_map(lambda x, y: x + y, a, b)


def _scale(tree, c):
    if c == 1.0:
        return tree
    return tree_map(lambda x: x * c, tree)


class _Progress:
    def __init__(self, enabled: bool, total: int | None, desc: str):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="step", leave=False, file=sys.stderr)

    def update(self, k: int = 1):
        if self.bar is not None:
            self.bar.update(k)

    def close(self):
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

    Use it as a context manager (or call :meth:`close`) so that its snapshots, and any snapshot
    directory on disk, are released; it is also released when garbage collected.

    Example::

        with rh.forward(step, u0, params, 1000, schedule=Revolve(10), loss=loss) as fp:
            g1 = fp.vjp()                         # gradient of the loss
            g2 = fp.vjp(state_bar=w)              # another functional, no new forward sweep
    """

    def __init__(
        self,
        step: _StepImpl,
        losses: tuple[_LossImpl, ...],
        state0,
        params,
        n_steps: int | None,
        *,
        schedule: Schedule,
        storage=None,
        until: Callable[[int, Any], Any] | None = None,
        progress: bool | None = None,
    ):
        if not isinstance(schedule, Schedule):
            raise TypeError(
                f"schedule must be a retrograde.schedules.Schedule such as Revolve(10); got "
                f"{schedule!r}."
            )
        self._step = step
        self._losses = losses
        # a JAX step gets its parameters on the device once, not at every call
        self._params = jax.device_put(params) if step.is_jax else params
        self._schedule = schedule
        self._levels = schedule.levels
        self._progress = _progress_enabled(progress, n_steps)
        self._stores: list[_LiveStore] = []
        self._hand_store = _MemoryStore("state at hand")
        self._closed = False
        self._spent = False
        self._persistent: dict[tuple[int, int], Any] = {}
        self.counts = Counts()
        self.value = None
        specs = resolve_storage(storage, self._levels)
        try:
            for i, (spec, lvl) in enumerate(zip(specs, self._levels)):
                self._stores.append(spec.open(f"level {i} ({lvl.name or 'unnamed'})"))
            self._run_forward(state0, n_steps, until)
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
        for store in [*self._stores, self._hand_store]:
            try:
                store.close()
            except Exception as e:  # keep closing the others
                errors.append(e)
        self._persistent.clear()
        if errors:
            raise errors[0]

    @property
    def closed(self) -> bool:
        return self._closed

    def vjp(self, state_bar=None, *, loss_bar: float | None = None, keep: bool = True) -> Grads:
        """Reverse the loop once: cotangents of ``params`` and of the initial state.

        Args:
            state_bar: cotangent of the final state ``u_N`` (a pytree like the state), or
                ``None`` for zero.
            loss_bar: cotangent of the loss ``J``; default ``1.0`` when a loss was given.
            keep: ``True`` keeps the first sweep's snapshots for further ``vjp`` calls (memory:
                up to the schedule's slots twice over during this call). ``False`` frees each
                of them as soon as the schedule frees it (memory: the schedule's slots); the
                handle can then not ``vjp`` again.

        Returns:
            :class:`Grads` ``(params, state0)``: ``d<state_bar, u_N> + loss_bar * dJ`` with respect
            to ``params`` and ``u_0``.

        Cost: the reverse part of the schedule (its recomputations and ``N`` adjoint steps); the
        first sweep is not repeated. Snapshots made here are freed before returning.
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
        lam = zeros_like_tree(self.state) if state_bar is None else state_bar
        if state_bar is not None:
            s_def = jax.tree_util.tree_structure(self.state)
            b_def = jax.tree_util.tree_structure(state_bar)
            if s_def != b_def:
                raise ValueError(
                    f"vjp(state_bar=...) must have the structure of the state {s_def}; got "
                    f"{b_def}."
                )
        pbar = zeros_like_tree(self._params)
        if loss_bar != 0.0:
            lam = _add(lam, _scale(self._final_grad[0], loss_bar))
            pbar = _add(pbar, _scale(self._final_grad[1], loss_bar))
        if self.n_steps == 0:
            return Grads(pbar, lam)
        if not keep:
            self._spent = True
        return self._run_reverse(lam, pbar, loss_bar, keep)

    # ------------------------------------------------------------------ helpers
    def _running(self):
        return [L for L in self._losses if L.running]

    def _loss_grad(self, L, n, state):
        s_bar, p_bar = L.grad(n, state, self._params)
        if L.is_jax and not self._step.is_jax:  # a hand-written adjoint gets NumPy arrays
            s_bar, p_bar = tree_map(np.asarray, s_bar), tree_map(np.asarray, p_bar)
        return s_bar, p_bar

    def _plain(self, n, state):
        self.counts.plain += 1
        return self._step.forward(n, state, self._params)

    def _store(self, state, cur, action, persistent: bool):
        step, slot, level = action
        if cur != step:
            raise ScheduleError(f"{action}: the state at hand is {cur}, not {step}.")
        if not 0 <= level < len(self._stores):
            raise ScheduleError(
                f"{action}: the schedule has no storage level {level} (it has {len(self._stores)})."
            )
        key = (level, slot)
        leaves, treedef = jax.tree_util.tree_flatten(state)
        snap = self._stores[level].put(step, leaves, treedef)
        return key, snap

    def _restore(self, slots, action):
        step, slot, level = action
        snap = slots.get((level, slot))
        where = f"slot {slot} of level {level} ({self._level_name(level)})"
        if snap is None:
            raise SnapshotError(
                f"snapshot of step {step} is missing: the schedule restores it from {where}, "
                "which holds no snapshot (a missing snapshot is never replaced by a live value)."
            )
        if snap.step != step:
            raise SnapshotError(
                f"snapshot of step {step} is missing: {where} holds the snapshot of step "
                f"{snap.step}."
            )
        leaves = snap.store.get(snap)
        return jax.tree_util.tree_unflatten(snap.treedef, leaves)

    def _level_name(self, level):
        try:
            return self._levels[level].name or "unnamed"
        except IndexError:
            return "?"

    def _free(self, slots, action, temp: set | None, keep: bool = True):
        step, slot, level = action
        snap = slots.pop((level, slot), None)
        if snap is None or snap.step != step:
            raise SnapshotError(
                f"snapshot of step {step}: the schedule frees slot {slot} of level {level}, which "
                f"holds {'nothing' if snap is None else f'step {snap.step}'}."
            )
        if temp is None or not keep:  # first sweep, or the last vjp: really free it
            if temp is not None:
                temp.discard(snap)
            snap.store.free(snap)
        elif snap in temp:
            temp.discard(snap)
            snap.store.free(snap)
        # else: a first-sweep snapshot, kept for later vjp calls

    # ------------------------------------------------------------------ forward
    def _run_forward(self, state0, n_steps, until):
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
            from ..schedules._base import check_steps

            n_steps = check_steps(n_steps)
        if not online and not isinstance(sched, OfflineSchedule):
            raise TypeError(f"schedule {sched!r} is neither offline nor online.")

        state = _copy_tree(state0)  # never mutate the caller's arrays
        self._treedef0 = jax.tree_util.tree_structure(state)
        running = self._running()
        J = 0.0
        cur = 0
        reached = 0
        bar = _Progress(self._progress, n_steps, "forward")

        def advance(n, state):
            """One plain step ``u_n -> u_{n+1}``; the first time ``u_{n+1}`` is reached, add the
            running losses and tick the progress bar."""
            nonlocal J, reached
            state = self._plain(n, state)
            if n + 1 > reached:
                reached = n + 1
                for L in running:
                    J += L.value(n + 1, state, self._params)
                bar.update()
            return state

        try:
            if online:
                self._online_run = sched.start()
                n = 0
                while True:
                    if n_steps is not None and n >= n_steps:
                        break
                    if until is not None and bool(until(n, state)):
                        break
                    for a in self._online_run.on_step(n):
                        if type(a) is Store:
                            key, snap = self._store(state, n, a, True)
                            if key in self._persistent:
                                raise ScheduleError(f"{a}: slot already holds a snapshot.")
                            self._persistent[key] = snap
                        elif type(a) is Free:
                            self._free(self._persistent, a, None)
                        else:
                            raise ScheduleError(f"on_step({n}) returned {a}; only Store/Free.")
                    state = advance(n, state)
                    n += 1
                N = n
                cur = N
                self._prefix_len = None
                try:
                    self._online_saved = copy.deepcopy(self._online_run)
                except Exception:  # not copyable: later vjp calls replay the run instead
                    self._online_saved = None
            else:
                N = n_steps
                prefix = 0
                for a in sched.actions(N):
                    kind = type(a)
                    if kind is Record or kind is End:
                        break
                    prefix += 1
                    if kind is Advance:
                        if cur != a.start:
                            raise ScheduleError(f"{a}: the state at hand is {cur}.")
                        for n in range(a.start, a.stop):
                            state = advance(n, state)
                        cur = a.stop
                    elif kind is Store:
                        key, snap = self._store(state, cur, a, True)
                        if key in self._persistent:
                            raise ScheduleError(f"{a}: slot already holds a snapshot.")
                        self._persistent[key] = snap
                    elif kind is Restore:
                        state = self._restore(self._persistent, a)
                        cur = a.step
                    elif kind is Free:
                        self._free(self._persistent, a, None)
                    else:
                        raise ScheduleError(f"unknown action {a!r}")
                self._prefix_len = prefix
            self.n_steps = N
            # the state the reverse part starts from
            leaves, treedef = jax.tree_util.tree_flatten(state)
            self._hand = self._hand_store.put(cur, leaves, treedef)
            # continue plainly to u_N (the caller wants it; an offline reverse part never needs it)
            for n in range(cur, N):
                state = advance(n, state)
        finally:
            bar.close()
        self.state = _copy_tree(state)  # the step may own (and later reuse) its output arrays
        del state
        final_state = self.state
        gs, gp = None, None
        for L in self._losses:
            if not L.running:
                J += L.value(N, final_state, self._params)
            if N == 0 and L.running:
                continue  # the running sum starts at u_1
            s_bar, p_bar = self._loss_grad(L, N, final_state)
            gs, gp = _add(gs, s_bar), _add(gp, p_bar)
        self._final_grad = (gs, gp) if gs is not None else (None, None)
        if self._final_grad[0] is None:
            self._final_grad = (zeros_like_tree(self.state), zeros_like_tree(self._params))
        self.value = J if self._losses else None
        self._vjp_calls = 0
        self._sync_counts()

    def _sync_counts(self):
        self.counts.writes = tuple(s.writes for s in self._stores)
        self.counts.reads = tuple(s.reads for s in self._stores)
        self.counts.shared_leaves = tuple(s.shared_leaves for s in self._stores)

    # ------------------------------------------------------------------ reverse
    def _reverse_actions(self) -> Iterator:
        sched = self._schedule
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

    def _run_reverse(self, lam, pbar, loss_bar, keep):
        params = self._params
        running = self._running() if loss_bar != 0.0 else []
        slots = dict(self._persistent)
        temp: set = set()
        hand = self._hand
        state = jax.tree_util.tree_unflatten(hand.treedef, self._hand_store.get(hand))
        if not keep:
            self._hand_store.free(hand)
            self._persistent = {}
        cur = hand.step
        next_record = self.n_steps - 1
        bar = _Progress(self._progress, self.n_steps, "reverse")
        actions = self._reverse_actions()
        self._vjp_calls += 1
        try:
            for a in actions:
                kind = type(a)
                if kind is Advance:
                    if cur != a.start:
                        raise ScheduleError(f"{a}: the state at hand is {cur}.")
                    for n in range(a.start, a.stop):
                        state = self._plain(n, state)
                    cur = a.stop
                elif kind is Record:
                    n = a.step
                    if n != next_record or cur != n:
                        raise ScheduleError(
                            f"{a}: the state at hand is {cur} and the next step to record is "
                            f"{next_record}."
                        )
                    # the running loss reads u_n: take its gradient before the step may touch u_n
                    g_state = None
                    if n >= 1:
                        for L in running:
                            s_bar, p_bar = self._loss_grad(L, n, state)
                            g_state = _add(g_state, _scale(s_bar, loss_bar))
                            pbar = _add(pbar, _scale(p_bar, loss_bar))
                    s_bar, p_bar = self._step.vjp(n, state, params, lam)
                    self.counts.recorded += 1
                    lam = _add(s_bar, g_state)
                    pbar = _add(pbar, p_bar)
                    state, cur = None, None
                    next_record -= 1
                    bar.update()
                elif kind is Store:
                    key, snap = self._store(state, cur, a, False)
                    if key in slots:
                        raise ScheduleError(f"{a}: slot already holds step {slots[key].step}.")
                    slots[key] = snap
                    temp.add(snap)
                elif kind is Restore:
                    state = self._restore(slots, a)
                    cur = a.step
                elif kind is Free:
                    self._free(slots, a, temp, keep)
                elif kind is End:
                    break
                else:
                    raise ScheduleError(f"unknown action {a!r}")
            if next_record != -1:
                raise ScheduleError(
                    f"the schedule ended before step {next_record} was recorded."
                )
        finally:
            bar.close()
            for snap in temp:
                snap.store.free(snap)
            if not keep:
                for snap in slots.values():
                    snap.store.free(snap)
            self._sync_counts()
        return Grads(pbar, lam)

