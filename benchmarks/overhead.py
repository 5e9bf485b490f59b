"""Per-step overhead of retrograde's loops at every size: the targets of issue #18.

Every ratio is measured side by side in one run: the functions compared are compiled first, then
called in turn over several round-robin repeats (so that load from other processes slows all of
them alike), at least 2 seconds of them per case (``--min-time``), so that a case of a millisecond
gets hundreds of calls; the tables give the minimum and median times and the targets use ratios
of medians.
Memory is XLA's ``temp_size_in_bytes`` of the compiled function. Cases (``--cases``):

- ``vmap``: ``N = 200`` steps of ``u + dt * tanh(W @ u)``, 1000 float32, a shared 1000 x 1000
  ``W`` closed over (not batched), vmapped over 32 initial states; ``retrograde.scan`` with
  ``Revolve(10)`` against ``jax.lax.scan``. Targets: the vmapped loss's temp memory at most 2x
  ``lax.scan``'s plus the batched snapshots (``10 x 32 x 1000`` floats); ``vmap(grad)`` (in the
  initial states) at most 2.5x ``lax.scan``'s time.
- ``long``: ``N = 10000`` steps of ``u + dt * tanh(theta * u)``, 256 float32, gradient in
  ``theta``: ``StoreAll`` at most 1.15x ``lax.scan``'s time; ``Revolve(s)`` with no more memory
  than the nested 100 x 100 ``jax.checkpoint`` scans (``s`` is the largest that fits, found by
  compiling) at most 1.15x their time; ``Revolve(16)`` at most 2.2x their time.
- ``while``: ``retrograde.while_loop`` with ``Online(88)``, 128 float32, 1600 steps, gradient in
  ``theta``: at most 1.3x ``retrograde.fori_loop`` with ``Revolve(88)``.
- ``hvp``: Hessian-vector products (``jvp`` of ``grad`` in the initial state) through ``N = 1000``
  steps of a pseudo-spectral Kuramoto-Sivashinsky step (128 points, float64, semi-implicit Euler
  with ``jnp.fft``), default schedule: at most 1.5x the nested sqrt(N) remat's HVP time
  (``lax.scan``'s and the first-order gradients are shown too).
- ``diffrax``: ``CheckpointAdjoint`` against ``RecursiveCheckpointAdjoint`` on a small neural ODE
  (4-dim state, 4-32-4 tanh MLP, Tsit5, float64, ``SaveAt`` at 50 times), 1000 constant steps
  and a ``PIDController(rtol=1e-6, atol=1e-6)`` solve: first-order gradient at most 1.05x.
- ``compile``: tracing (``jit(f).lower``) and compiling ``retrograde.scan`` (default schedule,
  4 float32), its gradient and ``lax.scan`` at ``N = 1e3`` and ``1e6`` (``--huge``: also
  ``1e8``), each in its own process with a time and memory limit (``timeout``, ``over memory``):
  trace + compile at ``N`` within 2x of ``N = 1e3``, the forward within 2x ``lax.scan``'s, and the
  peak RSS growth while tracing and compiling flat in ``N``.

Outside ``--quick``, ``long``, ``while`` and ``hvp`` are run again at a large step (100,000 floats
for ``long``, at ``N = 1000``, and ``while``; 2048 points for ``hvp``), shown in the last column
of the targets. The large-carry first-order case (``N = 1000``, 100,000 floats, which must not get
slower) is ``benchmarks/scan.py``'s, not repeated here. Results are checked against the reference
of each table (relative error column). ``--clock cpu`` times the process's CPU time instead of
wall time: on a busy machine it varies far less.

    python benchmarks/overhead.py              # everything; ~10-15 minutes on 2 cores
    python benchmarks/overhead.py --quick      # fewer repeats, no large step, N <= 1e5; ~2-3 min
    python benchmarks/overhead.py --markdown   # the tables as markdown
    python benchmarks/overhead.py --cases long,while --repeats 21 --clock cpu
    python benchmarks/overhead.py --cases compile --huge   # adds N = 1e8 (does not finish today)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import retrograde  # noqa: E402
from retrograde.schedules import Online, Revolve, StoreAll  # noqa: E402

from _common import (  # noqa: E402
    largest_fitting,
    nested_remat,
    nested_shape,
    prepare,
    print_table,
    temp_bytes,
    time_round_robin,
)

CASES = ("vmap", "long", "while", "hvp", "diffrax", "compile")
MiB = 2**20


# ------------------------------------------------------------------------------ measuring
@dataclasses.dataclass
class Result:
    temp: int  # bytes
    t_min: float  # seconds
    t_med: float
    value: np.ndarray
    calls: int  # timed calls


CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCK["wall"]  # set by --clock


MIN_TIME = 2.0  # seconds of timed rounds per case at least (--min-time)


def measure(fns, args, repeats):
    """Name -> :class:`Result` of each ``jit(fn)(*args)``: all compiled and warmed up first, then
    timed round-robin, ``repeats`` rounds and at least ``MIN_TIME`` seconds."""
    prepared = {}
    for name, fn in fns.items():
        prepared[name] = prepare(fn, *args)
        print(
            f"  compiled {name}: temp {prepared[name][3] / MiB:.2f} MiB, {prepared[name][2]:.1f} s",
            flush=True,
        )
    times = time_round_robin({k: p[0] for k, p in prepared.items()}, args, repeats, clock, MIN_TIME)
    return {
        k: Result(p[3], min(times[k]), statistics.median(times[k]), _flat(p[1]), len(times[k]))
        for k, p in prepared.items()
    }


def calls(res) -> int:
    """How many timed calls each function of a :func:`measure` result had."""
    return min(r.calls for r in res.values())


def _flat(tree):
    return np.concatenate(
        [np.ravel(np.asarray(x, np.float64)) for x in jax.tree_util.tree_leaves(tree)]
    )


def rel_err(value, ref) -> float:
    return float(np.linalg.norm(value - ref) / max(np.linalg.norm(ref), 1e-300))


@dataclasses.dataclass
class Target:
    case: str
    what: str
    ratio: float | None
    limit: float
    detail: str
    large: float | None = None  # the same ratio at a large step

    @property
    def verdict(self) -> str:
        """``MISS`` also when there is no ratio: a case that did not finish within its limits."""
        return "PASS" if self.ratio is not None and self.ratio <= self.limit else "MISS"


def show_results(title, res, ref, markdown, extra=None):
    """One case's table: every method against the reference ``ref`` (a name in ``res``)."""
    header = ["method", "temp MiB", "min ms", "median ms", f"median / {ref}", f"rel. err vs {ref}"]
    if extra:
        header.append(extra[0])
    rows = []
    for name, r in res.items():
        row = [
            name,
            f"{r.temp / MiB:.2f}",
            f"{r.t_min * 1e3:.2f}",
            f"{r.t_med * 1e3:.2f}",
            f"{r.t_med / res[ref].t_med:.2f}",
            "-" if name == ref else f"{rel_err(r.value, res[ref].value):.1e}",
        ]
        if extra:
            row.append(extra[1].get(name, ""))
        rows.append(row)
    print_table(title, header, rows, markdown)


