"""GEMM2 + weighted combine + latent RMSNorm of the routed experts on the tensor cores (batches of 2 to 64 tokens:
dispatch.py), grouped by the router's plan: each active expert's w2 rows are read once per step."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float16, Float32, Int32, Int64, Uint8

from .common import FP4_GROUP, WARP, bulk_copy_to_shared, expect_bulk_bytes, red_add_f32
from .fp4_mma import (
    GEMM2_GROUPS_IN_FLIGHT,
    GEMM2_ROWS,
    SMEM_SLACK,
    WARPS_PER_CTA,
    check_mma_experts,
    group_span_mma,
    prefetch_activations,
    token_row,
)
from .mma import MMA_ROWS, TILE_TOKENS, zero_tiles
from .norm_tail import NORM_TAIL_CTAS, TAIL_SMEM_BYTES, alloc_tail_smem, norm_tail
from .router import expect_plan, fake_plan


# Bytes of w2 rows and scales a multi-tile GEMM2 CTA stages at once (its tiles' copies all issued before the wait),
# where one 128-row tile per CTA (26 KB at TP8, 13 KB at TP16) had each of ~17 000 CTAs at 64 tokens copy, wait a round
# trip, compute and reduce in turn. 56 KB keeps 4 CTAs per SM, as registers allow. Where it runs: dispatch.py.
GEMM2_STAGED_BYTES = 56 * 1024


def gemm2_tiles_per_cta(latent: int, inter: int) -> int:
    """128-row tiles per GEMM2 CTA: the most whose stages fit GEMM2_STAGED_BYTES and divide the latent rows evenly
    (2 at TP8, 4 at TP16)."""
    stage = GEMM2_ROWS * (inter // 2 + inter // FP4_GROUP)
    tiles = latent // GEMM2_ROWS
    return max(t for t in range(1, tiles + 1) if tiles % t == 0 and t * stage <= max(GEMM2_STAGED_BYTES, stage))


class ExpertsGemm2CombineMma:
    """y_lat[t] += w[p] * (a[p] @ w2[e]^T) for every planned pair p = t*k + slot, then normed = rms_norm(y_lat), on
    the tensor cores. CTA (slot, tile) computes `tiles` 128-row tiles of latent rows of the slot's pairs, from
    128 * tiles * tile, 16 rows per warp and tile; those rows of w2 and their scales come into shared memory by bulk
    copies, all issued at the start, one barrier per tile so that the first tile's MMAs overlap the later tiles'
    arrival; the slot's activations are read once into L1 for all of them.
    Each result times the pair's routing weight goes into y_lat with one fp32 reduction, and the last CTAs normalize,
    one token each (norm_tail.norm_tail): the norm needs whole rows, which only exist once every CTA is done.
    Launched early (programmatic dependent launch): GEMM1 lets it start at once, so its CTAs take the room GEMM1's
    finishing CTAs free, read the plan, start their weight copies and wait (griddepcontrol.wait) for GEMM1's results
    only before they read a or touch y_lat (2-3% faster at 2 and 8 tokens when measured). It lets the finalize
    (launched early too) in only after its MMAs: the finalize's waiting CTAs would otherwise take SM room from
    GEMM2's last wave (block at 64 tokens, TP16: -3.5%, H100).
    Tensors: a [M*k, I] fp16, w2 [E, L, I/2] uint8, s2 [E, L, I/32] uint8, plan (router.ExpertPlan), topk weights
    [M, k] fp32, y_lat [M, L] fp32 (zero: GEMM1 zeroes it), counter [2] int32 (zero; left zero), gamma [L] fp32,
    normed [M, L] bf16."""

    def __init__(self, experts: int, latent: int, inter: int, top_k: int, eps: float,
                 in_flight: int = GEMM2_GROUPS_IN_FLIGHT, tail_ctas: int = NORM_TAIL_CTAS, tiles: int | None = None):
        check_mma_experts(latent, inter)
        groups = inter // FP4_GROUP
        self.in_flight = max(n for n in range(1, in_flight + 1) if groups % n == 0)
        self.e, self.l, self.i, self.k, self.eps, self.tail_ctas = experts, latent, inter, top_k, eps, tail_ctas
        self.tiles = gemm2_tiles_per_cta(latent, inter) if tiles is None else tiles
        if self.tiles < 1 or (latent // GEMM2_ROWS) % self.tiles:
            raise ValueError(f"experts_gemm2_mma: {self.tiles} tiles per CTA do not divide the "
                             f"{latent // GEMM2_ROWS} tiles of {GEMM2_ROWS} latent rows")
        self.scale_row = inter // FP4_GROUP
        self.stage_bytes = GEMM2_ROWS * (inter // 2 + self.scale_row)

    def ctas_per_slot(self) -> int:
        return self.l // (GEMM2_ROWS * self.tiles)

    def smem_bytes(self) -> int:
        return TAIL_SMEM_BYTES + self.tiles * self.stage_bytes + SMEM_SLACK

    @cute.jit
    def __call__(self, a, w2, s2, n_active, slot_expert, slot_count, slot_pairs, topk_w, y_lat, counter, gamma,
                 normed, stream: cuda.CUstream):
        m = y_lat.shape[0]
        slots = cutlass.min(m * self.k, self.e)
        self.kernel(a, w2, s2, n_active, slot_expert, slot_count, slot_pairs, topk_w, y_lat, counter, gamma, normed,
                    m).launch(
            grid=[slots, self.ctas_per_slot(), 1], block=[WARPS_PER_CTA * WARP, 1, 1],
            smem=self.smem_bytes(), stream=stream, use_pdl=True,
        )

    @cute.kernel
    def kernel(self, a, w2, s2, n_active, slot_expert, slot_count, slot_pairs, topk_w, y_lat, counter, gamma, normed,
               m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        slot, tile, _ = cute.arch.block_idx()
        grid_x, grid_y, _ = cute.arch.grid_dim()
        smem = cutlass.memory.SmemAllocator()
        flag, partial = alloc_tail_smem(smem)
        stage = smem.allocate_tensor(Uint8, cute.make_layout(self.tiles * self.stage_bytes), byte_alignment=128)
        barrier = smem.allocate_tensor(Int64, cute.make_layout(self.tiles), byte_alignment=8)
        if slot < n_active[0]:
            warp, lane = tidx // WARP, tidx % WARP
            g, q = lane // 4, lane % 4
            expert = slot_expert[slot]
            count = slot_count[slot]
            n_tiles = (count + TILE_TOKENS - 1) // TILE_TOKENS
            packed: cutlass.Constexpr = self.i // 2
            groups: cutlass.Constexpr = self.i // FP4_GROUP
            rows_bytes: cutlass.Constexpr = GEMM2_ROWS * packed  # a stage: its rows, then their scales
            y_addr = y_lat.iterator.toint()
            expect_bulk_bytes(barrier, tidx, self.stage_bytes, self.tiles)
            first_row = Int64(expert) * self.l + Int64(tile * self.tiles * GEMM2_ROWS)
            # Lane j of each warp copies the warp's 16 rows (contiguous in w2) of stage j; lane tiles + j of warp 0
            # the stage's scales: the copies go out in parallel.
            for j in cutlass.range_constexpr(self.tiles):
                stage_addr = stage.iterator.toint() + j * self.stage_bytes
                rows = first_row + Int64(j * GEMM2_ROWS)
                if lane == j:
                    bulk_copy_to_shared(stage_addr + warp * MMA_ROWS * packed,
                                        w2.iterator.toint() + (rows + Int64(warp * MMA_ROWS)) * packed,
                                        MMA_ROWS * packed, (barrier.iterator + j).toint())
                elif lane == self.tiles + j and warp == 0:
                    bulk_copy_to_shared(stage_addr + rows_bytes, s2.iterator.toint() + rows * groups,
                                        GEMM2_ROWS * groups, (barrier.iterator + j).toint())
            cute.arch.griddepcontrol_wait()
            prefetch_activations(token_row(slot_pairs, slot, count, g, self.k, False, a.iterator.toint(),
                                           self.i * 2, q), q, 0, groups)
            local = warp * MMA_ROWS + g  # this lane's MMA row g within a stage's rows
            for j in cutlass.range(self.tiles, unroll=1):
                stage_addr = stage.iterator.toint() + j * self.stage_bytes
                w_g, w_g8 = stage_addr + local * packed, stage_addr + (local + 8) * packed
                s_g, s_g8 = stage_addr + rows_bytes + local * groups, stage_addr + rows_bytes + (local + 8) * groups
                r0 = ((tile * self.tiles + j) * WARPS_PER_CTA + warp) * MMA_ROWS
                cute.arch.mbarrier_wait(barrier.iterator + j, 0)
                for t in cutlass.range(n_tiles, unroll=1):
                    acc = zero_tiles(1)
                    x_row = token_row(slot_pairs, slot, count, t * TILE_TOKENS + g, self.k, False,
                                      a.iterator.toint(), self.i * 2, q)
                    group_span_mma(acc, x_row, w_g, w_g8, s_g, s_g8, Int32(0), q, m_count >> 31, groups,
                                   self.in_flight, True)
                    for c in cutlass.range_constexpr(2):
                        column = t * TILE_TOKENS + 2 * q + c
                        if column < count:
                            pair = slot_pairs[slot, column]
                            token = pair // self.k
                            weight = topk_w[token, pair % self.k]
                            out_row = Int64(token) * self.l + Int64(r0 + g)
                            red_add_f32(y_addr + out_row * 4, acc[0, c] * weight)
                            red_add_f32(y_addr + (out_row + 8) * 4, acc[0, 2 + c] * weight)

        # Only now the finalize may start early: its CTAs, waiting, would take SM room from this grid's last wave.
        cute.arch.griddepcontrol_launch_dependents()
        cute.arch.griddepcontrol_wait()  # CTAs of empty slots too: the tail reads y_lat, which GEMM1 zeroes
        norm_tail(y_lat, gamma, normed, counter, flag, partial, tidx, m_count, grid_x * grid_y, self.l, self.eps,
                  self.tail_ctas)


def experts_gemm2_mma(a, w2, s2, plan, topk_w, y_lat, counter, gamma, normed, eps: float, stream, *,
                      multi_tile: bool) -> None:
    """ExpertsGemm2CombineMma on `stream`: y_lat[t] += sum over t's pairs of weight * (a[pair] @ w2[e]^T), then
    normed = rms_norm(y_lat, gamma, eps) in bf16; multi_tile: gemm2_tiles_per_cta tiles per CTA, else one
    (dispatch.MoeForms.gemm2_multi_tile). Launched early: correct after any launch, since it waits for its
    predecessor before reading a or y_lat."""
    from .runtime import compile_cached, cu_stream, dyn, expect, fake, fake_stream, to_cute

    m, latent = y_lat.shape
    experts, _, half_i = w2.shape
    inter = half_i * 2
    top_k = topk_w.shape[1]
    expect("a", a, (m * top_k, inter), "float16")
    expect("w2", w2, (experts, latent, inter // 2), "uint8")
    expect("s2", s2, (experts, latent, inter // FP4_GROUP), "uint8")
    expect_plan(plan, experts)
    expect("topk_w", topk_w, (m, top_k), "float32")
    expect("y_lat", y_lat, (m, latent), "float32")
    expect("counter", counter, (2,), "int32")
    expect("gamma", gamma, (latent,), "float32")
    expect("normed", normed, (m, latent), "bfloat16")

    tiles = gemm2_tiles_per_cta(latent, inter) if multi_tile else 1

    def build():
        md, pd = dyn(), dyn()
        args = (fake(Float16, (pd, inter)), fake(Uint8, (experts, latent, inter // 2)),
                fake(Uint8, (experts, latent, inter // FP4_GROUP)), *fake_plan(experts), fake(Float32, (md, top_k)),
                fake(Float32, (md, latent)), fake(Int32, (2,)), fake(Float32, (latent,)),
                fake(BFloat16, (md, latent)), fake_stream())
        return ExpertsGemm2CombineMma(experts, latent, inter, top_k, eps, tiles=tiles), args

    fn = compile_cached(("experts_gemm2_mma", experts, latent, inter, top_k, eps, tiles), build)
    fn(to_cute(a, True), to_cute(w2), to_cute(s2), *(to_cute(t) for t in plan), to_cute(topk_w, True),
       to_cute(y_lat, True), to_cute(counter), to_cute(gamma), to_cute(normed, True), cu_stream(stream))
