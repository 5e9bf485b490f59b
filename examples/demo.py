"""retrograde in two minutes: what checkpointed differentiation buys you.

    make demo                    # or: .venv/bin/python examples/demo.py

Three parts, each a few lines of output:

1. A neural ODE (diffrax, adaptive Tsit5) differentiated twice, a gradient of a gradient, with
   ``retrograde.diffrax.CheckpointAdjoint``: same numbers as ``diffrax.DirectAdjoint``, a fraction
   of its memory.
2. A 10,000-step ``retrograde.scan`` under ``Revolve``: the gradient in a small fraction of
   ``jax.lax.scan``'s memory, with exactly the proven-optimal number of step evaluations.
3. A host-driven NumPy loop with a hand-written adjoint, snapshots in RAM and on disk
   (``MultiLevel``), checked against finite differences.

It also writes ``demo_schedule.png``: the schedule of part 2 drawn for N = 60 steps.
Memory figures are XLA's temporary buffers of the compiled function
(``jax.jit(f).lower(...).compile().memory_analysis().temp_size_in_bytes``).
"""

import os
import tempfile
import time

import jax

jax.config.update("jax_enable_x64", True)  # float64: derivatives agree to ~1e-12

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import retrograde  # noqa: E402
import retrograde.host as rh  # noqa: E402
from retrograde.planner import plot_schedule  # noqa: E402
from retrograde.schedules import (  # noqa: E402
    Level,
    MultiLevel,
    Online,
    Revolve,
    revolve_optimum,
    simulate,
)

T_START = time.perf_counter()


def heading(text):
    print(f"\n== {text} " + "=" * max(0, 76 - len(text)), flush=True)


def mib(n_bytes):
    return f"{n_bytes / 2**20:.2f} MiB"


def compiled(f, *args):
    """``(compiled f, XLA's temporary memory in bytes)``: compile once, run the same program."""
    c = jax.jit(f).lower(*args).compile()
    return c, c.memory_analysis().temp_size_in_bytes


def rel_err(x, ref):
    x = np.concatenate([np.ravel(np.asarray(v)) for v in jax.tree_util.tree_leaves(x)])
    ref = np.concatenate([np.ravel(np.asarray(v)) for v in jax.tree_util.tree_leaves(ref)])
    return float(np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1e-300))


# ------------------------------------------------------------------------------------------------
# 1. Neural ODE, gradient of a gradient, CheckpointAdjoint vs DirectAdjoint
# ------------------------------------------------------------------------------------------------
def neural_ode():
    heading("1. Neural ODE: gradient of a gradient through diffrax.diffeqsolve")
    try:
        import diffrax
        import equinox as eqx

        from retrograde.diffrax import CheckpointAdjoint
    except ImportError as exc:
        print(f"retrograde.diffrax is not available here ({exc}); skipping this part.")
        return

    t0 = time.perf_counter()
    batch, dim, width, t1, max_steps = 32, 2, 16, 5.0, 512
    model = eqx.nn.MLP(dim, dim, width, 1, activation=jnp.tanh, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_array)
    y0 = jnp.stack([jnp.linspace(-1.0, 1.0, batch), jnp.linspace(0.5, -0.5, batch)], axis=1)
    ts = jnp.linspace(0.0, t1, 50)

    def solve(params, y0, adjoint):
        net = eqx.combine(params, static)

        def vector_field(t, y, args):  # a learned field plus damping and a forcing
            return jax.vmap(net)(y) - 0.1 * y + jnp.sin(3.0 * t)

        return diffrax.diffeqsolve(
            diffrax.ODETerm(vector_field),
            diffrax.Tsit5(),
            0.0,
            t1,
            0.05,
            y0,
            saveat=diffrax.SaveAt(ts=ts),
            stepsize_controller=diffrax.PIDController(1e-7, 1e-7),
            adjoint=adjoint,
            max_steps=max_steps,
        )

    def loss(params, y0, adjoint):
        return jnp.mean(solve(params, y0, adjoint).ys ** 2)

    def grad_of_grad(params, y0, adjoint):
        # d/d(params) of |d loss / d y0|^2: the outer gradient goes through the inner one.
        def inner(params):
            return jnp.sum(jax.grad(loss, argnums=1)(params, y0, adjoint) ** 2)

        return jax.grad(inner)(params)

    n_steps = int(
        jax.jit(lambda p, y: solve(p, y, diffrax.DirectAdjoint()).stats["num_steps"])(params, y0)
    )
    print(
        f"MLP {dim}-{width}-{dim} vector field, batch of {batch} initial values, Tsit5 + PID "
        f"(rtol 1e-7): {n_steps} adaptive steps, max_steps={max_steps};"
    )
    print("d/d(params) |d loss/d y0|^2, compiled once per adjoint (compiling dominates the time):")
    results = {}
    # Online(16): 16 snapshots of the solver state, placed as the adaptive steps arrive (the
    # default, Online(s) with (s+1)(s+2)/2 >= max_steps, matches RecursiveCheckpointAdjoint's).
    for name, adjoint in [
        ("CheckpointAdjoint(Online(16))", CheckpointAdjoint(schedule=Online(16))),
        ("diffrax.DirectAdjoint()", diffrax.DirectAdjoint()),
    ]:
        tc = time.perf_counter()
        f, mem = compiled(lambda p, y, adjoint=adjoint: grad_of_grad(p, y, adjoint), params, y0)
        tc, tr = time.perf_counter() - tc, time.perf_counter()
        results[name] = jax.block_until_ready(f(params, y0))
        tr = time.perf_counter() - tr
        print(f"  {name:<29} temp memory {mib(mem):>10}   (compile {tc:.0f} s, run {tr:.1f} s)")
        if name.startswith("Check"):
            mem_ck = mem
    err = rel_err(results["CheckpointAdjoint(Online(16))"], results["diffrax.DirectAdjoint()"])
    print(
        f"  results agree to {err:.1e} (max relative difference); CheckpointAdjoint needs "
        f"{mem_ck / mem:.1%} of DirectAdjoint's memory"
    )
    print(
        f"  (DirectAdjoint's memory grows with max_steps; CheckpointAdjoint's is set by its 16 "
        f"snapshots)"
        f"   [{time.perf_counter() - t0:.0f} s]"
    )


