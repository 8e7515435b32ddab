"""GEMM1 + SiTU-GLU of the routed experts on the tensor cores (batches of 5 to 64 tokens: dispatch.py), grouped by
the router's plan: each active expert's w13 rows are read once per step however many tokens chose it."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float16, Int32, Int64, Uint8

from .common import FP4_GROUP, WARP, bulk_copy_to_shared, expect_bulk_bytes, situ_glu
from .fp4_mma import (
    GEMM1_COLUMNS,
    GEMM1_GROUPS_IN_FLIGHT,
    ROW_PAD,
    SMEM_SLACK,
    WARPS_PER_CTA,
    check_mma_experts,
    group_span_mma,
    prefetch_activations,
    token_row,
)
from .mma import MMA_ROWS, TILE_TOKENS, alloc_tile_scratch, reduce_tiles, scratch_bytes, zero_tiles
from .norm_tail import zero_y_lat
from .expert_args import expect_gemm1, fake_gemm1


class ExpertsGemm1SituMma:
    """a[p, j] = situ_glu(x_lat[t] . w13[e, j], x_lat[t] . w13[e, I + j]) for every planned pair p = t*k + slot, on
    the tensor cores; zeroes y_lat for GEMM2. CTA (slot, tile) computes a's columns 8*tile .. 8*tile + 7 of the slot's
    pairs: MMA rows g are gate rows j0 + g, rows g + 8 the matching up rows. The CTA's 16 packed rows and their scales
    (30 KB at L = 3584) come into shared memory by bulk copies in one round trip; its 8 warps split the K groups (14
    each at L = 3584) and meet in shared memory; threads (token, column) then apply SiTU-GLU to the totals. Lets GEMM2
    (launched early) start at once.
    Tensors: x_lat [M, L] fp16, w13 [E, 2I, L/2] uint8, s13 [E, 2I, L/32] uint8, plan (router.ExpertPlan),
    a [M*k, I] fp16, y_lat [M, L] fp32."""

    def __init__(self, experts: int, latent: int, inter: int, top_k: int, in_flight: int = GEMM1_GROUPS_IN_FLIGHT):
        check_mma_experts(latent, inter)  # latent % 256 == 0: the 8 warps get whole, equal shares of the K groups
        self.e, self.l, self.i, self.k, self.in_flight = experts, latent, inter, top_k, in_flight
        self.row_stride = latent // 2 + ROW_PAD
        self.scale_row = latent // FP4_GROUP
        self.stage_bytes = MMA_ROWS * (latent // 2 + self.scale_row)  # what the bulk copies bring

    def smem_bytes(self) -> int:
        return scratch_bytes(TILE_TOKENS) + MMA_ROWS * (self.row_stride + self.scale_row) + SMEM_SLACK

    @cute.jit
    def __call__(self, x_lat, w13, s13, n_active, slot_expert, slot_count, slot_pairs, a, y_lat, stream: cuda.CUstream):
        m = x_lat.shape[0]
        slots = cutlass.min(m * self.k, self.e)
        self.kernel(x_lat, w13, s13, n_active, slot_expert, slot_count, slot_pairs, a, y_lat, m).launch(
            grid=[slots, self.i // GEMM1_COLUMNS, 1], block=[WARPS_PER_CTA * WARP, 1, 1],
            smem=self.smem_bytes(), stream=stream,
        )

    @cute.kernel
    def kernel(self, x_lat, w13, s13, n_active, slot_expert, slot_count, slot_pairs, a, y_lat, m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        slot, tile, _ = cute.arch.block_idx()
        grid_x, grid_y, _ = cute.arch.grid_dim()
        # GEMM2 (launched early) may take the SM room this grid frees: it stages its weights, then waits for us.
        cute.arch.griddepcontrol_launch_dependents()
        smem = cutlass.memory.SmemAllocator()
        scratch = alloc_tile_scratch(smem, TILE_TOKENS)
        stage = smem.allocate_tensor(Uint8, cute.make_layout(MMA_ROWS * (self.row_stride + self.scale_row)),
                                     byte_alignment=128)
        barrier = smem.allocate_tensor(Int64, cute.make_layout(1), byte_alignment=8)
        zero_y_lat(y_lat, (tile * grid_x + slot) * WARPS_PER_CTA * WARP + tidx, grid_x * grid_y * WARPS_PER_CTA * WARP,
                   m_count, self.l)
        if slot < n_active[0]:
            warp, lane = tidx // WARP, tidx % WARP
            g, q = lane // 4, lane % 4
            j0 = tile * GEMM1_COLUMNS
            expert = slot_expert[slot]
            count = slot_count[slot]
            n_tiles = (count + TILE_TOKENS - 1) // TILE_TOKENS
            packed: cutlass.Constexpr = self.l // 2
            groups: cutlass.Constexpr = self.l // FP4_GROUP
            per_warp: cutlass.Constexpr = groups // WARPS_PER_CTA
            first_row = Int64(expert) * (2 * self.i) + Int64(j0)
            # Stage rows r < 8: gate row j0 + r; r >= 8: up row I + j0 + r - 8 (the MMA's rows g and g + 8).
            # Warp w copies gate row w (lane 0) and up row w (lane 1); lane 2 of warps 0 and 1 the scales.
            expect_bulk_bytes(barrier, tidx, self.stage_bytes)
            stage_addr = stage.iterator.toint()
            scales_addr = stage_addr + MMA_ROWS * self.row_stride
            if lane < 2:
                row = first_row + Int64(warp + lane * self.i)
                bulk_copy_to_shared(stage_addr + (warp + lane * 8) * self.row_stride,
                                    w13.iterator.toint() + row * packed, packed, barrier.iterator.toint())
            elif lane == 2 and warp < 2:
                bulk_copy_to_shared(scales_addr + warp * 8 * groups,
                                    s13.iterator.toint() + (first_row + Int64(warp * self.i)) * groups,
                                    8 * groups, barrier.iterator.toint())
            prefetch_activations(token_row(slot_pairs, slot, count, g, self.k, True, x_lat.iterator.toint(),
                                           self.l * 2, q), q, warp * per_warp, per_warp)
            cute.arch.mbarrier_wait(barrier.iterator, 0)
            w_g, w_g8 = stage_addr + g * self.row_stride, stage_addr + (g + 8) * self.row_stride
            s_g, s_g8 = scales_addr + g * groups, scales_addr + (g + 8) * groups
            for t in cutlass.range(n_tiles, unroll=1):
                x_row = token_row(slot_pairs, slot, count, t * TILE_TOKENS + g, self.k, True, x_lat.iterator.toint(),
                                  self.l * 2, q)
                acc = zero_tiles(1)
                group_span_mma(acc, x_row, w_g, w_g8, s_g, s_g8, warp * per_warp, q, m_count >> 31, per_warp,
                               self.in_flight)
                reduce_tiles(acc, scratch, tidx, 1)
                if tidx < TILE_TOKENS * GEMM1_COLUMNS:
                    token, j = tidx // GEMM1_COLUMNS, tidx % GEMM1_COLUMNS
                    column = t * TILE_TOKENS + token
                    if column < count:
                        gate, up = scratch[0, token, j], scratch[0, token, j + GEMM1_COLUMNS]
                        a[slot_pairs[slot, column], j0 + j] = situ_glu(gate, up).to(Float16)
                cute.arch.sync_threads()  # the next tile's reduce_tiles overwrites scratch


def experts_gemm1_mma(x_lat, w13, s13, plan, top_k: int, a, y_lat, stream) -> None:
    """ExpertsGemm1SituMma on `stream`: a[M*k, I] = SiTU-GLU of each planned pair's GEMM1; zeroes y_lat [M, L]."""
    from .runtime import compile_cached, cu_stream, to_cute

    m, latent, experts, inter = expect_gemm1(x_lat, w13, s13, plan, top_k, a, y_lat)

    def build():
        args = fake_gemm1(experts, latent, inter)
        return ExpertsGemm1SituMma(experts, latent, inter, top_k), args

    fn = compile_cached(("experts_gemm1_mma", experts, latent, inter, top_k), build)
    fn(to_cute(x_lat, True), to_cute(w13), to_cute(s13), *(to_cute(t) for t in plan), to_cute(a, True),
       to_cute(y_lat, True), cu_stream(stream))
