"""Levels in host RAM and on disk inside the compiled loops (issue #21).

Every result is compared with ``jax.lax.scan`` (or ``jax.lax.fori_loop``) in float64 to 1e-12;
evaluations are counted by a callback in the step, and transfers per level by the stores
(``retrograde.loops.offload_stats``), against ``simulate``. Memory: the compiled gradient's
temporaries do not grow with the host or disk slot count. Files: a disk level's snapshots are in
an unnamed temporary file, so no file is ever visible, whatever ends the run.
"""

from __future__ import annotations

import functools
import gc
import itertools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrograde
from retrograde import schedules as rs
from retrograde.loops import _offload, _offload_runs, offload_stats, release_offloaded
from retrograde.schedules import Level, MultiLevel, Online

from .. import _signals
from . import _problems as P
from .test_counts import _count
from .test_counts import _loss as _counted_scan_loss
from .test_scan import STEPS, _vjp_program, _vjp_reference

RTOL = 1e-12


def host(slots, cost=1.0, **kw):
    return Level(slots, cost, cost, name="host", storage="host", **kw)


def disk(slots, cost=2.0, **kw):
    return Level(slots, cost, cost, name="disk", storage="disk", **kw)


# Every shape of offline plan: the chain (segments on an unlimited disk), the exhaustive DP
# (starts moved between levels in the reverse sweep), three levels, a pool of fast slots split
# across device and host (equal costs), no device level at all, and every state on the host (a
# store at every step of the forward sweep).
OFFLINE = {
    "disk_chain": MultiLevel([Level(2), disk(None)]),
    "host_exact": MultiLevel([Level(2), host(3)]),
    "three_levels": MultiLevel([Level(2), host(2, 0.5), disk(None)]),
    "pooled": MultiLevel([Level(2), Level(2, name="host", storage="host")]),
    "host_only": MultiLevel([host(3, 0.0)]),
    "host_all": MultiLevel([host(None, 0.0)]),
}
TWO_LEVEL = {
    "host": Online(2, slow=host(5)),
    "disk": Online(3, slow=disk(4)),
}


@pytest.fixture(autouse=True)
def _no_store_left():
    """Every test ends with every store released (and starts with clean counters)."""
    offload_stats(reset=True)
    yield
    if offload_stats().open_stores:  # a full collection takes 2-6 s here: only when needed
        gc.collect()
    assert offload_stats().open_stores == 0


def _moved(schedule):
    """Whether the schedule's plan keeps snapshots on a host or disk level (for N = 30)."""
    st = rs.simulate(schedule, 30)
    return any(w for w, lvl in zip(st.writes, st.levels) if lvl.storage != "device")


# ----------------------------------------------------------------------------- first order


@pytest.mark.parametrize("name", list(OFFLINE))
def test_vjp_every_plan_shape(name):
    """Primal and VJP (carry and ys cotangents; parameters, init and xs) for N in ``STEPS``, as
    ``test_scan.test_vjp_every_schedule``."""
    schedule = OFFLINE[name]
    assert _moved(schedule), "the plan should move snapshots off the device"
    args, ref = _vjp_reference()
    got = _vjp_program(P.rscan(schedule))(args)
    for n in STEPS:
        P.assert_close(got[n], ref[n], RTOL, f"{name} N={n}")
    st = offload_stats()
    assert sum(st.writes.values()) > 0 and st.reads.keys() <= st.writes.keys()


def test_fori_loop_static_bounds():
    sched = OFFLINE["host_exact"]
    f = lambda a, sched: jnp.sum(
        retrograde.fori_loop(
            0, 25, lambda i, u: u + 0.1 * jnp.sin(a * u + i), jnp.ones(3), schedule=sched
        )
        ** 2
    )
    ref = jax.grad(
        lambda a: jnp.sum(
            jax.lax.fori_loop(0, 25, lambda i, u: u + 0.1 * jnp.sin(a * u + i), jnp.ones(3)) ** 2
        )
    )(0.4)
    P.assert_close(jax.jit(jax.grad(lambda a: f(a, sched)))(0.4), ref, RTOL)


# ----------------------------------------------------------------------------- higher orders


