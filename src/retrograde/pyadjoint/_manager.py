"""Executing a retrograde schedule on a pyadjoint tape.

pyadjoint asks its checkpoint manager at three points: ``Tape.end_timestep`` (taping),
``ReducedFunctional.__call__`` (:meth:`CheckpointManager.recompute`) and ``Tape.evaluate_adj``
(:meth:`CheckpointManager.evaluate_adj`); the tape installed by
:func:`~retrograde.pyadjoint.enable_checkpointing` also routes ``evaluate_tlm``,
``evaluate_hessian`` and every dependency read while taping (``add_to_checkpointable_state``)
here.

**States.** ``u_n``, the state at boundary ``n``, is every block variable made before step ``n``
and read in step ``n`` or later (:class:`~._graph.TapeGraph`); the tape's inputs (controls,
constants) are never stored or cleared. The state at hand lives where pyadjoint's blocks read it:
in the variables' checkpoints (and, in tangent sweeps, their ``tlm_value``).

**Sweeps.** As in the host driver (:mod:`retrograde.host`), a *first sweep* runs every step once
and lays the schedule's forward snapshots: the taping itself, then each
``ReducedFunctional.__call__`` (plain) or ``tlm`` (with tangents). A *reverse part* executes the
rest of the schedule from those snapshots: ``evaluate_adj`` (``Record(n)``: recompute step
``n``, then its blocks' adjoints in reverse) and ``evaluate_hessian`` (one augmented sweep:
recompute with tangents, then adjoint and second-order adjoint per block). A reverse part
releases each snapshot when the schedule frees it, so memory is the schedule's; a derivative
taken again without re-evaluating first runs a new first sweep at the same controls. Every action
is executed by the schedule's :class:`~retrograde.schedules.Simulator` (``Simulator.for_schedule``,
which also checks a mixed schedule's weighted memory budget) before it runs: the taping sweep's and
its reverse part's one by one, those of every later sweep once, when the taping ends (a
:class:`_Plan` for the count taped, replayed by each sweep). So the counts are those of
:func:`~retrograde.schedules.simulate`: a first sweep costs ``N`` step evaluations, a reverse
part ``plain - (N - 1)`` plain and ``N`` recorded ones (offline schedules; an online one's
``plain - N`` and ``N``).

**Mixed schedules.** ``Linearize(n)`` evaluates step ``n`` keeping its *data*: the values its
blocks' adjoints read, which are every dependency of its blocks made on the tape (a block's
``evaluate_adj`` reads them all) and the outputs each block's adjoint was seen to read (watched
through the guarded variables the first time a block's adjoint runs; until then, all of its
outputs). A tangent sweep (``tlm``, ``hessian``) keeps every output, and the tangents of all it
keeps, since a second-order adjoint may read an output's tangent (Firedrake's solve blocks do),
which no guard watches. ``Reverse(n)`` makes those values the blocks' checkpoints and runs the
adjoints of step ``n`` with no recomputation; whatever else a block reads is absent, and raises
:class:`~._guard.MissingValueError`. While taping, a ``Linearize(n)`` of the schedule keeps each
value step ``n`` reads and each output it makes as it is taped (the live object holds that
value then).

**Taping.** The step count is unknown while taping unless ``n_steps`` was given: an offline
schedule without it places its snapshots online (``Revolve(s)`` as ``Online(s)``, ``StoreAll``
and ``RecomputeAll`` as themselves); later first sweeps use ``actions(N)`` for the count taped.
A snapshot laid while taping is filled as later steps read what it must hold: when step ``m``
reads a variable made in step ``c < m``, its value (the live object's, which still holds that
variable's value at the read) joins every held taping snapshot of a boundary in ``(c, m]``.
"""

from __future__ import annotations

import bisect
import collections
import copy
import dataclasses
import itertools
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from pyadjoint.block_variable import BlockVariable
from pyadjoint.tape import stop_annotating

