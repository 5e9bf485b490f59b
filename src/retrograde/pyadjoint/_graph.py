"""What crosses each step boundary of a taped pyadjoint loop, read off the taped graph.

A block variable made by a block in step ``c`` and read by blocks in steps ``r_1 < ... < r_k``
(``r_k > c``) is part of the state ``u_n`` at every boundary ``c < n <= r_k``: restarting the
loop at step ``n`` needs it, whether ``r_k = c + 1`` (the usual state) or much later (a
long-range read). Block variables no block made (controls, constants: the tape's inputs) are never
part of a state; their values are the tape's own.

Cost: ``O(B + sum_n |u_n|)`` time and references for ``B`` blocks and dependencies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["TapeGraph"]


class TapeGraph:
    """The boundaries of a taped loop of ``n_steps`` steps.

    Attributes:
        n_steps: ``N``, the number of steps on the tape.
        steps: the blocks of each step (the tape's own lists).
        created: block variable -> the step whose block made it (tape inputs are absent).
        last_read: block variable -> the last step that reads it (absent: read only in the step
            that made it, or never).
        live: ``live[n]`` for ``0 <= n < N``: the block variables of ``u_n`` (made before step
            ``n``, read in step ``n`` or later), in a fixed order.
        outs: ``outs[n]``, the block variables made in step ``n``.
        results: the block variables of the last step that no block reads (the functional).
        dead: ``dead[n]``, the variables not needed once step ``n`` ran.
    """

    def __init__(self, steps: Sequence[Sequence[Any]]):
        self.steps = steps
        self.n_steps = len(steps)
        created: dict = {}
        for n, blocks in enumerate(steps):
            for block in blocks:
                for bv in block.get_outputs():
                    created[bv] = n
        last_read: dict = {}
        read: set = set()
        for n, blocks in enumerate(steps):
            for block in blocks:
                for bv in block.get_dependencies():
                    read.add(bv)
                    c = created.get(bv)
                    if c is not None and c < n:
                        last_read[bv] = n
        self.created = created
        self.last_read = last_read
        live: list[tuple] = []
        current: dict = {}  # insertion-ordered set
        outs = [tuple(bv for block in blocks for bv in block.get_outputs()) for blocks in steps]
        for n in range(len(steps)):
            live.append(tuple(current))
            for bv in [bv for bv in current if last_read[bv] == n]:
                del current[bv]
            for bv in outs[n]:
                if last_read.get(bv, n) > n:
                    current[bv] = None
        self.live = live
        self.outs = outs
        results = set(outs[-1]) - read if steps else set()
        #: Variables of the last step that no block reads (the functional among them).
        self.results = [bv for bv in (outs[-1] if steps else ()) if bv in results]
        #: ``dead[n]``: what is not needed once step ``n`` ran (of ``u_n`` and made in step
        #: ``n``, not part of ``u_{n+1}``; results excepted).
        self.dead = [
            tuple(
                bv for bv in live[n] + outs[n] if last_read.get(bv, -1) <= n and bv not in results
            )
            for n in range(len(steps))
        ]

    def outputs(self, n: int) -> tuple:
        """The block variables made in step ``n``."""
        return self.outs[n]