def ratio_of(res, a, b) -> float:
    return res[a].t_med / res[b].t_med


# ------------------------------------------------------------------------------ vmap
def case_vmap(repeats, markdown, large=False):
    n, batch, dim, s = 200, 32, 1000, 10
    rng = np.random.default_rng(0)
    w = jnp.asarray((rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32))
    u0 = jnp.asarray(rng.standard_normal((batch, dim), dtype=np.float32))

    def step_fn(w):
        return lambda u, _: (u + 0.05 * jnp.tanh(w @ u), None)

    loops = {
        f"retrograde Revolve({s})": lambda w, u: retrograde.scan(
            step_fn(w), u, length=n, schedule=Revolve(s)
        )[0],
        "lax.scan": lambda w, u: jax.lax.scan(step_fn(w), u, length=n)[0],
    }
    fns = {}
    for name, run in loops.items():

        def loss(u, w, run=run):
            return jnp.mean(run(w, u) ** 2)

        fns[f"{name}: loss"] = lambda w, u, loss=loss: jax.vmap(loss, (0, None))(u, w)
        fns[f"{name}: grad"] = lambda w, u, loss=loss: jax.vmap(jax.grad(loss), (0, None))(u, w)
    res = measure(fns, (w, u0), repeats)
    retro = f"retrograde Revolve({s})"
    for kind in ("loss", "grad"):
        show_results(
            f"vmap: {kind}, N = {n}, {batch} x {dim} float32 states, a {dim} x {dim} "
            f"weight closed over, median of {calls(res)}",
            {k: v for k, v in res.items() if k.endswith(kind)},
            f"lax.scan: {kind}",
            markdown,
        )
    snaps = s * batch * dim * 4
    bound = 2 * res["lax.scan: loss"].temp + snaps
    temp = res[f"{retro}: loss"].temp
    return [
        Target(
            "vmap",
            "loss temp memory / (2 x lax.scan's + batched snapshots)",
            temp / bound,
            1.0,
            f"{temp / MiB:.2f} MiB vs 2 x {res['lax.scan: loss'].temp / MiB:.2f} + "
            f"{snaps / MiB:.2f} MiB",
        ),
        Target(
            "vmap",
            f"vmap(grad) time / lax.scan's ({retro})",
            ratio_of(res, f"{retro}: grad", "lax.scan: grad"),
            2.5,
            f"{res[f'{retro}: grad'].t_med * 1e3:.0f} ms vs "
            f"{res['lax.scan: grad'].t_med * 1e3:.0f} ms",
        ),
    ]