from ..schedules import (
    Advance,
    End,
    Free,
    Linearize,
    OfflineSchedule,
    Online,
    OnlineRun,
    OnlineSchedule,
    RecomputeAll,
    Record,
    Reverse,
    Revolve,
    Schedule,
    ScheduleError,
    Simulator,
    Store,
    StoreAll,
    check_steps,
    schedule_stream,
)
from ._graph import TapeGraph
from ._guard import RUNNING, MissingValueError, describe, guard
from ._slots import Snapshot, is_delegated, open_store
from ._sweep import Sweep

__all__ = ["CheckpointManager", "Counts"]


@dataclasses.dataclass
class Counts:
    """What the manager executed so far.

    ``steps``: step evaluations without adjoint (first sweeps, recomputations); ``recorded``:
    steps reversed; ``rerun``: those of them recomputed first (all, unless the schedule is
    ``StoreAll``, which keeps every value); ``writes``/``reads``: snapshots stored/restored, per
    level. Mixed schedules: ``linearized``: steps evaluated keeping their data (after taping);
    ``reversed``: steps reversed from their data; ``data_writes``/``data_reads``: data stored
    (taping included)/read, per level.
    """

    steps: int = 0
    recorded: int = 0
    rerun: int = 0
    writes: list = dataclasses.field(default_factory=list)
    reads: list = dataclasses.field(default_factory=list)
    linearized: int = 0
    reversed: int = 0
    data_writes: list = dataclasses.field(default_factory=list)
    data_reads: list = dataclasses.field(default_factory=list)


def _taping_run(schedule: Schedule):
    """The online run that places an offline ``schedule``'s snapshots while the count is unknown."""
    if isinstance(schedule, OnlineSchedule):
        return schedule.start()
    if isinstance(schedule, Revolve):
        return Online(schedule.snapshots).start()
    if isinstance(schedule, StoreAll):
        return schedule.start()
    if isinstance(schedule, RecomputeAll):
        return Online(1).start()
    raise ValueError(
        f"enable_checkpointing({schedule!r}) needs n_steps: the step count must be known before "
        "taping for this schedule (Revolve, StoreAll, RecomputeAll and Online place their "
        "snapshots without it). Pass n_steps=<the number of time steps>."
    )


class _Peek:
    """An action stream with one action of look-ahead; counts the actions taken."""

    def __init__(self, actions: Iterable):
        self._it = iter(actions)
        self._next = next(self._it, None)
        self.taken = 0

    def peek(self):
        return self._next

    def take(self):
        a = self._next
        self._next = next(self._it, None)
        self.taken += 1
        return a