# ------------------------------------------------------------------------------------------------
# 2. A long scan: Revolve against jax.lax.scan, and the evaluation count against the optimum
# ------------------------------------------------------------------------------------------------
N_SCAN, CARRY, SLOTS = 10_000, 1_000, 20
SCAN_SCHEDULE = Revolve(SLOTS)
CALLS = []


def long_scan():
    heading(f"2. A {N_SCAN:,}-step retrograde.scan with {SCAN_SCHEDULE} vs jax.lax.scan")
    t0 = time.perf_counter()
    u0 = jnp.linspace(-1.0, 1.0, CARRY)

    def make_loss(scan, count=False):
        def loss(theta, u0):
            def step(u, _):
                if count:
                    jax.debug.callback(lambda: CALLS.append(1), ordered=False)
                return u + 0.01 * jnp.tanh(theta * u + 0.1), None

            u, _ = scan(step, u0, None, length=N_SCAN)
            return jnp.mean(u**2)

        return loss

    def retro_scan(step, init, xs, length):
        return retrograde.scan(step, init, xs, length=length, schedule=SCAN_SCHEDULE)

    g_retro = jax.grad(make_loss(retro_scan), argnums=(0, 1))
    g_lax = jax.grad(make_loss(jax.lax.scan), argnums=(0, 1))
    (g_retro, mem_retro), (g_lax, mem_lax) = compiled(g_retro, 1.3, u0), compiled(g_lax, 1.3, u0)
    err = rel_err(g_retro(1.3, u0), g_lax(1.3, u0))
    print(f"carry {CARRY} float64 ({CARRY * 8 / 1024:.0f} KiB); gradient w.r.t. (theta, u0)")
    print(f"  jax.lax.scan        temp memory {mib(mem_lax):>10}")
    print(
        f"  retrograde.scan     temp memory {mib(mem_retro):>10}  "
        f"= {mem_retro / mem_lax:.2%} of lax.scan; gradients agree to {err:.1e}"
    )

    # Count the compiled gradient's step evaluations with a host callback in the step.
    counted = jax.jit(jax.grad(make_loss(retro_scan, count=True), argnums=(0, 1)))
    CALLS.clear()
    jax.block_until_ready(counted(1.3, u0))
    jax.effects_barrier()
    stats = simulate(SCAN_SCHEDULE, N_SCAN)
    expected = stats.plain + 1 + N_SCAN
    optimum = revolve_optimum(N_SCAN, SLOTS)
    verdict = "optimal" if len(CALLS) == expected and stats.plain == optimum else "MISMATCH"
    print(f"  step evaluations of the compiled gradient (callback count): {len(CALLS):,}")
    print(
        f"  expected: simulate(...).plain + 1 + N = {stats.plain:,} + 1 + {N_SCAN:,} = "
        f"{expected:,}; proven optimum revolve_optimum(N, s) = {optimum:,} plain -> {verdict}"
    )
    print(
        f"  ({(len(CALLS)) / (2 * N_SCAN):.2f}x the 2N evaluations of storing every state)"
        f"   [{time.perf_counter() - t0:.0f} s]"
    )


# ------------------------------------------------------------------------------------------------
# 3. A host-driven NumPy loop with a hand-written adjoint, RAM + disk snapshots
# ------------------------------------------------------------------------------------------------
NX, N_HOST, R, DT = 100, 300, 0.25, 0.01


