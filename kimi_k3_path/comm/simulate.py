"""A CPU executor of the one-shot all-reduce program (`oneshot.rank_program`) under adversarial interleavings.

Every rank's buffer is a numpy array; every chunk of every rank is a task (a CTA of the kernel) that executes its
program one operation per scheduling step. A seeded scheduler picks the next task at random among those that can
move, weighted by per-rank speeds it redraws every few hundred steps (log-uniform over two orders of magnitude), so a
fast rank runs calls ahead of a slow one as far as the protocol lets it. A rank's next call starts when all its
chunks finished the previous one (stream order between launches). An Acquire whose flag does not hold blocks its
task; when no task can move before every call is done, the run is a deadlock.

The scheduler is cooperative and deterministic (a seed replays a run exactly) rather than OS threads: the GPU
orders each data store before its flag by release/acquire, which makes the program's operations behave as if
interleaved one at a time, so interleavings are what there is to explore, and a seed names the failing one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from .oneshot import PARITIES, Acquire, Count, Layout, Put, Release, Sum, f32_to_bf16, rank_program, reference_sum


class ProtocolViolation(AssertionError):
    """A run whose outputs differ from reference_sum, differ between ranks, or that deadlocked."""


@dataclass
class _Buffer:
    data: np.ndarray  # [parity, src, max_m, hidden] bf16 bits
    flags: np.ndarray  # u32, Layout.flag_index order
    counts: np.ndarray  # u32 per chunk


def _buffers(layout: Layout, initial_count: int) -> list[_Buffer]:
    w, c = layout.world, layout.chunks
    return [_Buffer(np.zeros((PARITIES, w, layout.max_m, layout.hidden), np.uint16),
                    np.zeros(PARITIES * w * c, np.uint32), np.full(c, initial_count, np.uint32))
            for _ in range(w)]


def random_calls(layout: Layout, calls: int, rng: np.random.Generator) -> list[np.ndarray]:
    """`calls` inputs [W, M, hidden] (bf16 bits) with M drawn from 1..max_m per call."""
    out = []
    for _ in range(calls):
        m = int(rng.integers(1, layout.max_m + 1))
        out.append(f32_to_bf16(rng.standard_normal((layout.world, m, layout.hidden), dtype=np.float32)))
    return out


def run(layout: Layout, calls: list[np.ndarray], seed: int, *, pieces: int = 2, single_buffer: bool = False,
        epochless: bool = False, initial_count: int = 0, stats: dict | None = None) -> list[np.ndarray]:
    """Every rank's output [W, M, hidden] for each call, executing the program under the interleaving `seed` picks.
    Raises ProtocolViolation on a deadlock. stats, if given, receives "ahead": how many stores of a call landed
    while a peer was still in an earlier call (the race double-buffering exists for: the run must produce some)."""
    rng = random.Random(seed)
    w, cols = layout.world, layout.chunk_cols
    mem = _buffers(layout, initial_count)
    outputs = [np.zeros_like(x) for x in calls]
    next_call = [0] * w
    tasks: list[list] = []  # [rank, chunk, call, ops, pc]

    def launch(rank: int) -> None:
        n = next_call[rank]
        if n < len(calls):
            next_call[rank] += 1
            m = calls[n].shape[1]
            for c in range(layout.chunks):
                ops = rank_program(layout, rank, c, int(mem[rank].counts[c]), m, pieces=pieces,
                                   single_buffer=single_buffer, epochless=epochless)
                tasks.append([rank, c, n, ops, 0])

    def blocked(task) -> bool:
        op = task[3][task[4]]
        return isinstance(op, Acquire) and mem[task[0]].flags[op.index] != op.value

    for rank in range(w):
        launch(rank)
    speeds = [1.0] * w
    step = ahead = 0
    while tasks:
        if step % 256 == 0:
            speeds = [10 ** rng.uniform(0, 2) for _ in range(w)]
        step += 1
        ready = [t for t in tasks if not blocked(t)]
        if not ready:
            where = ", ".join(f"rank {t[0]} chunk {t[1]} call {t[2]} at {t[3][t[4]]}" for t in tasks[:4])
            raise ProtocolViolation(f"deadlock after {step} steps (seed {seed}): every task waits: {where}")
        task = rng.choices(ready, weights=[speeds[t[0]] for t in ready])[0]
        rank, c, n, ops, pc = task
        op = ops[pc]
        sl = slice(c * cols, (c + 1) * cols)
        if isinstance(op, Put):
            r0, r1 = op.rows
            mem[op.dst].data[op.parity, rank, r0:r1, sl] = calls[n][rank, r0:r1, sl]
            ahead += any(t[2] < n for t in tasks)
        elif isinstance(op, Release):
            mem[op.dst].flags[op.index] = op.value
        elif isinstance(op, Sum):
            r0, r1 = op.rows
            outputs[n][rank, r0:r1, sl] = reference_sum(mem[rank].data[op.parity, :, r0:r1, sl])
        elif isinstance(op, Count):
            mem[rank].counts[c] = op.value
        task[4] += 1
        if task[4] == len(ops):
            tasks.remove(task)
            if not any(t[0] == rank for t in tasks):
                launch(rank)
    if stats is not None:
        stats["ahead"] = ahead
    return outputs


def check(calls: list[np.ndarray], outputs: list[np.ndarray]) -> None:
    """Raise ProtocolViolation unless, for every call, every rank's output equals reference_sum of the call's
    partials bit for bit (and so the ranks agree)."""
    for n, (x, out) in enumerate(zip(calls, outputs)):
        expected = reference_sum(x)
        for rank in range(x.shape[0]):
            bad = np.argwhere(out[rank] != expected)
            if len(bad):
                m, h = bad[0]
                raise ProtocolViolation(
                    f"call {n} (M={x.shape[1]}), rank {rank}: {len(bad)} values differ from the rank-order fp32 sum, "
                    f"first at row {m} column {h}: got bf16 bits {out[rank][m, h]:#06x}, "
                    f"expected {expected[m, h]:#06x}")
