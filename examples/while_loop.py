"""retrograde.while_loop: differentiate a loop whose step count is only known when it ends.

    python examples/while_loop.py      # a few seconds

``jax.lax.while_loop`` has no reverse-mode derivative at all. ``retrograde.while_loop(cond, body,
init, schedule=Online(s), max_steps=None, buffers=None)`` has every derivative: it places ``s``
snapshots online while the loop runs (it cannot know N in advance) and reverses from them, in
memory that does not grow with the number of steps. Derivatives treat the step count as fixed.

The example: an adaptive-step integrator of a damped pendulum, run until t reaches T, with a
step-size controller (so the number of steps depends on the parameters), recording the angle at
every step into a write-only buffer.
"""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

import retrograde  # noqa: E402
from retrograde.schedules import Online, simulate  # noqa: E402

T, TOL, MAX_STEPS = 10.0, 1e-3, 4096


def rhs(y, params):
    k, c = params
    return jnp.array([y[1], -k * jnp.sin(y[0]) - c * y[1]])


def integrate(params, y0, schedule=Online(8)):
    """Heun/Euler pair with an error-controlled step size, until t = T. Returns the final state,
    (accepted steps, iterations) and the buffer of recorded angles."""

    def cond(val):
        return val[0] < T

    def body(val):
        t, h, y, n, it, trace = val
        h = jnp.minimum(h, T - t)
        f0 = rhs(y, params)
        euler = y + h * f0
        heun = y + 0.5 * h * (f0 + rhs(euler, params))
        err = jnp.max(jnp.abs(heun - euler)) + 1e-16
        accept = err <= TOL
        # accepted: advance; rejected: retry with a smaller step (both are loop iterations)
        t, y = jnp.where(accept, t + h, t), jnp.where(accept, heun, y)
        trace = trace.at[n].set(y[0])  # written, never read (a rejected try is overwritten)
        n = n + accept.astype(n.dtype)
        h = h * jnp.clip(0.9 * jnp.sqrt(TOL / err), 0.2, 5.0)
        return t, h, y, n, it + 1, trace

    init = (
        jnp.float64(0.0),
        jnp.float64(0.01),
        y0,
        jnp.int32(0),
        jnp.int32(0),
        jnp.zeros(MAX_STEPS),
    )
    _t, _h, y, n, it, trace = retrograde.while_loop(
        cond,
        body,
        init,
        schedule=schedule,
        max_steps=MAX_STEPS,
        buffers=lambda val: val[5],  # the trace is stored once, not in every snapshot
    )
    return y, (n, it), trace


def loss(params, y0):
    y, _, trace = integrate(params, y0)
    return y[0] ** 2 + 0.5 * y[1] ** 2 + 1e-3 * jnp.sum(trace**2)


params = jnp.array([2.0, 0.15])  # stiffness, damping
y0 = jnp.array([1.0, 0.0])

y, (accepted, n), _ = jax.jit(integrate)(params, y0)
n = int(n)
print(
    f"adaptive integration to t = {T}: {n} loop iterations ({int(accepted)} accepted steps); "
    "the count depends on the params"
)

# First order, against central finite differences (the step count is locally constant).
g = jax.jit(jax.grad(loss))(params, y0)
eps, loss_jit = 1e-6, jax.jit(loss)
fd = [
    (loss_jit(params.at[i].add(eps), y0) - loss_jit(params.at[i].add(-eps), y0)) / (2 * eps)
    for i in range(2)
]
print(f"grad  d loss/d(k, c) = {g}   finite differences {jnp.array(fd)}")

# Second order: the full Hessian (forward over reverse), and a gradient of a gradient.
H = jax.jit(jax.hessian(loss))(params, y0)
print("hessian d2 loss/d(k, c)^2 =\n", H)
# (jax.grad of jax.grad, jax.jvp and jax.vmap compose the same way; see higher_order.py.)

# The schedule: Online(s) keeps s snapshots; its cost for the N actually taken.
for s in (4, 8, 32):
    st = simulate(Online(s), n)
    print(
        f"  Online({s:>2}) for N = {n}: {st.peak_slots[0]} slots, "
        f"{st.plain + st.recorded:,} step evaluations ({(st.plain + st.recorded) / (2 * n):.2f}x "
        "storing every state)"
    )

# Memory is set by the schedule and max_steps' buffer, not by the steps taken (which are unknown
# when compiling): the compiled gradient's temporary buffers.
mem = jax.jit(jax.grad(loss)).lower(params, y0).compile().memory_analysis().temp_size_in_bytes
print(
    f"gradient temp memory with Online(8): {mem / 1024:.1f} KiB, for any number of steps "
    f"(the {MAX_STEPS}-entry trace buffer alone is {MAX_STEPS * 8 // 1024} KiB)"
)