def host_loop():
    heading("3. retrograde.host: NumPy loop, hand-written adjoint, RAM + disk snapshots")
    t0 = time.perf_counter()

    def neighbours(u):
        out = np.zeros_like(u)
        out[1:] += u[:-1]
        out[:-1] += u[1:]
        return out

    # state = {"u": field, "lag": copy of u taken every 5th step, read 3 steps later}
    def forward(n, s, p):
        u, lag = s["u"].copy(), s["lag"].copy()
        if n % 5 == 0:
            lag = u.copy()  # made now ...
        if n % 5 == 3:
            u = u + p["g"] * np.sin(lag)  # ... used 3 steps later
        u = (1 - 2 * R) * u + R * neighbours(u) + DT * p["q"]
        return {"u": u, "lag": lag}

    def vjp(n, s, p, s_bar):  # (cotangent of step n's input, of the parameters)
        lag_in = s["u"] if n % 5 == 0 else s["lag"]
        u_bar = (1 - 2 * R) * s_bar["u"] + R * neighbours(s_bar["u"])  # symmetric stencil
        lag_bar, g_bar = s_bar["lag"].copy(), 0.0
        if n % 5 == 3:
            g_bar = float(np.sum(u_bar * np.sin(lag_in)))
            lag_bar = lag_bar + u_bar * p["g"] * np.cos(lag_in)
        if n % 5 == 0:
            u_bar, lag_bar = u_bar + lag_bar, np.zeros(NX)
        return {"u": u_bar, "lag": lag_bar}, {"q": DT * s_bar["u"], "g": g_bar}

    x = np.linspace(0.0, 1.0, NX)
    target = 0.3 * np.sin(np.pi * x)
    zero_p = {"q": 0.0, "g": 0.0}
    loss = rh.Running(
        lambda n, s, p: 0.5 * DT * np.sum((s["u"] - target) ** 2),
        grad=lambda n, s, p: ({"u": DT * (s["u"] - target), "lag": 0 * s["lag"]}, zero_p),
    )
    state0 = {"u": np.exp(-50 * (x - 0.3) ** 2), "lag": np.zeros(NX)}
    params = {"q": np.cos(2 * np.pi * x), "g": 0.5}

    schedule = MultiLevel(
        [Level(3, name="memory"), Level(8, write_cost=2, read_cost=2, name="disk")]
    )
    stats = simulate(schedule, N_HOST)
    with tempfile.TemporaryDirectory() as tmp:
        storage = {"memory": rh.Memory(), "disk": rh.Disk(tmp)}
        J, grad = rh.value_and_grad(
            rh.Step(forward, vjp),
            loss,
            state0,
            params,
            N_HOST,
            schedule=schedule,
            storage=storage,
            progress=False,
        )
        left = os.listdir(tmp)

    def J_plain(p):
        s, total = state0, 0.0
        for n in range(N_HOST):
            s = forward(n, s, p)
            total += loss.f(n + 1, s, p)
        return total

    rng = np.random.default_rng(0)
    dq, dg, eps = rng.standard_normal(NX), 1.0, 1e-6
    fd = (
        J_plain({"q": params["q"] + eps * dq, "g": params["g"] + eps * dg})
        - J_plain({"q": params["q"] - eps * dq, "g": params["g"] - eps * dg})
    ) / (2 * eps)
    ad = float(np.dot(grad.params["q"], dq) + grad.params["g"] * dg)
    print(
        f"{N_HOST} steps of a {NX}-point heat equation with a delayed reaction (a value made at "
        "step n is used at step n + 3);"
    )
    print(
        "MultiLevel: 3 snapshot slots in RAM + 8 on disk (rh.Disk, a disk access costing ~2 steps)"
    )
    print(
        f"  slots used (RAM, disk): {stats.peak_slots}; evaluations {stats.plain:,} plain + "
        f"{stats.recorded} adjoint; disk files left after: {len(left)}"
    )
    print(
        f"  J = {J:.10f}; directional derivative: adjoint {ad:.10f}, finite differences "
        f"{fd:.10f} (rel. error {abs(ad - fd) / abs(fd):.1e})   [{time.perf_counter() - t0:.0f} s]"
    )


# ------------------------------------------------------------------------------------------------
def picture():
    heading("Picture")
    n, schedule = 60, Revolve(6)
    _, stats = plot_schedule(
        schedule,
        n,
        "demo_schedule.png",
        title=f"{schedule} reversing N = {n} steps ({stats_line(schedule, n)})",
    )
    print(
        f"wrote demo_schedule.png: {schedule} for N = {n} (the schedule family of part 2; "
        f"{stats.plain} plain + {stats.recorded} recorded evaluations)"
    )


def stats_line(schedule, n):
    s = simulate(schedule, n)
    return f"{s.plain} plain + {s.recorded} recorded evaluations, {s.peak_slots[0]} slots"


if __name__ == "__main__":
    print(
        f"retrograde {retrograde.__version__}, jax {jax.__version__}, "
        f"{jax.devices()[0].platform.upper()}, float64"
    )
    neural_ode()
    long_scan()
    host_loop()
    picture()
    print(f"\ndone in {time.perf_counter() - T_START:.0f} s")