class CheckpointManager:
    """Runs a retrograde schedule on one pyadjoint tape (see the module docstring).

    Args:
        schedule: any retrograde schedule; its levels with ``storage="disk"`` store on disk.
        tape: the pyadjoint tape (empty).
        n_steps: the number of time steps, if known before taping.
    """

    def __init__(self, schedule: Schedule, tape, n_steps: int | None = None):
        if not isinstance(schedule, (OfflineSchedule, OnlineSchedule)):
            raise TypeError(
                f"enable_checkpointing(schedule=...) must be a retrograde schedule such as "
                f"retrograde.schedules.Revolve(10), got {schedule!r}. (checkpoint_schedules "
                "objects are for tape.enable_checkpointing, pyadjoint's own manager.)"
            )
        self.schedule = schedule
        #: ``StoreAll`` keeps every value the steps make, as pyadjoint's unchecked tape does: its
        #: reverse sweep recomputes nothing, and a step recomputes into its outputs' objects
        #: (no snapshot holds them: with every value kept, a snapshot is only a mark).
        self.hold_all = isinstance(schedule, StoreAll)
        self.tape = tape
        self.n_given = None if n_steps is None else check_steps(n_steps, "n_steps")
        self.levels = tuple(schedule.levels)
        self.stores = [open_store(level, tape) for level in self.levels]
        zeros = [0] * len(self.levels)
        self.counts = Counts(
            writes=zeros[:], reads=zeros[:], data_writes=zeros[:], data_reads=zeros[:]
        )
        self.graph: TapeGraph | None = None
        self.functional = None  # the block variable of the last functional recomputed
        self.seeds: list = []  # (block variable, adjoint value) of the last evaluate_adj
        self._controls: set = set()
        self._tangent_first = False  # the last first sweep carried tangents
        #: block -> the outputs its adjoint read, for the blocks whose adjoint ran (mixed)
        self.adjoint_reads: dict = {}
        self.mixed = False  # the schedule has Linearize actions (known once taped)
        self._taping_data: Snapshot | None = None  # the data of the step being taped
        for p in tape._package_data.values():
            p.pause_checkpointing()
        # taping
        self.taping = True
        self._online = isinstance(schedule, OnlineSchedule) or self.n_given is None
        self._check = Simulator.for_schedule(schedule, None if self._online else self.n_given)
        if self._online:
            self._run = (
                schedule.start() if isinstance(schedule, OnlineSchedule) else _taping_run(schedule)
            )
            self._stream = None
        else:
            self._run = None
            self._stream = _Peek(schedule.actions(self.n_given))
        self._persistent: dict = {}  # (level, slot) -> Snapshot of the first sweep
        self._covered: dict = {}  # block variable -> the last boundary its value was added to
        self._taping_steps: list[int] = []  # the held taping snapshots' steps, sorted,
        self._taping_snaps: list[Snapshot] = []  # and the snapshots
        self._hand_capture: dict = {}  # block variable -> value: step m's reads of earlier steps
        self._boundary = 0
        self._reading = None  # the variable being read (see capture_read)
        self._hand: tuple[int, dict] | None = None  # (n, u_n) where the first sweep ended
        self._prefix_len: int | None = None
        self._online_saved: OnlineRun | None = None
        self._cached_plan: _Plan | None = None
        tape._blocks.append_step()
        tape.latest_checkpoint = 0
        tape._eagerly_checkpoint_outputs = False
        self._begin_taping_step(0)

    # ------------------------------------------------------------------ taping
    def _begin_taping_step(self, b: int) -> None:
        """Execute the schedule's actions at boundary ``b`` (taping has ``u_b`` at hand)."""
        if self._online:
            for a in self._run.on_step(b):
                self._check.execute(a)
                self._taping_action(a)
            self._check.execute(Advance(b, b + 1))
            return
        s = self._stream
        while True:
            a = s.peek()
            if type(a) in (Store, Free) and a.step == b:
                self._check.execute(s.take())
                self._taping_action(a)
            else:
                if type(a) is Advance and a.start == b:
                    self._check.execute(s.take())
                elif type(a) is Linearize and a.step == b:  # step b's data, kept as it is taped
                    self._check.execute(s.take())
                    snap = Snapshot(b, a.level, self.stores[a.level], data=True)
                    self._persistent[(a.level, a.slot)] = self._taping_data = snap
                    self.counts.data_writes[a.level] += 1
                return

    def _taping_action(self, a) -> None:
        key = (a.level, a.slot)
        if type(a) is Store:  # boundaries only grow while taping: the lists stay sorted
            snap = self._persistent[key] = Snapshot(a.step, a.level, self.stores[a.level])
            self._taping_steps.append(a.step)
            self._taping_snaps.append(snap)
            self.counts.writes[a.level] += 1
        else:  # Free
            snap = self._persistent.pop(key)
            if not snap.data:
                i = self._taping_snaps.index(snap)
                del self._taping_snaps[i], self._taping_steps[i]
            snap.release()

    def end_timestep(self, timestep: int) -> None:
        """pyadjoint's hook: step ``timestep`` is taped, the next one begins."""
        if not self.taping:
            raise ScheduleError(
                "the tape cannot take more time steps: it was already evaluated or "
                "differentiated. Tape the whole loop before calling the ReducedFunctional."
            )
        b = timestep + 1
        if self.n_given is not None and b >= self.n_given:
            raise ScheduleError(
                f"the loop takes more than n_steps={self.n_given} time steps; pass "
                f"enable_checkpointing(..., n_steps=<the number of time steps>) or none."
            )
        self._taping_data = None
        if not self.hold_all:
            self._clear_taping_step(timestep)
        self._hand_capture = {}
        self._boundary = b
        self.tape._blocks.append_step()
        self._begin_taping_step(b)

    def _clear_taping_step(self, m: int) -> None:
        """Drop pyadjoint's own copies made while taping step ``m`` (its reads and outputs):
        what later sweeps need is in the taping snapshots."""
        for block in self.tape.timesteps[m]:
            for bv in block.get_outputs():
                bv._checkpoint = None
            for bv in block.get_dependencies():
                if bv.creation_timestep >= 0 and bv.creation_timestep < m:
                    bv._checkpoint = None

    def capture_read(self, bv: BlockVariable, last_used: int) -> None:
        """A block of the step being taped reads ``bv`` (pyadjoint's
        ``add_to_checkpointable_state``): add its value to the snapshots that must hold it."""
        # pyadjoint's own method keeps every read variable in its step sets; the block appends
        # it to its dependencies only after this call, through the object's weak reference:
        # hold it until then
        self._reading = bv
        c = bv.creation_timestep
        m = self._boundary
        data = self._taping_data
        if c < 0 or (c >= m and data is None):
            return  # a tape input, or made in this step
        value = _live_value(bv)  # the live object still holds bv's value
        if data is not None and bv not in data.entries:
            data.entries[bv] = data.store.put(m, bv, value, None)
        if c >= m:
            return
        self._hand_capture.setdefault(bv, value)
        done = self._covered.get(bv, c)
        if done >= m:
            return
        steps, snaps = self._taping_steps, self._taping_snaps
        for i in range(bisect.bisect_right(steps, done), bisect.bisect_right(steps, m)):
            snap = snaps[i]
            if bv not in snap.entries:
                snap.entries[bv] = snap.store.put(snap.step, bv, value, None)
        self._covered[bv] = m

    def capture_output(self, bv: BlockVariable) -> None:
        """A block of the step being taped makes ``bv`` (pyadjoint's
        ``add_to_adjoint_dependencies``, called once its value is computed): keep it in the
        step's data if the schedule linearizes this step."""
        data = self._taping_data
        if data is not None and bv not in data.entries:
            data.entries[bv] = data.store.put(self._boundary, bv, _live_value(bv), None)

    def _end_taping(self) -> None:
        """The loop is taped: fix ``N``, guard every variable, prepare the first reverse part."""
        tape = self.tape
        N = len(tape.timesteps)
        if self.n_given is not None and N != self.n_given:
            raise ScheduleError(
                f"the loop took {N} time steps but enable_checkpointing was given "
                f"n_steps={self.n_given}; pass the number of steps the loop takes, or none."
            )
        self._taping_data = None
        if not self.hold_all:
            self._clear_taping_step(N - 1)
        self.graph = g = TapeGraph(tape.timesteps)
        for n, blocks in enumerate(g.steps):
            for block in blocks:
                for bv in block.get_outputs():
                    guard(bv, n, block)
        for snap in self._persistent.values():
            if snap.data:
                need = [
                    bv
                    for block in g.steps[snap.step]
                    for bv in block.get_dependencies()
                    if bv in g.created
                ]
            else:
                need = list(g.live[snap.step])
            missing = [bv for bv in need if bv not in snap.entries]
            if missing:
                what = "data" if snap.data else "snapshot"
                raise MissingValueError(
                    f"the {what} of step {snap.step} lacks {describe(missing[0])}: it was not "
                    "read through a block dependency while taping."
                )
        if self._online:
            self._check.stopped(N)
            self._online_saved = copy.deepcopy(self._run)
            self._hand = None
        else:
            if self._check.current not in (N - 1, N):
                raise ScheduleError(
                    f"the schedule stopped at step {self._check.current}, not {N - 1}."
                )
            self._prefix_len = self._stream.taken
            self._hand = None  # at u_N: the taping linearized the last step
            if self._check.current == N - 1:
                self._hand = (N - 1, {bv: (v, None) for bv, v in self._hand_capture.items()})
        self._hand_capture = {}
        self._covered = {}
        self._taping_steps, self._taping_snaps = [], []
        self._reading = None
        self._stream = self._run = None
        self._checked = self._check
        self._cached_plan = plan = _plan_for(self.schedule, N)
        self.mixed = any(type(a) is Linearize for a in (*plan.forward, *plan.reverse))
        self._after_taping = True
        self._consumed = False
        self.taping = False

    def _ensure_taped(self) -> None:
        if self.taping:
            self._end_taping()

    # ------------------------------------------------------------------ pyadjoint's hooks
    def recompute(self, functional=None) -> None:
        """pyadjoint's hook in ``ReducedFunctional.__call__``: a first sweep at the controls'
        values."""
        self._ensure_taped()
        if functional is not None:
            self.functional = functional.block_variable
        self._note_controls()
        self._first_sweep(tangent=False, markings=False)

    def evaluate_adj(self, last_block: int, markings: bool) -> None:
        """pyadjoint's hook in ``Tape.evaluate_adj``: the reverse part of the schedule."""
        if last_block != 0:
            raise NotImplementedError(
                "retrograde.pyadjoint reverses the whole tape only (last_block=0)."
            )
        self._ensure_taped()
        self._note_controls()
        self.seeds = [(bv, bv.adj_value) for bv in self._outputs() if bv.adj_value is not None]
        self._reverse(hessian=False, markings=markings)

    def evaluate_tlm(self, markings: bool = False) -> None:
        """``Tape.evaluate_tlm``: a first sweep with tangents (its snapshots hold them, for a
        Hessian's reverse part)."""
        self._ensure_taped()
        self._first_sweep(tangent=True, markings=markings)

    def evaluate_hessian(self, markings: bool = False) -> None:
        """``Tape.evaluate_hessian``: one augmented reverse part (tangents, adjoints and
        second-order adjoints), after a tangent first sweep unless ``tlm`` just ran one."""
        self._ensure_taped()
        if not self.seeds:
            raise ValueError(
                "hessian() needs the adjoint seed of a derivative: call rf.derivative() before "
                "rf.hessian(...), as with pyadjoint's own tape."
            )
        if not self._tangent_first or self._consumed:
            self._first_sweep(tangent=True, markings=markings)
        with stop_annotating():
            for bv in self._outputs():
                bv.adj_value = None
            for bv, value in self.seeds:
                bv.adj_value = value
        self._reverse(hessian=True, markings=markings)

    # ------------------------------------------------------------------ sweeps
    def _outputs(self) -> Iterator:
        for outs in self.graph.outs:
            yield from outs

    def _note_controls(self) -> None:
        """Remember block outputs marked as controls (their values are the user's)."""
        self._controls.update(bv for bv in self._outputs() if bv.is_control)

    def _drop_persistent(self) -> None:
        for snap in self._persistent.values():
            snap.release()
        self._persistent = {}
        self._hand = None

    def _plan(self) -> _Plan:
        """The sweeps' actions for the count taped, built and proven valid when taping ended."""
        assert self._cached_plan is not None
        return self._cached_plan

    def _first_sweep(self, tangent: bool, markings: bool) -> None:
        N = self.graph.n_steps
        self._drop_persistent()
        for p in self.tape._package_data.values():
            p.reset()
            p.pause_checkpointing()
        plan = self._plan()
        sweep = Sweep(self, {}, None, temp=None, tangent=tangent, markings=markings)
        sweep.at = 0
        with stop_annotating():
            sweep.replay(plan.forward)
            if plan.hand < N:
                self._hand = (plan.hand, sweep.hold(plan.hand))
                sweep.advance_to(plan.hand, N)
        self._persistent = sweep.slots
        self._after_taping = False
        self._consumed = False
        self._tangent_first = tangent

    def _taping_reverse(self) -> Iterator:
        """The reverse part of the schedule the taping sweep played."""
        if self._online_saved is not None:
            return copy.deepcopy(self._online_saved).reverse(self.graph.n_steps)
        it = self.schedule.actions(self.graph.n_steps)
        collections.deque(itertools.islice(it, self._prefix_len), maxlen=0)  # the taping's
        return it

    def _reverse(self, hessian: bool, markings: bool) -> None:
        """The reverse part, from the last first sweep's snapshots, which it consumes: each is
        released when the schedule frees it, so memory stays that of the schedule. A later
        reverse part runs a first sweep again (``N`` step evaluations) at the same controls."""
        if self._consumed:
            self._first_sweep(tangent=hessian, markings=markings)
        after_taping = self._after_taping
        check = self._checked if after_taping else None
        sweep = Sweep(
            self,
            self._persistent,
            check,
            temp=set(),
            tangent=hessian,
            markings=markings,
            hessian=hessian,
        )
        self._persistent = {}
        self._consumed = True
        try:
            with stop_annotating():
                if self._hand is not None:
                    (n, hand), self._hand = self._hand, None
                    sweep.load(n, hand)
                    del hand
                if after_taping:
                    sweep.run_checked(self._taping_reverse())
                    if check.next_record != -1:
                        raise ScheduleError(
                            f"the schedule ended before step {check.next_record} was recorded."
                        )
                else:
                    sweep.replay(self._plan().reverse)
        finally:
            for snap in list(sweep.slots.values()) + list(sweep.temp):
                snap.release()
            RUNNING.step = None


