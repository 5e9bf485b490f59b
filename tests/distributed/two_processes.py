"""One process of ``tests/distributed/test_processes.py``: gradients of checkpointed loops over a
state sharded across every process, against the unbounded-memory references.

Run from the repository root (the test starts two of these)::

    XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
        python -m tests.distributed.two_processes PROCESS_ID NUM_PROCESSES PORT DISK_DIR

``jax.distributed.initialize`` connects the processes on 127.0.0.1:PORT (process 0 runs the
coordinator); JAX's CPU backend then runs cross-process collectives with gloo, its default
(``jax_cpu_collectives_implementation``). One mesh axis ``"x"`` spans every device of every
process, and the state is ``NamedSharding(mesh, P("x"))``, so each process holds only its own
pieces. Each process computes, under ``jax.jit``:

- ``scan``: ``retrograde.scan`` with ``Revolve(4)`` (a step with per-step inputs and outputs and a
  ``jnp.roll``, which moves data between processes), against ``jax.lax.scan``;
- ``diffrax``: a ``diffeqsolve`` with ``retrograde.diffrax.CheckpointAdjoint`` (Tsit5, adaptive
  steps: the error norm that decides each step is a reduction over every process), against
  ``diffrax.DirectAdjoint``;
- ``offload``: ``retrograde.scan`` with ``MultiLevel`` device, host and disk levels (disk files in
  ``DISK_DIR``), against ``jax.lax.scan``;

and prints ``RESULT {json}``: per computation, the relative error of (value, gradients) on the
pieces this process holds against the reference computed unsharded on one local device, and the
snapshot transfers this process made. Any failure exits non-zero.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

D = 16  # state size (global)
N = 20  # steps


def main(argv: list[str]) -> None:
    process_id, num_processes, port, disk_dir = int(argv[0]), int(argv[1]), int(argv[2]), argv[3]

    import jax

    jax.config.update("jax_enable_x64", True)
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=60,
    )

    import diffrax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import retrograde
    import retrograde.diffrax as rdx
    from retrograde.loops import offload_stats
    from retrograde.schedules import Level, MultiLevel, Revolve
    from tests._compare import rel_err
    from tests.loops._problems import jit

    mesh = Mesh(np.array(jax.devices()), ("x",))
    sharded = NamedSharding(mesh, PartitionSpec("x"))
    replicated = NamedSharding(mesh, PartitionSpec())
    local = jax.local_devices()[0]
    full = np.linspace(-1.0, 1.0, D)
    u0 = jax.make_array_from_callback((D,), sharded, lambda index: full[index])
    assert not u0.is_fully_addressable  # each process holds its own pieces only

    def scan_loss(scan, theta, u):
        def step(u, x):
            return u + 0.1 * jnp.sin(theta * u * x) + 0.01 * jnp.roll(u, 1), jnp.sum(u**2)

        u, ys = scan(step, u, jnp.linspace(0.5, 1.5, N))
        return jnp.sum(u**3) + 0.1 * jnp.sum(ys)

    def solve_loss(adjoint, c, y0):
        def vf(t, y, c):
            return -c * y + 0.3 * jnp.sin(y) + 0.1 * jnp.roll(y, 1)

        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(vf),
            diffrax.Tsit5(),
            0.0,
            2.0,
            0.1,
            y0,
            args=c,
            saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, 2.0, 5)),
            stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6),
            adjoint=adjoint,
            max_steps=64,
        )
        return jnp.sum(sol.ys**2)

    def compare(loss, ours, reference, p):
        """Relative error of ``value_and_grad(loss(ours, .))`` on the sharded state against
        ``loss(reference, .)`` on one local device, over the pieces this process holds."""
        grad = jit(
            jax.value_and_grad(lambda p, u: loss(ours, p, u), (0, 1)),
            out_shardings=(replicated, (replicated, sharded)),
        )
        offload_stats(reset=True)
        value, (g_p, g_u) = grad(jnp.float64(p), u0)
        assert g_u.sharding.is_equivalent_to(sharded, 1), g_u.sharding
        pieces = [np.asarray(s.data) for s in g_u.addressable_shards]
        jax.effects_barrier()  # every snapshot transfer has run
        stats = offload_stats()
        ref_grad = jit(jax.value_and_grad(lambda p, u: loss(reference, p, u), (0, 1)))
        ref_value, (ref_p, ref_u) = ref_grad(
            jax.device_put(jnp.float64(p), local), jax.device_put(full, local)
        )
        ref_u = np.asarray(ref_u)
        err = rel_err(
            (value.addressable_data(0), g_p.addressable_data(0), pieces),
            (ref_value, ref_p, [ref_u[s.index] for s in g_u.addressable_shards]),
        )
        return {
            "err": err,
            "writes": {str(k): v for k, v in stats.writes.items()},
            "bytes_written": {str(k): v for k, v in stats.bytes_written.items()},
            "open_stores": stats.open_stores,
        }

    def lax_scan(f, c, xs):
        return jax.lax.scan(f, c, xs)

    def revolve(f, c, xs):
        return retrograde.scan(f, c, xs, schedule=Revolve(4))

    levels = MultiLevel(
        [
            Level(1),
            Level(2, write_cost=0.5, read_cost=0.5, storage="host"),
            Level(None, write_cost=2, read_cost=2, storage="disk", directory=disk_dir),
        ]
    )

    def offloaded(f, c, xs):
        return retrograde.scan(f, c, xs, schedule=levels)

    results = {
        "scan": compare(scan_loss, revolve, lax_scan, 0.7),
        "diffrax": compare(solve_loss, rdx.CheckpointAdjoint(), diffrax.DirectAdjoint(), 0.5),
        "offload": compare(scan_loss, offloaded, lax_scan, 0.7),
        "devices": [len(jax.local_devices()), len(jax.devices())],
    }
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BaseException:  # noqa: BLE001 (any failure: report it and exit at once)
        traceback.print_exc()
        sys.stdout.flush()
        # At once: a normal exit would wait in jax.distributed's shutdown barrier for the other
        # process, which waits for this one (the test kills it when this one has failed).
        os._exit(1)