# ------------------------------------------------------------------------------ long
def case_long(repeats, markdown, large=False):
    n, carry = (1000, 100_000) if large else (10_000, 256)
    cb = carry * 4

    def step_fn(theta):
        return lambda u, _: (u + 0.01 * jnp.tanh(theta * u), None)

    def retro(schedule):
        return lambda theta, u0: jnp.mean(
            retrograde.scan(step_fn(theta), u0, length=n, schedule=schedule)[0] ** 2
        )

    def lax_loss(theta, u0):
        return jnp.mean(jax.lax.scan(step_fn(theta), u0, length=n)[0] ** 2)

    def nested_loss(theta, u0):
        return jnp.mean(nested_remat(step_fn(theta), u0, n) ** 2)

    args = (jnp.float32(0.7), jnp.asarray(np.linspace(-2.0, 2.0, carry, dtype=np.float32)))
    nested_name = "nested remat ({} x {})".format(*nested_shape(n))
    s_mem = largest_fitting(
        lambda s: jax.grad(retro(Revolve(s))), args, temp_bytes(jax.grad(nested_loss), args), cb
    )
    fns = {
        "lax.scan": jax.grad(lax_loss),
        nested_name: jax.grad(nested_loss),
        "retrograde StoreAll()": jax.grad(retro(StoreAll())),
        f"retrograde Revolve({s_mem})": jax.grad(retro(Revolve(s_mem))),
        "retrograde Revolve(16)": jax.grad(retro(Revolve(16))),
    }
    res = measure(fns, args, repeats)
    show_results(
        f"long: gradient, N = {n}, carry = {carry} float32, median of {calls(res)}",
        res,
        "lax.scan",
        markdown,
        extra=("temp / carry", {k: f"{r.temp / cb:.1f}" for k, r in res.items()}),
    )
    rn = res[nested_name]
    return [
        Target(
            "long",
            "StoreAll() time / lax.scan's",
            ratio_of(res, "retrograde StoreAll()", "lax.scan"),
            1.15,
            f"temp {res['retrograde StoreAll()'].temp / MiB:.2f} vs "
            f"{res['lax.scan'].temp / MiB:.2f} MiB",
        ),
        Target(
            "long",
            f"Revolve(s), memory <= nested's (s = {s_mem}), time / {nested_name}'s",
            ratio_of(res, f"retrograde Revolve({s_mem})", nested_name),
            1.15,
            f"temp {res[f'retrograde Revolve({s_mem})'].temp / MiB:.3f} vs {rn.temp / MiB:.3f} MiB",
        ),
        Target(
            "long",
            f"Revolve(16) time / {nested_name}'s",
            ratio_of(res, "retrograde Revolve(16)", nested_name),
            2.2,
            f"temp {res['retrograde Revolve(16)'].temp / MiB:.3f} vs {rn.temp / MiB:.3f} MiB",
        ),
    ]


