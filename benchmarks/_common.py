"""Helpers shared by the benchmark scripts (imported as ``_common``; nothing to run here).

- :func:`nested_shape`, :func:`nested_remat`: the usual workaround to compare against, a nested
  sqrt(N) scan (an outer ``lax.scan`` over chunks, each chunk an inner ``lax.scan`` under
  ``jax.checkpoint``);
- :func:`prepare`, :func:`time_round_robin`: compile and warm up, then time several compiled
  functions taking turns, so that load from other processes slows all of them alike;
- :func:`temp_bytes`, :func:`largest_fitting`: XLA's temporary memory of a compiled function,
  and the most snapshots that fit a budget of it;
- :func:`print_table`: a table as aligned text or as markdown;
- :func:`write_between_markers`: put a generated block into a document between two markers.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import jax


def nested_shape(n: int) -> tuple[int, int]:
    """``(outer, inner)`` of the nested scan: ``inner`` is the divisor of ``n`` closest to
    sqrt(n)."""
    r = math.sqrt(n)
    inner = min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - r), d))
    return n // inner, inner


def nested_remat(step, init, n: int, xs=None):
    """The final carry of ``n`` steps of ``step(carry, x) -> (carry, _)`` as a nested scan:
    ``outer`` checkpointed chunks of ``inner`` steps (:func:`nested_shape`); ``xs`` (leaves of
    leading axis ``n``, or ``None``) is split into the chunks' rows."""
    outer, inner = nested_shape(n)
    rows = jax.tree.map(lambda x: x.reshape(outer, inner, *x.shape[1:]), xs)

    @jax.checkpoint
    def chunk(u, x):
        return jax.lax.scan(step, u, x, length=inner)[0], None

    return jax.lax.scan(chunk, init, rows, length=outer)[0]


def prepare(fn, *args):
    """Compile ``fn`` for ``args`` and warm it up: ``(compiled, out, compile_s, temp)``, ``temp``
    being XLA's ``temp_size_in_bytes`` of the compiled program."""
    t = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t
    temp = compiled.memory_analysis().temp_size_in_bytes
    out = jax.block_until_ready(compiled(*args))
    return compiled, out, compile_s, temp


def temp_bytes(fn, args) -> int:
    """XLA's ``temp_size_in_bytes`` of ``jax.jit(fn)`` compiled for ``args``: one device's, for a
    program partitioned over several devices (``shard_map``, sharded inputs)."""
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def largest_fitting(make, args, budget: int, carry_bytes: int, most: int | None = None) -> int:
    """The largest ``s`` (at most ``most``) whose compiled ``make(s)`` has temp memory <=
    ``budget`` bytes: a guess from the memory at ``s = 16`` (one carry of ``carry_bytes`` per
    slot), then one slot at a time."""

    def temp(s):
        return temp_bytes(make(s), args)

    base = temp(16) - 16 * carry_bytes
    s = max(1, int((budget - base) // carry_bytes))
    if most is not None:
        s = min(s, most)
    if temp(s) <= budget:
        while (most is None or s < most) and temp(s + 1) <= budget:
            s += 1
        return s
    while s > 1 and temp(s - 1) > budget:
        s -= 1
    return max(s - 1, 1)


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


def write_between_markers(path: Path, start: str, end: str, block: str) -> None:
    """Replace what lies between the lines ``start`` and ``end`` of ``path`` by ``block`` (the
    markers are appended to the file first if it lacks them)."""
    text = path.read_text() if path.exists() else ""
    if start not in text or end not in text:
        text = text.rstrip("\n") + ("\n\n" if text.strip() else "") + f"{start}\n{end}\n"
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    path.write_text(f"{head}{start}\n{block.rstrip(chr(10))}\n{end}{tail}")