def _orders(scan):
    """Hessian, grad of grad, forward-over-reverse, jvp, and vmap of gradients and of HVPs."""
    L = functools.partial(P.small_loss, scan)

    def f(p, u0, xs, du):
        g = jax.grad(L, argnums=(0, 1))
        dus = jnp.stack([du, 2.0 * du[::-1], jnp.ones_like(du)])
        return {
            "jvp": jax.jvp(lambda u: L(p, u, xs), (u0,), (du,)),
            "hessian": jax.hessian(L, argnums=(0, 1))(p, u0, xs),
            "grad_grad": jax.grad(lambda p, xs: jnp.sum(g(p, u0, xs)[1] ** 2), argnums=(0, 1))(
                p, xs
            ),
            "hvp": jax.jvp(lambda u: g(p, u, xs), (u0,), (du,)),
            "vmap_grad": jax.vmap(lambda u: g(p, u, xs))(dus),
            "vmap_hvp": jax.vmap(lambda d: jax.jvp(lambda u: g(p, u, xs)[1], (u0,), (d,))[1])(dus),
        }

    return P.jit(f)


def _order_args(n=6):
    return P.small_params(), P.small_u0(), P.small_xs(n), jnp.array([0.3, -0.7])


@functools.cache
def _orders_reference():
    return _orders(P.lax_scan)(*_order_args())


@pytest.mark.parametrize("name", ["host_exact", "disk_chain", "host_all"])
def test_higher_orders(name):
    got = _orders(P.rscan(OFFLINE[name]))(*_order_args())
    ref = _orders_reference()
    for key in ref:
        P.assert_close(got[key], ref[key], RTOL, key)


# ----------------------------------------------------------------------------- while loops

N_WHILE = 23


def _while_loss(theta, w, schedule, n=N_WHILE):
    def body(state):
        i, u, v = state
        u = u + 0.05 * jnp.sin(theta * u) + 0.01 * w * jnp.sum(v)
        v = v * (1.0 - 0.02 * jnp.tanh(u[0]))
        return i + 1, u, v

    init = (jnp.int32(0), jnp.ones(3) * theta, jnp.ones(2))
    if schedule is None:
        _, u, v = jax.lax.fori_loop(0, n, lambda i, s: body(s), init)
    else:
        _, u, v = retrograde.while_loop(lambda s: s[0] < n, body, init, schedule=schedule)
    return jnp.sum(u**2) + jnp.sum(v * u[:2])


def _while_program(schedule):
    L = functools.partial(_while_loss, schedule=schedule)
    return P.jit(
        lambda t, w: {
            "grad": jax.grad(L, argnums=(0, 1))(t, w),
            "jvp": jax.jvp(L, (t, w), (1.0, 0.5)),
            "hessian": jax.hessian(L, argnums=(0, 1))(t, w),
            "hvp": jax.jvp(jax.grad(L), (t, w), (1.0, 0.0)),
            "vmap_grad": jax.vmap(jax.grad(L, argnums=(0, 1)), in_axes=(0, None))(
                jnp.array([0.5, 0.7, 0.9]), w
            ),
        }
    )


@functools.cache
def _while_reference():
    return _while_program(None)(0.7, 0.3)


@pytest.mark.parametrize("name", list(TWO_LEVEL))
def test_while_two_level(name):
    got = _while_program(TWO_LEVEL[name])(0.7, 0.3)
    ref = _while_reference()
    for key in ref:
        P.assert_close(got[key], ref[key], RTOL, key)
    assert offload_stats().reads.get(1, 0) > 0