# ------------------------------------------------------------------------------ while
def case_while(repeats, markdown, large=False):
    n, carry, s = 1600, (100_000 if large else 128), 88

    def body(theta, u):
        return u + 0.01 * jnp.tanh(theta * u)

    def while_loss(theta, u0):
        _, u = retrograde.while_loop(
            lambda c: c[0] < n,
            lambda c: (c[0] + 1, body(theta, c[1])),
            (jnp.int32(0), u0),
            schedule=Online(s),
        )
        return jnp.mean(u**2)

    def fori_loss(theta, u0):
        u = retrograde.fori_loop(0, n, lambda i, u: body(theta, u), u0, schedule=Revolve(s))
        return jnp.mean(u**2)

    def lax_loss(theta, u0):
        return jnp.mean(jax.lax.fori_loop(0, n, lambda i, u: body(theta, u), u0) ** 2)

    args = (jnp.float32(0.7), jnp.asarray(np.linspace(-2.0, 2.0, carry, dtype=np.float32)))
    fori = f"retrograde.fori_loop Revolve({s})"
    fns = {
        fori: jax.grad(fori_loss),
        f"retrograde.while_loop Online({s})": jax.grad(while_loss),
        "lax.fori_loop": jax.grad(lax_loss),
    }
    res = measure(fns, args, repeats)
    show_results(
        f"while: gradient, {n} steps, carry = {carry} float32, median of {calls(res)}",
        res,
        fori,
        markdown,
    )
    return [
        Target(
            "while",
            f"while_loop Online({s}) time / fori_loop Revolve({s})'s",
            ratio_of(res, f"retrograde.while_loop Online({s})", fori),
            1.3,
            f"{res[f'retrograde.while_loop Online({s})'].t_med * 1e3:.1f} ms vs "
            f"{res[fori].t_med * 1e3:.1f} ms",
        )
    ]


# ------------------------------------------------------------------------------ hvp
def ks_step(points, dt=0.01, length=22.0):
    """One semi-implicit Euler step of the Kuramoto-Sivashinsky equation
    ``u_t = -u u_x - u_xx - u_xxxx`` on a periodic domain, pseudo-spectral (``rfft``)."""
    k = 2 * np.pi / length * np.fft.rfftfreq(points, 1.0 / points)
    ik = jnp.asarray(0.5j * k)
    inv = jnp.asarray(1.0 / (1.0 - dt * (k**2 - k**4)))

    def step(u, _):
        uh = jnp.fft.rfft(u) - dt * ik * jnp.fft.rfft(u * u)
        return jnp.fft.irfft(uh * inv, points), None

    return step


def case_hvp(repeats, markdown, large=False):
    n, points = 1000, (2048 if large else 128)
    step = ks_step(points)
    x = np.linspace(0.0, 22.0, points, endpoint=False)
    u0 = jnp.asarray(np.cos(x / 11.0) * (1.0 + np.sin(x / 11.0)))
    v = jnp.asarray(np.random.default_rng(0).standard_normal(points))
    loops = {
        f"retrograde default ({retrograde.default_schedule(n)!r})": lambda u: retrograde.scan(
            step, u, length=n
        )[0],
        "nested remat ({} x {})".format(*nested_shape(n)): lambda u: nested_remat(step, u, n),
        "lax.scan": lambda u: jax.lax.scan(step, u, length=n)[0],
    }
    fns = {}
    for name, run in loops.items():
        grad = jax.grad(lambda u, run=run: jnp.mean(run(u) ** 2))
        fns[f"{name}: grad"] = lambda u, v, grad=grad: grad(u)
        fns[f"{name}: HVP"] = lambda u, v, grad=grad: jax.jvp(grad, (u,), (v,))[1]
    res = measure(fns, (u0, v), repeats)
    names = list(loops)
    for kind in ("grad", "HVP"):
        show_results(
            f"hvp: {kind}, Kuramoto-Sivashinsky, {points} points float64, N = {n}, "
            f"median of {calls(res)}",
            {k: r for k, r in res.items() if k.endswith(kind)},
            f"lax.scan: {kind}",
            markdown,
        )
    retro, nested = names[0], names[1]
    return [
        Target(
            "hvp",
            f"HVP time / {nested}'s (default schedule)",
            ratio_of(res, f"{retro}: HVP", f"{nested}: HVP"),
            1.5,
            f"HVP / lax.scan's: retrograde "
            f"{ratio_of(res, f'{retro}: HVP', 'lax.scan: HVP'):.2f}, nested "
            f"{ratio_of(res, f'{nested}: HVP', 'lax.scan: HVP'):.2f}",
        )
    ]


