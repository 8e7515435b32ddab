"""The one-shot program executed on the CPU under random interleavings with fast and slow ranks: hundreds of
consecutive calls of varying M give every rank the rank-order fp32 sum rounded once to bf16, bit for bit; the
single-buffered and the epoch-less variants are caught by the same checker."""

from __future__ import annotations

import numpy as np
import pytest

from kimi_k3_path.comm.oneshot import EPOCH_MOD, HIDDEN, Layout
from kimi_k3_path.comm.simulate import ProtocolViolation, check, random_calls, run


def _run_and_check(layout: Layout, calls: int, seed: int, **variant) -> int:
    """How many stores landed while a peer was a call behind (see run's stats)."""
    inputs = random_calls(layout, calls, np.random.default_rng(seed))
    stats = {}
    check(inputs, run(layout, inputs, seed, stats=stats, **variant))
    return stats["ahead"]


@pytest.mark.parametrize("world, seeds, calls", [(2, 6, 200), (4, 4, 200), (8, 3, 120)])
def test_every_rank_gets_the_rank_order_sum(world, seeds, calls, seed):
    layout = Layout(world, max_m=4, hidden=64, chunks=2)
    ahead = [_run_and_check(layout, calls, s) for s in range(seed, seed + seeds)]
    assert min(ahead) > 0, "the scheduler never let a rank run a call ahead of a peer: nothing was tested"


def test_the_decode_shape_at_world_8(seed):
    _run_and_check(Layout(8, max_m=2, hidden=HIDDEN, chunks=16), 3, seed, pieces=1)


def test_the_epoch_counter_wraps(seed):
    # Counters and flags start zeroed together in service; here the counters start 4 calls before the wrap (the
    # zeroed flags stand for epochs 2^32 - 4 and - 5), so calls run through epoch 0 and on.
    _run_and_check(Layout(4, max_m=3, hidden=32, chunks=2), 12, seed, initial_count=EPOCH_MOD - 4)


@pytest.mark.parametrize("variant, caught", [
    (dict(single_buffer=True), "deadlock"),  # the next call's flag replaces the one a slow peer waits for
    (dict(epochless=True), "differ from the rank-order fp32 sum"),  # a stale flag admits unwritten data
])
@pytest.mark.parametrize("world", [2, 8])
def test_broken_variants_are_caught(world, variant, caught, seed):
    layout = Layout(world, max_m=4, hidden=64, chunks=2)
    for s in range(seed, seed + 3):
        with pytest.raises(ProtocolViolation, match=caught):
            _run_and_check(layout, 40, s, **variant)


def test_the_checker_names_the_first_wrong_value():
    layout = Layout(2, max_m=2, hidden=16, chunks=1)
    inputs = random_calls(layout, 2, np.random.default_rng(0))
    outputs = run(layout, inputs, 0)
    outputs[1][1, 0, 3] ^= 1
    with pytest.raises(ProtocolViolation, match=r"call 1 \(M=\d\), rank 1: 1 values differ.*row 0 column 3"):
        check(inputs, outputs)
