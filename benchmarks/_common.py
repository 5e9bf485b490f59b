"""Helpers shared by the benchmark scripts (imported as ``_common``; nothing to run here).

- :func:`nested_shape`, :func:`nested_remat`: the usual workaround to compare against, a nested
  sqrt(N) scan (an outer ``lax.scan`` over chunks, each chunk an inner ``lax.scan`` under
  ``jax.checkpoint``);
- :func:`prepare`, :func:`time_round_robin`: compile and warm up, then time several compiled
  functions taking turns, so that load from other processes slows all of them alike;
- :func:`print_table`: a table as aligned text or as markdown.
"""

from __future__ import annotations

import math
import time

import jax


def nested_shape(n: int) -> tuple[int, int]:
    """``(outer, inner)`` of the nested scan: ``inner`` is the divisor of ``n`` closest to
    sqrt(n)."""
    r = math.sqrt(n)
    inner = min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - r), d))
    return n // inner, inner


def nested_remat(step, init, n: int):
    """The final carry of ``n`` steps of ``step(carry, None) -> (carry, _)`` as a nested scan:
    ``outer`` checkpointed chunks of ``inner`` steps (:func:`nested_shape`)."""
    outer, inner = nested_shape(n)

    @jax.checkpoint
    def chunk(u, _):
        return jax.lax.scan(step, u, length=inner)[0], None

    return jax.lax.scan(chunk, init, length=outer)[0]


def prepare(fn, *args):
    """Compile ``fn`` for ``args`` and warm it up: ``(compiled, out, compile_s, temp)``, ``temp``
    being XLA's ``temp_size_in_bytes`` of the compiled program."""
    t = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t
    temp = compiled.memory_analysis().temp_size_in_bytes
    out = jax.block_until_ready(compiled(*args))
    return compiled, out, compile_s, temp


def time_round_robin(compiled, args, repeats, clock=time.perf_counter, min_time=0.0):
    """Times (a list per name) of each compiled function called on ``args`` (a tuple) over
    ``repeats`` rounds, the functions taking turns within a round, so that a busy machine slows
    all of them alike (the ratios between them are what the tables are for). ``clock``: wall
    time by default; ``time.process_time`` counts the CPU time of all of the process's threads,
    which varies far less with other processes' load. With ``min_time`` (seconds of wall time),
    rounds go on until at least that long has passed: a median of a few calls of a function
    that takes a millisecond is mostly noise."""
    times = {name: [] for name in compiled}
    start, rounds = time.perf_counter(), 0
    while rounds < repeats or time.perf_counter() - start < min_time:
        for name, c in compiled.items():
            t = clock()
            jax.block_until_ready(c(*args))
            times[name].append(clock() - t)
        rounds += 1
    return times


def print_table(title, header, rows, markdown, left=1):
    """Print ``rows`` (lists of strings) under ``header``, the first ``left`` columns aligned
    left and the others right; as markdown (with a ``###`` title) or as aligned text."""
    print()
    if markdown:
        print(f"### {title}\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join([":---"] * left + ["---:"] * (len(header) - left)) + "|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        print(title)
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        for line in [header, *rows]:
            print(
                "  ".join(
                    c.ljust(w) if i < left else c.rjust(w)
                    for i, (c, w) in enumerate(zip(line, widths))
                )
            )