# ------------------------------------------------------------------------------ diffrax
def case_diffrax(repeats, markdown, large=False):
    # Imported here: the compile case's processes need neither. The problem is issue #33's small
    # ODE, the one of ``diffrax_adjoints.py --small``.
    import diffrax
    from diffrax_adjoints import SMALL_RUNS, small_loss

    from retrograde.diffrax import CheckpointAdjoint

    def make_loss(adjoint, **kw):
        return small_loss(adjoint, with_steps=True, **kw)[0]

    params = small_loss(None, **next(iter(SMALL_RUNS.values())))[1]
    runs = SMALL_RUNS
    targets = []
    for label, kw in runs.items():
        steps = int(jax.jit(make_loss(diffrax.RecursiveCheckpointAdjoint(), **kw))(params)[1])
        fns = {
            name: jax.grad(lambda p, loss=make_loss(adj, **kw): loss(p)[0])  # noqa: B008 - binds this adjoint's loss
            for name, adj in (
                ("CheckpointAdjoint", CheckpointAdjoint()),
                ("RecursiveCheckpointAdjoint", diffrax.RecursiveCheckpointAdjoint()),
            )
        }
        res = measure(fns, (params,), repeats)
        ours, theirs = res["CheckpointAdjoint"], res["RecursiveCheckpointAdjoint"]
        show_results(
            f"diffrax: gradient, {label} ({steps} steps), median of {calls(res)}",
            res,
            "RecursiveCheckpointAdjoint",
            markdown,
        )
        targets.append(
            Target(
                "diffrax",
                f"CheckpointAdjoint time / Recursive's, {label}",
                ours.t_med / theirs.t_med,
                1.05,
                f"{steps} steps, ratio of minima {ours.t_min / theirs.t_min:.2f}",
            )
        )
    return targets


# ------------------------------------------------------------------------------ compile
COMPILE_FNS = (
    "retrograde.scan forward",
    "retrograde.scan grad",
    "lax.scan forward",
    "lax.scan grad",
)


def compile_child(n: int, which: str) -> None:
    """In a fresh process: trace and compile one function at ``n`` steps; print a JSON line with
    the seconds of each and the peak RSS growth (bytes) over the RSS before tracing."""

    def step(u, _):
        return u + 0.01 * jnp.tanh(u), None

    def fwd(u0):
        return jnp.sum(retrograde.scan(step, u0, length=n)[0])

    def lax_fwd(u0):
        return jnp.sum(jax.lax.scan(step, u0, length=n)[0])

    fn = dict(zip(COMPILE_FNS, (fwd, jax.grad(fwd), lax_fwd, jax.grad(lax_fwd))))[which]
    u0 = jnp.ones(4, jnp.float32)
    jax.block_until_ready(jax.jit(lambda x: x + 1)(u0))  # the backend, before the baseline
    retrograde.loops  # noqa: B018 (imported on first use: the import is not tracing)
    with open("/proc/self/clear_refs", "w") as fh:  # resets the peak (VmHWM) to the RSS now
        fh.write("5")
    r0 = _vm("self", "VmRSS")
    t0 = time.perf_counter()
    lowered = jax.jit(fn).lower(u0)
    t1 = time.perf_counter()
    r1 = _vm("self", "VmHWM")
    lowered.compile()
    t2 = time.perf_counter()
    print(
        json.dumps(
            dict(trace=t1 - t0, compile=t2 - t1, rss_trace=r1 - r0, rss=_vm("self", "VmHWM") - r0)
        )
    )