def test_while_batched_predicate_and_traced_fori_loop():
    """vmap with a batched predicate (the loop runs until every element stops), and fori_loop
    with traced bounds (which runs while_loop)."""
    sched = TWO_LEVEL["host"]

    def g(theta):
        return retrograde.while_loop(
            lambda u: u < 10.0, lambda u: u * (1 + theta), 1.0, schedule=sched
        )

    th = np.array([0.1, 0.3, 0.7])
    n = np.ceil(np.log(10.0) / np.log1p(th))  # steps taken: d/dtheta (1 + theta)^n
    got = jax.jit(jax.vmap(jax.grad(g)))(jnp.asarray(th))
    P.assert_close(got, jnp.asarray(n * (1 + th) ** (n - 1)), RTOL, "vmap")

    def h(a, n, sched):
        return jnp.sum(
            retrograde.fori_loop(
                0, n, lambda i, u: u + 0.1 * jnp.sin(a * u), jnp.ones(2), schedule=sched
            )
            ** 2
        )

    got = jax.jit(jax.grad(h), static_argnums=2)(0.4, jnp.int32(17), sched)
    ref = jax.grad(
        lambda a: jnp.sum(
            jax.lax.fori_loop(0, 17, lambda i, u: u + 0.1 * jnp.sin(a * u), jnp.ones(2)) ** 2
        )
    )(0.4)
    P.assert_close(got, ref, RTOL, "fori_loop")


# ----------------------------------------------------------------------------- counts


@pytest.mark.parametrize("name", ["disk_chain", "host_exact", "three_levels", "host_all"])
def test_counts_equal_simulate(name, monkeypatch):
    """Evaluations ``plain + 1 + N``; writes and reads on every level (device ones counted by a
    callback on each device-slot access) equal ``simulate``'s."""
    schedule, n = OFFLINE[name], 30
    monkeypatch.setattr(_offload, "count_device", True)
    grad = jax.jit(jax.grad(functools.partial(_counted_scan_loss, schedule, n)))
    stats = rs.simulate(schedule, n)
    args = (jnp.float64(0.7), jnp.array([0.2, -0.3, 0.5]))
    for _ in range(2):  # running the program again counts the same
        offload_stats(reset=True)
        assert _count(grad, *args) == stats.plain + 1 + n
        st = offload_stats()
        for lvl, level in enumerate(stats.levels):
            far = level.storage != "device"
            writes = (st.writes if far else st.device_writes).get(lvl, 0)
            reads = (st.reads if far else st.device_reads).get(lvl, 0)
            assert (writes, reads) == (stats.writes[lvl], stats.reads[lvl]), (lvl, level)


def test_while_counts_equal_simulate():
    schedule, n = Online(3, slow=host(6)), 50
    count = [0]

    def f(theta):
        def body(st):
            jax.debug.callback(lambda: count.__setitem__(0, count[0] + 1))
            return st[0] + 1, st[1] + 0.001 * jnp.sin(theta * st[1])

        return jnp.sum(
            retrograde.while_loop(lambda st: st[0] < n, body, (0, jnp.ones(2)), schedule=schedule)[
                1
            ]
        )

    g = jax.jit(jax.grad(f))
    g(0.5).block_until_ready()
    offload_stats(reset=True)
    count[0] = 0
    g(0.5).block_until_ready()
    jax.effects_barrier()
    stats = rs.simulate(schedule, n)
    assert count[0] == stats.plain + stats.recorded
    st = offload_stats()
    assert (st.writes[1], st.reads[1]) == (stats.writes[1], stats.reads[1])


# ----------------------------------------------------------------------------- the schedule


@pytest.mark.parametrize("h", [1, 2, 3, 5, 16])
def test_thinning_twin(h):
    """The compiled placement makes the decisions of the Python rule."""
    from retrograde.schedules import thinning_slot

    rule = jax.jit(_offload.thinning_slot)
    held, held_j = [-1] * h, jnp.full((h,), -1, jnp.int32)
    for n in range(300):
        k = thinning_slot(n, held, h)
        assert int(rule(jnp.int32(n), held_j)) == k, (n, held)
        if k >= 0:
            held[k] = n
            held_j = held_j.at[k].set(n)


