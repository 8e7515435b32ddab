"""The one-shot all-reduce's buffer layout, program and rounding (pure: no GPU, no torch except the cross-check)."""

from __future__ import annotations

import numpy as np
import pytest

from kimi_k3_path.comm.oneshot import (
    ALIGN,
    EPOCH_MOD,
    HIDDEN,
    Acquire,
    Count,
    Layout,
    ProtocolError,
    Put,
    Release,
    Sum,
    buffer_bytes,
    epoch_of,
    f32_to_bf16,
    bf16_to_f32,
    parity_of,
    rank_program,
    reference_sum,
    row_pieces,
)


def test_buffer_bytes_at_the_decode_shapes():
    # 2 parities x 8 slots x 64 rows x 7168 bf16, then flags (2 x 8 x 16 u32) and counts (16 u32), each 128-aligned.
    assert buffer_bytes(8, 64) == 2 * 8 * 64 * HIDDEN * 2 + 1024 + 128
    assert buffer_bytes(2, 1) == 2 * 2 * HIDDEN * 2 + 256 + 128


@pytest.mark.parametrize("world", [2, 4, 8])
def test_regions_are_disjoint_and_aligned(world):
    lay = Layout(world, max_m=3, hidden=256, chunks=4)
    slots = sorted(lay.slot_offset(p, s) for p in range(2) for s in range(world))
    assert slots == [i * lay.slot_bytes for i in range(2 * world)]
    flags = sorted(lay.flag_offset(p, s, c) for p in range(2) for s in range(world) for c in range(4))
    assert flags == list(range(lay.flags_offset, lay.flags_offset + 4 * len(flags), 4))
    assert lay.data_bytes <= lay.flags_offset and flags[-1] + 4 <= lay.counts_offset
    assert lay.count_offset(3) + 4 <= lay.nbytes
    assert lay.flags_offset % ALIGN == lay.counts_offset % ALIGN == lay.nbytes % ALIGN == 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(world=16, max_m=64), "world=16.*supported: 2, 4, 8"),
    (dict(world=3, max_m=64), "world=3"),
    (dict(world=8, max_m=0), "max_m=0"),
    (dict(world=8, max_m=64, chunks=5), "chunks=5"),
    (dict(world=8, max_m=64, hidden=7160), "hidden=7160"),
])
def test_layout_rejects(kwargs, message):
    with pytest.raises(ProtocolError, match=message):
        Layout(**kwargs)


def test_calls_outside_the_buffer_are_rejected():
    lay = Layout(4, max_m=64)
    with pytest.raises(ProtocolError, match="M=65 rows: the buffer holds 1..64"):
        lay.check_call(65)
    with pytest.raises(ProtocolError, match="M=0"):
        rank_program(lay, 0, 0, 0, 0)
    with pytest.raises(ProtocolError, match="rank=4 is not in 0..3"):
        rank_program(lay, 4, 0, 0, 1)


def test_epochs_alternate_parity_and_never_repeat_two_calls_apart_across_the_wrap():
    counts = [0, 1, 2, EPOCH_MOD - 3, EPOCH_MOD - 2, EPOCH_MOD - 1]
    for k in counts:
        e, later = epoch_of(k), epoch_of((k + 2) % EPOCH_MOD)
        assert parity_of(e) == parity_of(later) != parity_of(epoch_of((k + 1) % EPOCH_MOD))
        assert e != later
    assert epoch_of(0) == 1 and epoch_of(1) == 2  # never the zeroed flags' value on a slot's first use


def test_program_order_of_one_rank():
    lay = Layout(4, max_m=8, hidden=64, chunks=2)
    ops = rank_program(lay, rank=1, chunk=1, count=6, m=5, pieces=2)
    epoch, parity = 7, 1
    puts = [op for op in ops if isinstance(op, Put)]
    assert [op.dst for op in puts] == [2, 2, 3, 3, 0, 0, 1, 1]  # every rank's buffer, its own included
    assert {op.rows for op in puts} == {(0, 2), (2, 5)} and {op.parity for op in puts} == {parity}
    kinds = [type(op) for op in ops]
    assert kinds == [Put] * 8 + [Release] * 4 + [Acquire] * 4 + [Sum] * 2 + [Count]
    assert {(op.index, op.value) for op in ops if isinstance(op, Release)} == {(lay.flag_index(1, 1, 1), epoch)}
    assert [op.index for op in ops if isinstance(op, Acquire)] == [lay.flag_index(1, s, 1) for s in range(4)]
    assert ops[-1] == Count(epoch)


def test_row_pieces_cover_the_rows_once():
    for m in range(1, 10):
        for pieces in range(1, 4):
            cut = row_pieces(m, pieces)
            assert cut[0][0] == 0 and cut[-1][1] == m and all(a < b for a, b in cut)
            assert all(cut[i][1] == cut[i + 1][0] for i in range(len(cut) - 1))


def test_bf16_rounding_matches_torch_round_to_nearest_even():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(4096, dtype=np.float32) * np.float32(1e3)
    # Exact ties between two bf16 values (the low 16 bits 0x8000), both parities of the kept bit.
    ties = (rng.integers(0x3F800000, 0x4F800000, 512, dtype=np.uint32) & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
    x = np.concatenate([x, ties.view(np.float32), np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38], np.float32)])
    expected = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(f32_to_bf16(x), expected)
    assert np.isnan(bf16_to_f32(f32_to_bf16(np.array([np.nan], np.float32))))


def test_reference_sum_is_fp32_in_rank_order_rounded_once():
    # 1 + 2^-8 + 2^-8 in bf16 partials: fp32 keeps 1 + 2^-7 (exact, a bf16 value); rounding the running sum to bf16
    # after each add would give 1 (ties to even), and another order (2^-8 + 2^-8 first) the same 1 + 2^-7.
    one, eps = f32_to_bf16(np.array([1.0, 2.0 ** -8], np.float32))
    partials = np.array([[one], [eps], [eps]], np.uint16)
    assert bf16_to_f32(reference_sum(partials))[0] == 1 + 2.0 ** -7
    # Order matters in fp32: x0 = 2^24, x1 = 1, x2 = -2^24 sums to 0 in rank order (2^24 + 1 rounds to 2^24).
    big, unit, neg = f32_to_bf16(np.array([2.0 ** 24, 1.0, -(2.0 ** 24)], np.float32))
    assert bf16_to_f32(reference_sum(np.array([[big], [unit], [neg]], np.uint16)))[0] == 0.0
    assert bf16_to_f32(reference_sum(np.array([[big], [neg], [unit]], np.uint16)))[0] == 1.0
