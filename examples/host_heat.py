"""retrograde.host example: a NumPy heat equation with a hand-written adjoint.

The loop runs in plain NumPy (no JAX in the step), updates its arrays in place, and carries a
value across steps: every 4th step it records a copy of the field ("lag"), and 3 steps later a
delayed reaction reads it. Snapshots go to RAM and to disk through a MultiLevel schedule, and the
gradient is checked against finite differences.

Run: python examples/host_heat.py
"""

import numpy as np

import retrograde.host as rh
from retrograde.schedules import Level, MultiLevel, simulate

NX, N_STEPS = 200, 400
R, DT = 0.25, 0.01  # diffusion number, time step


# ---- the step: state = {"u": field, "lag": field recorded every 4th step} -------------------
def neighbours(u):
    """u[i-1] + u[i+1] with zero outside the grid."""
    out = np.zeros_like(u)
    out[1:] += u[:-1]
    out[:-1] += u[1:]
    return out


def forward(n, s, p):
    u, lag = s["u"], s["lag"]
    if n % 4 == 0:
        lag[:] = u  # made now ...
    if n % 4 == 3:
        u += p["g"] * np.sin(lag)  # ... read three steps later (a long-range dependency)
    u[:] = (1 - 2 * R) * u + R * neighbours(u) + DT * p["q"]  # explicit diffusion + source
    return s  # the same arrays, updated in place: retrograde copies every snapshot


def vjp(n, s, p, s_bar):
    """(state_bar at step n, params_bar) from the cotangent of the output of step n."""
    u0, lag = s["u"], s["lag"]
    lag1 = u0 if n % 4 == 0 else lag  # recompute what forward saw
    u_bar = (1 - 2 * R) * s_bar["u"] + R * neighbours(s_bar["u"])  # the stencil is symmetric
    lag_bar = s_bar["lag"].copy()
    q_bar, g_bar = DT * s_bar["u"], 0.0
    if n % 4 == 3:
        g_bar = np.sum(u_bar * np.sin(lag1))
        lag_bar += u_bar * p["g"] * np.cos(lag1)
    if n % 4 == 0:
        u_bar = u_bar + lag_bar  # lag was a copy of u
        lag_bar = np.zeros_like(lag_bar)  # ... and overwritten
    return {"u": u_bar, "lag": lag_bar}, {"q": q_bar, "g": g_bar}


step = rh.Step(forward, vjp)

# ---- the loss: a running misfit to a target plus a final term, each with its gradient -------
x = np.linspace(0, 1, NX)
target = 0.3 * np.sin(np.pi * x)
loss = (
    rh.Running(
        lambda n, s, p: 0.5 * DT * np.sum((s["u"] - target) ** 2),
        grad=lambda n, s, p: (
            {"u": DT * (s["u"] - target), "lag": 0 * s["lag"]},
            {"q": 0.0, "g": 0.0},
        ),
    ),
    rh.Final(
        lambda n, s, p: np.sum(s["u"] ** 2),
        grad=lambda n, s, p: ({"u": 2 * s["u"], "lag": 0 * s["lag"]}, {"q": 0.0, "g": 0.0}),
    ),
)

state0 = {"u": np.exp(-50 * (x - 0.3) ** 2), "lag": np.zeros(NX)}
params = {"q": np.cos(2 * np.pi * x), "g": 0.05}

# ---- the schedule: 4 snapshots in RAM, 10 on disk (a disk access costs ~2 steps here) --------
schedule = MultiLevel([Level(4, name="memory"), Level(10, write_cost=2, read_cost=2, name="disk")])
stats = simulate(schedule, N_STEPS)
print(f"{N_STEPS} steps, slots used {stats.peak_slots}, plain evaluations {stats.plain}")

# storage: level 0 in RAM, level 1 in a private temporary directory (removed afterwards)
storage = {"memory": rh.Memory(), "disk": rh.Disk()}
J, grad = rh.value_and_grad(step, loss, state0, params, N_STEPS, schedule=schedule, storage=storage)
print(f"J = {J:.10f}")


# ---- check against central finite differences along a random direction ----------------------
def J_plain(p, s0=state0):
    s = {k: v.copy() for k, v in s0.items()}
    total = 0.0
    for n in range(N_STEPS):
        s = forward(n, s, p)
        total += loss[0].f(n + 1, s, p)
    return total + loss[1].f(N_STEPS, s, p)


rng = np.random.default_rng(0)
dq, dg = rng.standard_normal(NX), 1.0
eps = 1e-6
fd = (
    J_plain({"q": params["q"] + eps * dq, "g": params["g"] + eps * dg})
    - J_plain({"q": params["q"] - eps * dq, "g": params["g"] - eps * dg})
) / (2 * eps)
ad = np.dot(grad.params["q"], dq) + grad.params["g"] * dg
print(
    f"directional derivative: adjoint {ad:.10f}, finite differences {fd:.10f}, "
    f"relative error {abs(ad - fd) / abs(fd):.1e}"
)
assert abs(ad - fd) <= 1e-6 * abs(fd)

# ---- several functionals from one forward sweep ---------------------------------------------
with rh.forward(step, state0, params, N_STEPS, schedule=schedule, loss=loss, storage=storage) as fp:
    g_loss = fp.vjp()  # dJ
    g_mean = fp.vjp({"u": np.full(NX, 1 / NX), "lag": np.zeros(NX)}, loss_bar=0.0)  # d mean(u_N)
print(
    f"|dJ/dq| = {np.linalg.norm(g_loss.params['q']):.6f}, "
    f"|d mean(u_N)/dq| = {np.linalg.norm(g_mean.params['q']):.6f}"
)