def run_child(n: int, which: str, timeout: float, mem_limit: int):
    """Run :func:`compile_child` in a subprocess; kill it past ``timeout`` seconds or
    ``mem_limit`` bytes of RSS. Returns the child's dict, or a string saying why not."""
    cmd = [sys.executable, os.path.abspath(__file__), "--compile-child", str(n), which]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0, why = time.monotonic(), None
    while proc.poll() is None:
        if time.monotonic() - t0 > timeout:
            why = f"timeout ({timeout:.0f} s)"
        elif _vm(proc.pid, "VmRSS") > mem_limit:
            why = f"over {mem_limit / 2**30:g} GiB"
        if why:
            proc.kill()
            proc.communicate()
            return why
        time.sleep(0.1)
    out, err = proc.communicate()
    if proc.returncode != 0:
        return f"failed: {(err.strip().splitlines() or ['?'])[-1][:80]}"
    return json.loads(out.strip().splitlines()[-1])


def _vm(pid, field: str) -> int:
    """A ``Vm*`` field of ``/proc/<pid>/status`` in bytes (0 once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def case_compile(ns, timeout, mem_limit, markdown):
    res = {}
    for n in ns:
        for which in COMPILE_FNS:
            res[n, which] = r = run_child(n, which, timeout, mem_limit)
            print(f"  N = {n:.0e} {which}: " + _compile_detail(r), flush=True)

    def total(n, which):
        r = res[n, which]
        return None if isinstance(r, str) else r["trace"] + r["compile"]

    def div(a, b):
        return None if a is None or b is None else a / b

    def fmt(x):
        return "-" if x is None else f"{x:.2f}"

    rows = []
    for (n, which), r in res.items():
        if isinstance(r, str):
            rows.append([f"{n:.0e}", which, r, "", "", "", "", ""])
            continue
        twin = "lax.scan " + which.split()[-1]
        rows.append(
            [
                f"{n:.0e}",
                which,
                f"{r['trace']:.2f}",
                f"{r['compile']:.2f}",
                f"{r['rss_trace'] / MiB:.0f}",
                f"{r['rss'] / MiB:.0f}",
                fmt(div(total(n, which), total(ns[0], which))),
                fmt(div(total(n, which), total(n, twin))),
            ]
        )
    print_table(
        f"compile: trace and compile, 4 float32, default schedule (each in a fresh "
        f"process, limits {timeout:g} s and {mem_limit / 2**30:g} GiB; RSS: peak "
        "growth while tracing, and to the end of compiling)",
        [
            "N",
            "function",
            "trace s",
            "compile s",
            "RSS trace MiB",
            "RSS total MiB",
            f"time / N={ns[0]:.0e}'s",
            "time / lax.scan's",
        ],
        rows,
        markdown,
        left=2,
    )

    fwd, grad, lax_fwd = COMPILE_FNS[:3]
    targets = []
    for n in ns[1:]:
        for which in (fwd, grad):
            targets.append(
                Target(
                    "compile",
                    f"{which} trace + compile, N = {n:.0e} / N = {ns[0]:.0e}",
                    div(total(n, which), total(ns[0], which)),
                    2.0,
                    _compile_detail(res[n, which]),
                )
            )
    for n in ns:
        targets.append(
            Target(
                "compile",
                f"forward trace + compile / lax.scan's, N = {n:.0e}",
                div(total(n, fwd), total(n, lax_fwd)),
                2.0,
                _compile_detail(res[n, fwd]),
            )
        )
    r0 = res[ns[0], grad]
    for n in ns[1:]:
        # Flat: at most 16 MiB (allocator noise) more than at the smallest N.
        r = res[n, grad]
        ok = not isinstance(r, str) and not isinstance(r0, str)
        targets.append(
            Target(
                "compile",
                f"grad peak RSS growth, N = {n:.0e} / (N = {ns[0]:.0e}'s + 16 MiB)",
                r["rss"] / (r0["rss"] + 16 * MiB) if ok else None,
                1.0,
                f"{r['rss'] / MiB:.0f} vs {r0['rss'] / MiB:.0f} MiB"
                if ok
                else _compile_detail(r if isinstance(r, str) else r0),
            )
        )
    return targets


def _compile_detail(r):
    return (
        r
        if isinstance(r, str)
        else (
            f"trace {r['trace']:.2f} s + compile {r['compile']:.2f} "
            f"s, RSS +{r['rss'] / MiB:.0f} MiB"
        )
    )


# ------------------------------------------------------------------------------ main
def show_targets(targets, markdown, with_large):
    header = ["case", "target", "ratio", "limit", "verdict", "detail"]
    if with_large:
        header.append("at a large step")
    rows = []
    for t in targets:
        row = [
            t.case,
            t.what,
            "-" if t.ratio is None else f"{t.ratio:.2f}",
            f"{t.limit:g}",
            t.verdict,
            t.detail,
        ]
        if with_large:
            row.append("-" if t.large is None else f"{t.large:.2f}")
        rows.append(row)
    kind = "CPU" if clock is CLOCK["cpu"] else "wall"
    print_table(
        f"Targets of issue #18 (ratios of medians, {kind} time; jax {jax.__version__}, "
        f"{jax.devices()[0].platform})",
        header,
        rows,
        markdown,
        left=2,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"subset of {','.join(CASES)}")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="fewer repeats, no large-step column, compile at N <= 1e5 (~2-3 min)",
    )
    ap.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    ap.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed rounds (default 7, diffrax 11; --quick: 3, diffrax 5)",
    )
    ap.add_argument(
        "--min-time",
        type=float,
        default=None,
        help="seconds of timed rounds per case at least, so that fast cases get "
        "many rounds (default 2; --quick: 1)",
    )
    ap.add_argument(
        "--clock",
        choices=tuple(CLOCK),
        default="wall",
        help="wall time (default) or the process's CPU time, steadier on a busy machine",
    )
    ap.add_argument("--huge", action="store_true", help="compile case: also N = 1e8")
    ap.add_argument(
        "--compile-timeout",
        type=float,
        default=120.0,
        help="seconds per compile case (default 120)",
    )
    ap.add_argument(
        "--compile-memory", type=float, default=4.0, help="GiB of RSS per compile case (default 4)"
    )
    ap.add_argument("--compile-child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.compile_child:
        compile_child(int(a.compile_child[0]), a.compile_child[1])
        return 0
    global clock, MIN_TIME
    clock = CLOCK[a.clock]
    MIN_TIME = a.min_time if a.min_time is not None else (1.0 if a.quick else 2.0)
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; choose from {list(CASES)}")
    reps = a.repeats or (3 if a.quick else 7)
    large = not a.quick
    ns = [1000, 100_000] if a.quick else [1000, 1_000_000] + ([100_000_000] if a.huge else [])
    if a.huge and a.quick:
        ns.append(100_000_000)
    t_start = time.perf_counter()
    targets = []
    for case in cases:
        print(f"  == {case}", flush=True)
        if case == "compile":
            targets += case_compile(
                ns, a.compile_timeout, int(a.compile_memory * 2**30), a.markdown
            )
            continue
        fn = globals()[f"case_{case}"]
        r = a.repeats or ((5 if a.quick else 11) if case == "diffrax" else reps)
        found = fn(r, a.markdown)
        if large and case in ("long", "while", "hvp"):
            print(f"  == {case}, large step", flush=True)
            for t, big in zip(found, fn(max(3, r // 2), a.markdown, large=True)):
                t.large = big.ratio
        targets += found
    show_targets(targets, a.markdown, large)
    print()
    note = (
        "The large-carry first-order case (N = 1000, 100,000 float32) is benchmarks/scan.py's "
        f"(must not get slower). Total {time.perf_counter() - t_start:.0f} s."
    )
    print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