@pytest.mark.parametrize("d, h", [(1, 1), (1, 4), (2, 3), (2, 8), (4, 16)])
def test_two_level_online_schedule(d, h):
    """Valid for every N; evaluations ``2N + sum_i t(L_i, d)``; segments at most the spacing;
    within 12% of the best equal split (total evaluations) for N > h, h >= 8 and d >= 2."""
    from retrograde.schedules import revolve_optimum as _t
    from retrograde.schedules import thinning_spacing

    sched = Online(d, slow=host(h))
    for n in range(0, 400, 7):
        st = rs.simulate(sched, n)
        run = sched.start()
        for i in range(n):
            run.on_step(i)
        held = sorted(p for p in run._held if p >= 0) + [n]
        lengths = [b - a for a, b in itertools.pairwise(held)]
        assert st.plain == n + sum(_t(length, d) for length in lengths)
        assert st.reads[1] == len(lengths) and st.peak_slots[1] <= h
        if n:
            assert max(lengths) <= thinning_spacing(n - 1, h)
        if n > h >= 8 and d >= 2:
            best = sum(_t(n // h + (i < n % h), d) for i in range(h))
            assert st.evaluations <= 1.12 * (2 * n + best)


def test_levels_and_errors():
    with pytest.raises(ValueError, match="storage"):
        Level(2, storage="gpu")
    with pytest.raises(ValueError, match="directory"):
        Level(2, storage="host", directory="/tmp")
    with pytest.raises(ValueError, match="slot count"):
        Online(2, slow=Level(None, storage="host"))
    with pytest.raises(TypeError, match="Level"):
        Online(2, slow=3)
    assert repr(Online(4)) == "Online(snapshots=4)"
    with pytest.raises(ValueError, match="storage='host'"):
        retrograde.while_loop(
            lambda u: u < 2.0, lambda u: u * 1.5, 1.0, schedule=Online(2, slow=Level(4))
        )


# ----------------------------------------------------------------------------- lifetime


def test_vjp_function_reverses_once_and_eager_stores_are_released():
    sched = OFFLINE["host_exact"]
    L = lambda t: _counted_scan_loss(sched, 12, t, jnp.array([0.2, -0.3, 0.5]))
    _, pullback = jax.vjp(L, 0.7)
    assert offload_stats().open_stores == 1  # the forward sweep's store, awaiting the reversal
    (g,) = pullback(1.0)
    assert offload_stats().open_stores == 0
    P.assert_close(g, jax.grad(L)(0.7), RTOL)
    with pytest.raises(Exception, match="released"):
        jax.block_until_ready(pullback(1.0))
    # A forward sweep whose reversal never runs: released with its handle.
    _, pullback = jax.vjp(L, 0.7)
    del pullback
    gc.collect()
    assert offload_stats().open_stores == 0
    jax.block_until_ready(jax.jvp(L, (0.7,), (1.0,)))  # the tangent releases the snapshots
    assert offload_stats().open_stores == 0


def test_disk_files_are_never_visible(tmp_path):
    """During the run the disk level's data is in an unnamed file (an open descriptor to a
    deleted file); the directory stays empty before, during and after."""
    seen = []

    def look():
        fds = os.listdir("/proc/self/fd")
        links = [
            os.readlink(f"/proc/self/fd/{fd}")
            for fd in fds
            if os.path.exists(f"/proc/self/fd/{fd}")
        ]
        seen.append(
            (
                os.listdir(tmp_path),
                [x for x in links if x.startswith(str(tmp_path))],
                offload_stats().held_bytes,
            )
        )

    sched = MultiLevel([Level(2), disk(None, directory=tmp_path)])
    jax.block_until_ready(_gradient_calling(sched, look)(0.3))
    jax.effects_barrier()
    assert all(names == [] for names, _, _ in seen)
    held = [(links, nbytes) for _, links, nbytes in seen if nbytes]
    assert held and all(links and all("(deleted)" in x for x in links) for links, _ in held)
    assert os.listdir(tmp_path) == []


def _gradient_calling(sched, callback, ordered=False):
    """The compiled gradient of a 40-step loop whose step calls ``callback`` on the host."""

    def L(t):
        def step(u, x):
            jax.debug.callback(callback, ordered=ordered)
            return u + 0.1 * jnp.sin(t * u) * x, None

        return jnp.sum(
            retrograde.scan(step, jnp.ones(4), jnp.linspace(0.5, 1.5, 40), schedule=sched)[0] ** 2
        )

    return jax.jit(jax.grad(L))


def _failing_program(sched, fail_at):
    """A gradient whose step raises in its host callback at the ``fail_at``-th evaluation."""
    calls = [0]

    def boom():
        calls[0] += 1
        if calls[0] == fail_at:
            raise RuntimeError("boom in the step")

    return _gradient_calling(sched, boom)


def test_exception_in_the_step_leaves_no_file(tmp_path):
    sched = MultiLevel([Level(2), disk(None, directory=tmp_path)])
    with pytest.raises(Exception, match="boom in the step"):
        jax.block_until_ready(_failing_program(sched, fail_at=60)(0.3))
    jax.effects_barrier()
    assert os.listdir(tmp_path) == []
    assert release_offloaded() <= 1  # the aborted run's store (its unnamed file is closed)
    assert offload_stats().open_stores == 0


def test_keyboard_interrupt_leaves_no_file(tmp_path):
    """SIGINT while a gradient with a disk level runs (the child blocks in a step callback)."""
    script = textwrap.dedent(f"""
        import os, sys, time, jax, jax.numpy as jnp
        jax.config.update("jax_enable_x64", True)
        import retrograde
        from retrograde.schedules import Level, MultiLevel
        sched = MultiLevel([Level(2),
                            Level(None, 2, 2, storage="disk", directory={str(tmp_path)!r})])
        n = [0]
        def tick():
            n[0] += 1
            if n[0] == 50:
                print("ready", flush=True)
                time.sleep(1.0)
        def L(t):
            def step(u, x):
                jax.debug.callback(tick, ordered=False)
                return u + 0.1 * jnp.sin(t * u) * x, None
            return jnp.sum(retrograde.scan(step, jnp.ones(4), jnp.linspace(0.5, 1.5, 40),
                                           schedule=sched)[0] ** 2)
        try:
            while True:
                n[0] = 0
                jax.block_until_ready(jax.jit(jax.grad(L))(0.3))
        except BaseException as e:  # KeyboardInterrupt, or raised in the step's callback
            sys.exit(17 if "KeyboardInterrupt" in repr(e) + str(e) else 3)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    with _signals.defaults():
        child = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True
        )
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(2)
        assert child.wait(timeout=120) == 17
    finally:
        if child.poll() is None:
            child.kill()
    assert os.listdir(tmp_path) == []


def test_corrupted_disk_snapshot_is_an_error(tmp_path):
    """A disk snapshot that changed since its write fails its checksum on the next read."""
    sched = MultiLevel([Level(2), disk(None, directory=tmp_path)])
    calls = [0]

    def corrupt():
        calls[0] += 1
        if calls[0] == 45:  # in the reverse sweep: overwrite the start of every level's file
            for run in list(_offload_runs.RUNS.values()):
                for store in run.stores.values():
                    file = getattr(store.placement, "file", None)  # a disk level's unnamed file
                    if file is not None:
                        os.pwrite(file.fileno(), b"\x7f" * 64, 0)

    with pytest.raises(Exception, match="checksum"):
        jax.block_until_ready(_gradient_calling(sched, corrupt, ordered=True)(0.3))
    jax.effects_barrier()
    assert offload_stats().open_stores == 0  # a failed read releases its store


# ----------------------------------------------------------------------------- memory


def _temp_bytes(schedule, n=200, d=4000):
    if isinstance(schedule, Online):

        def L(t, u):
            _, u = retrograde.while_loop(
                lambda c: c[0] < n,
                lambda c: (c[0] + 1, c[1] + 0.01 * jnp.sin(t * c[1])),
                (0, u),
                schedule=schedule,
            )
            return jnp.sum(u**2)
    else:

        def L(t, u):
            u, _ = retrograde.scan(
                lambda u, _: (u + 0.01 * jnp.sin(t * u), None), u, None, length=n, schedule=schedule
            )
            return jnp.sum(u**2)

    compiled = jax.jit(jax.grad(L, (0, 1))).lower(0.5, jnp.ones(d)).compile()
    return compiled.memory_analysis().temp_size_in_bytes / (8 * d)


@pytest.mark.parametrize("kind", ["host", "disk", "online"])
def test_memory_holds_only_the_device_slots(kind):
    """The compiled gradient's temporaries do not grow with the offloaded slot count and stay
    within a few carries of ``Revolve`` with the device slots alone."""

    def make(h):
        if kind == "online":
            return Online(2, slow=host(h))
        return MultiLevel([Level(2), (host if kind == "host" else disk)(h)])

    small, large = _temp_bytes(make(4)), _temp_bytes(make(16))
    assert large == pytest.approx(small, rel=0.01), (small, large)
    device_only = _temp_bytes(MultiLevel([Level(2), Level(16, 1, 1)]))
    assert large < device_only - 10  # the 16 slots are not in device memory
    assert large <= _temp_bytes(rs.Revolve(2)) + 2


def _rss_script(directory, slots):
    return textwrap.dedent(f"""
        import resource, jax, jax.numpy as jnp
        jax.config.update("jax_enable_x64", True)
        import retrograde
        from retrograde.schedules import Level, MultiLevel
        M = 8 * 2**20  # 64 MiB of float64
        sched = MultiLevel([Level(2), Level({slots}, 0.5, 0.5, storage="disk",
                                              directory={directory!r})])
        def L(t, u):
            u, _ = retrograde.scan(lambda u, _: (u * (1 - 1e-3 * t) + 1e-3, None), u, None,
                                   length=40, schedule=sched)
            return jnp.sum(u)
        g = jax.jit(jax.grad(L, (0, 1)))
        u0 = jnp.ones(M)
        c = g.lower(0.5, u0).compile()
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        jax.block_until_ready(c(0.5, u0))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        st = retrograde.loops.offload_stats()
        print(base, peak, st.writes.get(1, 0),
              max(st.bytes_written.values()) // max(st.writes[1], 1))
    """)


@pytest.mark.slow
def test_peak_rss_below_the_disk_slots(tmp_path):
    """A 64 MiB state with 12 disk slots: the run's peak RSS grows by less than the 768 MiB the
    disk slots would take in RAM."""
    slots = 12
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-c", _rss_script(str(tmp_path), slots)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    base, peak, writes, per_write = map(int, out.stdout.split()[-4:])
    assert per_write == 64 * 2**20 and writes >= slots  # every disk slot is used
    print(
        f"peak RSS {(peak - base) / 2**20:.0f} MiB above the compiled program's start; the "
        f"{slots} disk slots hold {slots * 64} MiB"
    )
    assert peak - base < slots * 64 * 2**20, (base, peak)
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- planner and CLI


def test_plan_with_host_memory():
    from retrograde.planner import format_table, plan

    rows = plan(2000, memory="4MiB", state_size="1MiB", host_memory="32MiB", disk="1GiB")
    row = next(r for r in rows if r.name.startswith("MultiLevel(4 dev, 32 host"))
    stats = rs.simulate(row.schedule, 2000)
    assert [lvl.storage for lvl in row.schedule.levels] == ["device", "host", "disk"]
    assert (row.memory_slots, row.host_slots, row.disk_slots) == stats.peak_slots
    assert row.host_slots <= 32 and row.host_bytes == row.host_slots * 2**20
    assert row.cost == stats.cost and row.evaluations == stats.evaluations
    assert row.plain < rs.revolve_optimum(2000, 4)  # the host level pays off
    assert "peak host" in format_table(rows)
    with pytest.raises(ValueError, match="state_size"):
        plan(100, snapshots=4, host_memory="1GiB")
    with pytest.raises(ValueError, match="host_write_cost"):
        plan(100, memory="4MiB", state_size="1MiB", host_memory="8MiB", host_write_cost=-1)


def test_cli_plan_host_memory_and_calibrate(capsys):
    from retrograde.__main__ import main

    assert (
        main(
            [
                "plan",
                "--steps",
                "1000",
                "--state-size",
                "1MiB",
                "--memory",
                "4MiB",
                "--host-memory",
                "64MiB",
                "--disk",
                "1GiB",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "4 device slots" in out and "64 host slots" in out and "peak host" in out
    assert "MultiLevel(4 dev, 64 host, 1024 disk)" in out
    with pytest.raises(SystemExit):
        main(["plan", "--steps", "100", "-s", "3", "--host-memory", "1GiB"])
    assert "--host-memory needs --state-size" in capsys.readouterr().err
    assert (
        main(["calibrate", "--state-size", "64KiB", "--repeats", "2", "--step-time", "0.001"]) == 0
    )
    out = capsys.readouterr().out
    assert "host  write" in out and "disk  write" in out and "--host-write-cost" in out