def _live_value(bv: BlockVariable):
    """``bv``'s value while taping: its checkpoint, or one made of the live object, which holds
    that value while ``bv`` is read or made (a delegated checkpoint is copied out of it)."""
    value = bv._checkpoint
    if value is None or is_delegated(value):
        with stop_annotating():
            value = bv.output._ad_create_checkpoint()
    return value


class _Plan(NamedTuple):
    """The actions of every sweep after taping, for the count taped: ``forward`` (a first
    sweep's, up to the first ``Record`` or ``Reverse``, or for an online schedule up to
    ``u_N``), ``reverse``
    (the rest) and ``hand`` (the step at hand where ``forward`` ends)."""

    forward: tuple
    reverse: tuple
    hand: int


def _plan_for(schedule: Schedule, n_steps: int) -> _Plan:
    """Every action of ``schedule`` for ``n_steps`` steps, executed once by the schedule's
    :class:`~retrograde.schedules.Simulator` (``Simulator.for_schedule``: its levels, data size
    and weighted memory budget; so each sweep replays actions proven valid, without checking them
    again) and split where the first sweep ends. Memory: the actions, ``O(N)`` for
    the schedules here, as the tape itself."""
    check = Simulator.for_schedule(schedule, n_steps)
    forward: list = []
    reverse: list = []
    hand = None
    for a in schedule_stream(schedule, n_steps):
        if hand is None and (type(a) in (Record, Reverse, End) or check.current == n_steps):
            hand = check.current
        check.execute(a)
        (forward if hand is None else reverse).append(a)
    if not check.ended or check.next_record != -1:
        raise ScheduleError(
            f"{schedule!r} stopped before every one of the {n_steps} steps was recorded."
        )
    return _Plan(tuple(forward), tuple(reverse), n_steps if hand is None else hand)
