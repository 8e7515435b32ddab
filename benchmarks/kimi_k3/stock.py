"""Stock-like decode of one Kimi K3 layer on the GPU: the op sequence vLLM's stock path launches on Hopper.

This is the baseline every specialized kernel is measured against, so it launches what stock launches:
dense projections through cuBLAS (torch), and separate kernels for each norm, activation, routing and combine
step, written in Triton where vLLM uses Triton. bf16 activations and weights, fp32 where vLLM keeps fp32 (router
logits, KDA conv taps / A_log / dt_bias / norm weight / recurrent state, MoE correction bias).

Per layer, in order (one rank; TP collectives are not part of a single-GPU per-rank measurement):
  AttnRes mix before attention ........ Triton (vLLM: Triton `_attn_res_kernel` on SM90)
  KDA: in_proj GEMM, f_b GEMM ......... cuBLAS
       causal conv update + SiLU ...... Triton (vLLM: Triton `causal_conv1d_update`)
       gated delta-rule step .......... Triton (vLLM: fla-style `fused_recurrent_kda_packed_decode`)
       gated RMSNorm .................. Triton (vLLM: fla `FusedRMSNormGated`)
       o_proj GEMM .................... cuBLAS
  MLA: qkv_a+gate GEMM, q_a/kv_a norms, q_b GEMM, W_UK bmm, query concat + cache insert (one Triton kernel,
       as vLLM's fused one), split-KV paged MQA decode + combine (Triton), W_UV bmm, sigmoid gate, o_proj GEMM
  AttnRes mix before the MoE .......... Triton
  MoE: router GEMM (fp32 out), down-proj GEMM, routing (sigmoid + bias + top-k + renormalize, one kernel),
       sort by expert, W4A16 grouped expert GEMM w13, SiTU-GLU, W4A16 grouped GEMM w2 (times the routing
       weight), sum over top-k, latent RMSNorm, shared gate_up GEMM, SiTU-GLU, shared down GEMM,
       up-proj GEMM accumulating the shared output (addmm, as vLLM's `residual.addmm_`)
  Dense MLP (layer 0 only) ............ gate_up GEMM (cuBLAS), SiTU-GLU (Triton), down GEMM (cuBLAS)

Where and why this differs from vLLM's real SM90 path:
  - Experts: Hopper has no FP4 tensor cores, so stock runs MXFP4 experts W4A16 through Marlin/Humming CUDA
    kernels (moe_align_block_size + one grouped GEMM per projection). Those kernels are not in this repository,
    so ours is a Triton W4A16 grouped GEMM with the same structure: pairs sorted by expert (torch.sort instead
    of moe_align_block_size), each expert's weight tile dequantized in registers once for all its tokens, bf16
    tensor-core dot, fp32 accumulate, tiles autotuned per shape. Measured on the H200 it is far above its byte
    floor and dominates the layer above batch 2 (kimi_k3_path/evidence/README.md), so it is very likely slower
    than Marlin: treat the baseline's MoE time as an upper bound on stock's. At TP16 stock pads the per-rank
    intermediate 192 -> 256 with zeros (`expert_intermediate_stock`); `GpuMoe.from_reference(...,
    pad_intermediate=256)` reproduces that.
  - KDA: on SM90 vLLM prefers its native CUDA `fused_kda_decode` op (conv + recurrent step + gated norm in one
    launch) when the `_C` extension has it; we run the Triton fallback sequence (3 launches), which is what
    stock runs when that op is absent.
  - MLA attention: stock uses FlashMLA / FlashAttention-MLA CUDA kernels; ours is a Triton split-KV MQA kernel
    over the same paged 576-wide bf16 cache, plus a combine kernel.
  - Dense GEMMs: stock picks skinny-GEMM configs from an H200-measured table (`low_latency_gemm.py`) and overlaps
    the router with the down-projection (and the MLA gate GEMM) on an aux stream; we call cuBLAS serially.
  - State and cache are indexed by batch row (no state-index indirection).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
import triton
import triton.language as tl

from kimi_k3_path.reference.kda import KdaDims, KdaWeights
from kimi_k3_path.reference.layers import DenseMlpWeights, LayerNorms, LayerPosition
from kimi_k3_path.reference.mla import MlaDims, MlaWeights, PagedLatentCache
from kimi_k3_path.reference.moe import MoeDims, MoeWeights

# --------------------------------------------------------------------------------------------------------------
# Triton kernels

# Tensor-core operands are bf16 on the GPU. Triton's CPU interpreter (TRITON_INTERPRET=1, used by the bench's
# --cpu-smoke) multiplies bf16 dot operands as raw bits, so there the dots run in fp32.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_DOT = tl.float32 if _INTERPRET else tl.bfloat16


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _tanh(x):
    # tanh(x) = 2 sigmoid(2x) - 1, exact in real arithmetic and stable at both ends in fp32.
    return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, x_stride, out_stride, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + offs, (x * inv * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _situ_mul_kernel(x_ptr, out_ptr, x_stride, out_stride, inter, beta, linear_beta, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    g = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * x_stride + inter + offs, mask=mask, other=0.0).to(tl.float32)
    a = beta * _tanh(g / beta) * _sigmoid(g) * (linear_beta * _tanh(u / linear_beta))
    tl.store(out_ptr + row * out_stride + offs, a.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _attn_res_kernel(
    prefix_ptr, delta_ptr, blocks_ptr, res_norm_ptr, res_proj_ptr, out_norm_ptr, out_ptr,
    blocks_stride_m, blocks_stride_b, hidden, eps, out_eps,
    NUM_BLOCKS: tl.constexpr, WRITE_BLOCK: tl.constexpr, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    prefix = tl.load(prefix_ptr + row * hidden + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:
        prefix += tl.load(delta_ptr + row * hidden + offs, mask=mask, other=0.0).to(tl.float32)
        # The stream is bf16: score and mix the rounded prefix, as the stored one will be.
        prefix = prefix.to(prefix_ptr.dtype.element_ty).to(tl.float32)
        tl.store(prefix_ptr + row * hidden + offs, prefix.to(prefix_ptr.dtype.element_ty), mask=mask)
    if WRITE_BLOCK >= 0:
        tl.store(blocks_ptr + row * blocks_stride_m + WRITE_BLOCK * blocks_stride_b + offs,
                 prefix.to(blocks_ptr.dtype.element_ty), mask=mask)
    query = tl.load(res_norm_ptr + offs, mask=mask, other=0.0).to(tl.float32) * tl.load(
        res_proj_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # Online softmax over the sources: the completed blocks, then the prefix.
    best = tl.sum(prefix * query, axis=0) / tl.sqrt(tl.sum(prefix * prefix, axis=0) / hidden + eps)
    denom = 1.0
    mixed = prefix
    for b in tl.static_range(NUM_BLOCKS):
        src = tl.load(blocks_ptr + row * blocks_stride_m + b * blocks_stride_b + offs, mask=mask, other=0.0).to(tl.float32)
        logit = tl.sum(src * query, axis=0) / tl.sqrt(tl.sum(src * src, axis=0) / hidden + eps)
        new_best = tl.maximum(best, logit)
        old_scale = tl.exp(best - new_best)
        p = tl.exp(logit - new_best)
        denom = denom * old_scale + p
        mixed = mixed * old_scale + p * src
        best = new_best
    mixed = mixed / denom
    inv = 1.0 / tl.sqrt(tl.sum(mixed * mixed, axis=0) / hidden + out_eps)
    w = tl.load(out_norm_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * hidden + offs, (mixed * inv * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _conv_update_kernel(
    x_ptr, state_ptr, w_ptr, out_ptr, x_stride, channels, WIDTH: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = ch < channels
    x = tl.load(x_ptr + row * x_stride + ch, mask=mask, other=0.0).to(tl.float32)
    state_row = state_ptr + (row * channels + ch) * (WIDTH - 1)
    acc = x * tl.load(w_ptr + ch * WIDTH + (WIDTH - 1), mask=mask, other=0.0)
    for j in tl.static_range(WIDTH - 1):
        s = tl.load(state_row + j, mask=mask, other=0.0).to(tl.float32)
        acc += s * tl.load(w_ptr + ch * WIDTH + j, mask=mask, other=0.0)
        # Shift the window: slot j takes slot j+1, the last slot takes the new input.
        if j < WIDTH - 2:
            nxt = tl.load(state_row + j + 1, mask=mask, other=0.0)
            tl.store(state_row + j, nxt, mask=mask)
        else:
            tl.store(state_row + j, x.to(state_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + row * channels + ch, (acc * _sigmoid(acc)).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _kda_step_kernel(
    qkv_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, state_ptr, out_ptr,
    g_stride, beta_stride, lower_bound, scale,
    HEADS: tl.constexpr, D: tl.constexpr, BV: tl.constexpr,
):
    iv = tl.program_id(0)
    ib = tl.program_id(1)
    m = (ib // HEADS).to(tl.int64)
    h = ib % HEADS
    ok = tl.arange(0, D)
    ov = iv * BV + tl.arange(0, BV)
    proj = HEADS * D
    base = qkv_ptr + m * 3 * proj
    q = tl.load(base + h * D + ok).to(tl.float32)
    k = tl.load(base + proj + h * D + ok).to(tl.float32)
    v = tl.load(base + 2 * proj + h * D + ov).to(tl.float32)
    q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
    k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
    g = tl.load(g_ptr + m * g_stride + h * D + ok).to(tl.float32) + tl.load(dt_bias_ptr + h * D + ok)
    gate = lower_bound * _sigmoid(tl.exp(tl.load(a_log_ptr + h)) * g)
    beta = _sigmoid(tl.load(beta_ptr + m * beta_stride + h).to(tl.float32))
    s_ptrs = state_ptr + ((m * HEADS + h) * D + ov[:, None]) * D + ok[None, :]
    s = tl.load(s_ptrs) * tl.exp(gate)[None, :]
    v = beta * (v - tl.sum(s * k[None, :], axis=1))
    s += v[:, None] * k[None, :]
    tl.store(out_ptr + (m * HEADS + h) * D + ov, tl.sum(s * q[None, :], axis=1).to(out_ptr.dtype.element_ty))
    tl.store(s_ptrs, s)


@triton.jit
def _gated_rms_norm_kernel(x_ptr, g_ptr, w_ptr, out_ptr, g_stride, eps, HEADS: tl.constexpr, D: tl.constexpr):
    ib = tl.program_id(0)
    m = (ib // HEADS).to(tl.int64)
    h = ib % HEADS
    offs = tl.arange(0, D)
    x = tl.load(x_ptr + (m * HEADS + h) * D + offs).to(tl.float32)
    g = tl.load(g_ptr + m * g_stride + h * D + offs).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    y = x * inv * tl.load(w_ptr + offs).to(tl.float32) * _sigmoid(g)
    tl.store(out_ptr + (m * HEADS + h) * D + offs, y.to(out_ptr.dtype.element_ty))


@triton.jit
def _route_kernel(
    logits_ptr, bias_ptr, ids_ptr, weights_ptr, experts, scaling,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, BLOCK_E: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    mask = offs < experts
    scores = _sigmoid(tl.load(logits_ptr + row * experts + offs, mask=mask, other=0.0))
    key = tl.where(mask, scores + tl.load(bias_ptr + offs, mask=mask, other=0.0), float("-inf"))
    slots = tl.arange(0, K_PAD)
    chosen_ids = tl.zeros([K_PAD], dtype=tl.int32)
    chosen_scores = tl.zeros([K_PAD], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.max(key, axis=0)
        idx = tl.min(tl.where(key == best, offs, BLOCK_E), axis=0)  # ties: the lower expert index
        chosen_ids = tl.where(slots == j, idx, chosen_ids)
        chosen_scores = tl.where(slots == j, tl.sum(tl.where(offs == idx, scores, 0.0), axis=0), chosen_scores)
        key = tl.where(offs == idx, float("-inf"), key)
    weights = chosen_scores / tl.sum(chosen_scores, axis=0) * scaling
    keep = slots < TOP_K
    tl.store(ids_ptr + row * TOP_K + slots, chosen_ids, mask=keep)
    tl.store(weights_ptr + row * TOP_K + slots, weights, mask=keep)


@triton.jit
def _e2m1(nibble):
    exponent = (nibble >> 1) & 3
    mantissa = (nibble & 1).to(tl.float32)
    mag = tl.where(exponent == 0, mantissa * 0.5, (1.0 + 0.5 * mantissa) * tl.exp2((exponent - 1).to(tl.float32)))
    return tl.where((nibble & 8) != 0, -mag, mag)


@triton.jit
def _moe_w4a16_kernel(
    a_ptr, w_ptr, s_ptr, sorted_expert_ptr, sorted_pair_ptr, pair_weight_ptr, out_ptr,
    pairs, n, k, a_stride, out_stride,
    TOP_K: tl.constexpr, A_PER_TOKEN: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
):
    """Grouped W4A16 GEMM over (token, expert) pairs sorted by expert: the program at the first pair of an
    expert's run computes that expert's output tile for all its pairs (one dequantized weight read)."""
    p = tl.program_id(0)
    expert = tl.load(sorted_expert_ptr + p)
    previous = tl.load(sorted_expert_ptr + tl.maximum(p - 1, 0))
    # Only the program at the first pair of an expert's run works; the others have nothing to do.
    if (p == 0) | (previous != expert):
        rows = p + tl.arange(0, BLOCK_M)
        row_ok = rows < pairs
        row_ok = row_ok & (tl.load(sorted_expert_ptr + rows, mask=row_ok, other=-1) == expert)
        pair = tl.load(sorted_pair_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        if A_PER_TOKEN:
            a_row = pair // TOP_K
        else:
            a_row = pair
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < n
        kb = tl.arange(0, BLOCK_K // 2)
        e64 = expert.to(tl.int64)
        w_rows = w_ptr + (e64 * n + cols[:, None]) * (k // 2)
        s_rows = s_ptr + (e64 * n + cols[:, None]) * (k // 32)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, k, BLOCK_K):
            byte = k0 // 2 + kb
            packed = tl.load(w_rows + byte[None, :], mask=col_ok[:, None], other=0).to(tl.int32)
            scale = tl.exp2(tl.load(s_rows + (byte // 16)[None, :], mask=col_ok[:, None], other=127).to(tl.float32) - 127.0)
            w_even = (_e2m1(packed & 15) * scale).to(DOT)
            w_odd = (_e2m1(packed >> 4) * scale).to(DOT)
            a_base = a_ptr + a_row[:, None] * a_stride + 2 * byte[None, :]
            a_even = tl.load(a_base, mask=row_ok[:, None], other=0.0).to(DOT)
            a_odd = tl.load(a_base + 1, mask=row_ok[:, None], other=0.0).to(DOT)
            acc += tl.dot(a_even, tl.trans(w_even))
            acc += tl.dot(a_odd, tl.trans(w_odd))
        if MUL_WEIGHT:
            acc *= tl.load(pair_weight_ptr + pair, mask=row_ok, other=0.0)[:, None]
        tl.store(out_ptr + pair[:, None] * out_stride + cols[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & col_ok[None, :])


def _prune_w4a16_configs(configs: list[Any], named_args: dict[str, Any], **_: Any) -> list[Any]:
    """Keep the tilings whose K step divides this projection's K (32-element MX groups stay whole)."""
    k = named_args["k"]
    fitting = [c for c in configs if k % c.kwargs["BLOCK_K"] == 0]
    return fitting or [triton.Config({"BLOCK_N": 64, "BLOCK_K": _block_k(k)}, num_warps=4)]


# Stock's MoE GEMMs run with per-shape tuned tiles; the stock-like kernel gets the same courtesy: the best of
# these tilings, chosen on first use per (N, K, BLOCK_M) on the machine that runs it.
_W4A16_CONFIGS = [
    triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=warps)
    for bn, bk, warps in ((64, 64, 4), (32, 128, 4), (64, 128, 4), (64, 256, 8), (128, 128, 8))
]
_moe_w4a16_tuned = triton.autotune(
    configs=_W4A16_CONFIGS, key=["n", "k", "BLOCK_M"], prune_configs_by={"early_config_prune": _prune_w4a16_configs}
)(_moe_w4a16_kernel)


@triton.jit
def _mla_concat_insert_kernel(
    ql_ptr, q_pe_ptr, kv_ptr, k_pe_ptr, slot_ptr, mqa_ptr, cache_ptr,
    ql_stride_m, ql_stride_h, q_pe_stride_m, q_pe_stride_h, k_pe_stride,
    HEADS: tl.constexpr, LORA: tl.constexpr, ROPE: tl.constexpr,
):
    """mqa_q[m, h] = [ql_nope | q_pe]; program h == HEADS also writes the token's cache row [kv_c | k_pe]."""
    m = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    lo = tl.arange(0, LORA)
    ro = tl.arange(0, ROPE)
    row = LORA + ROPE
    if h < HEADS:
        dst = mqa_ptr + (m * HEADS + h) * row
        tl.store(dst + lo, tl.load(ql_ptr + m * ql_stride_m + h * ql_stride_h + lo))
        tl.store(dst + LORA + ro, tl.load(q_pe_ptr + m * q_pe_stride_m + h * q_pe_stride_h + ro))
    else:
        dst = cache_ptr + tl.load(slot_ptr + m).to(tl.int64) * row
        tl.store(dst + lo, tl.load(kv_ptr + m * LORA + lo))
        tl.store(dst + LORA + ro, tl.load(k_pe_ptr + m * k_pe_stride + ro))


@triton.jit
def _mla_decode_kernel(
    q_ptr, cache_ptr, table_ptr, seq_lens_ptr, out_ptr, lse_ptr,
    table_stride, scale, heads,
    SPLITS: tl.constexpr, H_PAD: tl.constexpr, LORA: tl.constexpr, ROPE: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr,
):
    """One (sequence, split) of MQA over the paged latent cache: all heads share each cache row."""
    m = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + m)
    per_split = tl.cdiv(tl.cdiv(seq_len, SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)
    hs = tl.arange(0, H_PAD)
    h_ok = hs < heads
    lo = tl.arange(0, LORA)
    ro = tl.arange(0, ROPE)
    row = LORA + ROPE
    q_rows = q_ptr + (m * heads + hs[:, None]) * row
    q_nope = tl.load(q_rows + lo[None, :], mask=h_ok[:, None], other=0.0).to(DOT)
    q_pe = tl.load(q_rows + LORA + ro[None, :], mask=h_ok[:, None], other=0.0).to(DOT)
    best = tl.full([H_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([H_PAD], tl.float32)
    acc = tl.zeros([H_PAD, LORA], tl.float32)
    for t0 in range(start, end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        t_ok = t < end
        page = tl.load(table_ptr + m * table_stride + t // PAGE, mask=t_ok, other=0).to(tl.int64)
        rows = cache_ptr + (page * PAGE + t % PAGE)[:, None] * row
        k_nope = tl.load(rows + lo[None, :], mask=t_ok[:, None], other=0.0).to(DOT)
        k_pe = tl.load(rows + LORA + ro[None, :], mask=t_ok[:, None], other=0.0).to(DOT)
        s = (tl.dot(q_nope, tl.trans(k_nope)) + tl.dot(q_pe, tl.trans(k_pe))) * scale
        s = tl.where(t_ok[None, :], s, float("-inf"))
        new_best = tl.maximum(best, tl.max(s, axis=1))
        p = tl.exp(s - new_best[:, None])
        old_scale = tl.exp(best - new_best)
        denom = denom * old_scale + tl.sum(p, axis=1)
        acc = acc * old_scale[:, None] + tl.dot(p.to(DOT), k_nope)
        best = new_best
    part = (m * SPLITS + split) * H_PAD + hs
    if start < end:
        tl.store(out_ptr + part[:, None] * LORA + lo[None, :], acc / denom[:, None])
        tl.store(lse_ptr + part, best + tl.log(denom))
    else:
        tl.store(lse_ptr + part, tl.full([H_PAD], float("-inf"), tl.float32))


@triton.jit
def _mla_combine_kernel(part_ptr, lse_ptr, out_ptr, heads, SPLITS: tl.constexpr, H_PAD: tl.constexpr, LORA: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    sp = tl.arange(0, SPLITS)
    lse = tl.load(lse_ptr + (m * SPLITS + sp) * H_PAD + h)
    w = tl.exp(lse - tl.max(lse, axis=0))
    w = w / tl.sum(w, axis=0)
    lo = tl.arange(0, LORA)
    live = lse > float("-inf")
    parts = tl.load(part_ptr + ((m * SPLITS + sp) * H_PAD + h)[:, None] * LORA + lo[None, :], mask=live[:, None], other=0.0)
    tl.store(out_ptr + (m * heads + h) * LORA + lo, tl.sum(parts * w[:, None], axis=0).to(out_ptr.dtype.element_ty))


@triton.jit
def _sigmoid_gate_kernel(x_ptr, g_ptr, out_ptr, g_stride, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < width
    x = tl.load(x_ptr + row * width + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * g_stride + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * width + offs, (x * _sigmoid(g)).to(out_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------------------------
# Op wrappers (each one launch, except where the docstring says otherwise)

_ACT = torch.bfloat16


def _pow2(n: int) -> int:
    return triton.next_power_of_2(n)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rows of a (possibly column-sliced) 2-D tensor; the last dimension must be contiguous."""
    rows, n = x.shape
    out = torch.empty(rows, n, dtype=_ACT, device=x.device) if out is None else out
    _rms_norm_kernel[(rows,)](x, weight, out, x.stride(0), out.stride(0), n, eps, BLOCK=_pow2(n), num_warps=8 if n > 2048 else 4)
    return out


def situ_mul(gate_up: torch.Tensor, beta: float = 4.0, linear_beta: float = 25.0) -> torch.Tensor:
    rows, width = gate_up.shape
    inter = width // 2
    out = torch.empty(rows, inter, dtype=_ACT, device=gate_up.device)
    block = min(1024, _pow2(inter))
    _situ_mul_kernel[(rows, triton.cdiv(inter, block))](gate_up, out, gate_up.stride(0), out.stride(0), inter, beta, linear_beta, BLOCK=block)
    return out


def attn_res(
    prefix: torch.Tensor, delta: torch.Tensor | None, blocks: torch.Tensor, num_blocks: int, write_block: int,
    res_norm: torch.Tensor, res_proj: torch.Tensor, out_norm: torch.Tensor, eps: float, out_eps: float,
) -> torch.Tensor:
    """Updates `prefix` (+= delta) and `blocks[:, write_block]` in place, returns the normed mix."""
    rows, hidden = prefix.shape
    out = torch.empty_like(prefix)
    _attn_res_kernel[(rows,)](
        prefix, prefix if delta is None else delta, blocks, res_norm, res_proj, out_norm, out,
        blocks.stride(0), blocks.stride(1), hidden, eps, out_eps,
        NUM_BLOCKS=num_blocks, WRITE_BLOCK=write_block, HAS_DELTA=delta is not None, BLOCK=_pow2(hidden),
        num_warps=8,
    )
    return out


def _mm_fp32_out(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """bf16 x bf16 -> fp32 logits in one GEMM (vLLM's GateLinear out_dtype=fp32)."""
    if x.is_cuda:
        try:
            return torch.mm(x, w.t(), out_dtype=torch.float32)
        except TypeError:  # torch without mm(out_dtype=): an fp32 GEMM on upcast copies, say so once
            _warn_once("torch.mm has no out_dtype here: the router GEMM runs in fp32 on upcast copies")
    return x.float() @ w.float().t()


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        import warnings

        warnings.warn(message, RuntimeWarning, stacklevel=3)


# --------------------------------------------------------------------------------------------------------------
# GPU weights


_KEEP_FP32 = {"conv", "a_log", "dt_bias", "o_norm", "router_bias"}


def _to_device(obj: Any, device: torch.device | str, keep_fp32: set[str]) -> dict[str, torch.Tensor]:
    out = {}
    for f in fields(obj):
        t = getattr(obj, f.name)
        if t.dtype == torch.uint8:
            out[f.name] = t.to(device).contiguous()
        else:
            out[f.name] = t.to(device=device, dtype=torch.float32 if f.name in keep_fp32 else _ACT).contiguous()
    return out


@dataclass(frozen=True)
class GpuNorms:
    attn_res_norm: torch.Tensor
    attn_res_proj: torch.Tensor
    input_norm: torch.Tensor
    mlp_res_norm: torch.Tensor
    mlp_res_proj: torch.Tensor
    post_attn_norm: torch.Tensor
    eps: float

    @staticmethod
    def from_reference(n: LayerNorms, device: torch.device | str) -> GpuNorms:
        def dev(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=_ACT).contiguous()

        return GpuNorms(
            dev(n.attn.res_norm), dev(n.attn.res_proj), dev(n.attn.out_norm),
            dev(n.mlp.res_norm), dev(n.mlp.res_proj), dev(n.mlp.out_norm), n.eps,
        )


@dataclass(frozen=True)
class GpuKda:
    in_proj: torch.Tensor
    f_b: torch.Tensor
    conv: torch.Tensor
    a_log: torch.Tensor
    dt_bias: torch.Tensor
    o_norm: torch.Tensor
    o_proj: torch.Tensor

    @staticmethod
    def from_reference(w: KdaWeights, device: torch.device | str) -> GpuKda:
        return GpuKda(**_to_device(w, device, _KEEP_FP32))


@dataclass(frozen=True)
class GpuMla:
    qkv_a: torch.Tensor
    q_a_norm: torch.Tensor
    kv_a_norm: torch.Tensor
    q_b: torch.Tensor
    w_uk_t: torch.Tensor  # [heads, nope, kv_lora]: bmm(q_nope [h, M, nope], w_uk_t) -> [h, M, kv_lora]
    w_uv: torch.Tensor  # [heads, kv_lora, v]
    o_proj: torch.Tensor

    @staticmethod
    def from_reference(w: MlaWeights, d: MlaDims, device: torch.device | str) -> GpuMla:
        w_uk, w_uv = w.absorbed(d)
        t = _to_device(w, device, set())
        return GpuMla(
            qkv_a=t["qkv_a"], q_a_norm=t["q_a_norm"], kv_a_norm=t["kv_a_norm"], q_b=t["q_b"],
            w_uk_t=w_uk.to(device=device, dtype=_ACT).contiguous(),
            w_uv=w_uv.transpose(1, 2).to(device=device, dtype=_ACT).contiguous(),
            o_proj=t["o_proj"],
        )


@dataclass(frozen=True)
class GpuDense:
    """The dense SiTU MLP of layer 0: gate rows then up rows, as vLLM merges them."""

    gate_up: torch.Tensor  # [2*I, H] bf16
    down: torch.Tensor  # [H, I] bf16

    @staticmethod
    def from_reference(w: DenseMlpWeights, device: torch.device | str) -> GpuDense:
        return GpuDense(**_to_device(w, device, set()))


def dense_mlp(x: torch.Tensor, w: GpuDense) -> torch.Tensor:
    """Layer 0's MLP as stock runs it: gate_up GEMM, SiTU-GLU, down GEMM."""
    return situ_mul(x @ w.gate_up.t()) @ w.down.t()


def pad_expert_intermediate(w: MoeWeights, inter: int, padded: int) -> MoeWeights:
    """Zero-pad each expert's intermediate from `inter` to `padded` rows (w13: gate and up halves separately;
    w2: columns), as stock vLLM does at TP16. Zero weights add exactly zero: situ_glu(0, 0) = 0."""
    if padded == inter:
        return w
    if padded < inter or padded % 32:
        raise ValueError(f"pad_expert_intermediate: cannot pad {inter} to {padded}")
    extra = padded - inter

    def pad_rows(t: torch.Tensor, fill: int) -> torch.Tensor:
        gate, up = t.split(inter, dim=1)
        pad = torch.full((t.shape[0], extra, t.shape[2]), fill, dtype=t.dtype, device=t.device)
        return torch.cat([gate, pad, up, pad], dim=1)

    def pad_cols(t: torch.Tensor, width: int, fill: int) -> torch.Tensor:
        return torch.cat([t, torch.full((*t.shape[:2], width), fill, dtype=t.dtype, device=t.device)], dim=2)

    return MoeWeights(**{
        **{f.name: getattr(w, f.name) for f in fields(w)},
        "w13_packed": pad_rows(w.w13_packed, 0), "w13_scales": pad_rows(w.w13_scales, 127),
        "w2_packed": pad_cols(w.w2_packed, extra // 2, 0), "w2_scales": pad_cols(w.w2_scales, extra // 32, 127),
    })


@dataclass(frozen=True)
class GpuMoe:
    router: torch.Tensor
    router_bias: torch.Tensor
    down: torch.Tensor
    w13_packed: torch.Tensor
    w13_scales: torch.Tensor
    w2_packed: torch.Tensor
    w2_scales: torch.Tensor
    latent_norm: torch.Tensor
    up: torch.Tensor
    shared13: torch.Tensor
    shared2: torch.Tensor

    @property
    def intermediate(self) -> int:
        return self.w13_packed.shape[1] // 2

    @staticmethod
    def from_reference(w: MoeWeights, d: MoeDims, device: torch.device | str, pad_intermediate: int | None = None) -> GpuMoe:
        if pad_intermediate is not None:
            w = pad_expert_intermediate(w, d.intermediate, pad_intermediate)
        return GpuMoe(**_to_device(w, device, _KEEP_FP32))


# --------------------------------------------------------------------------------------------------------------
# The stock-like layer


def _block_k(k: int) -> int:
    for block in (128, 64, 32):
        if k % block == 0:
            return block
    raise ValueError(f"expert K={k} is not a multiple of 32")


def grouped_w4a16(
    a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, sorted_expert: torch.Tensor, sorted_pair: torch.Tensor,
    top_k: int, a_per_token: bool, pair_weight: torch.Tensor | None, out_dtype: torch.dtype,
) -> torch.Tensor:
    """out[pair] = a[row(pair)] @ deq(W[expert(pair)])^T (times the pair's routing weight when given)."""
    pairs = sorted_pair.numel()
    n, k = packed.shape[1], packed.shape[2] * 2
    out = torch.empty(pairs, n, dtype=out_dtype, device=a.device)
    tokens = pairs // top_k
    block_m = max(16, _pow2(tokens))  # a token picks an expert at most once: an expert's run is <= M pairs
    args = (a, packed, scales, sorted_expert, sorted_pair, pair_weight if pair_weight is not None else a, out,
            pairs, n, k, a.stride(0), out.stride(0))
    flags = dict(TOP_K=top_k, A_PER_TOKEN=a_per_token, MUL_WEIGHT=pair_weight is not None, BLOCK_M=block_m, DOT=_DOT)
    if _INTERPRET:  # one fixed tiling: autotuning in the CPU interpreter would only multiply its run time
        _moe_w4a16_kernel[(pairs, triton.cdiv(n, 64))](*args, **flags, BLOCK_N=64, BLOCK_K=_block_k(k))
    else:
        _moe_w4a16_tuned[lambda meta: (pairs, triton.cdiv(n, meta["BLOCK_N"]))](*args, **flags)
    return out


def route(x: torch.Tensor, w: GpuMoe, d: MoeDims) -> tuple[torch.Tensor, torch.Tensor]:
    logits = _mm_fp32_out(x, w.router)
    m = x.shape[0]
    ids = torch.empty(m, d.top_k, dtype=torch.int32, device=x.device)
    weights = torch.empty(m, d.top_k, dtype=torch.float32, device=x.device)
    _route_kernel[(m,)](
        logits, w.router_bias, ids, weights, d.experts, d.routed_scaling_factor,
        TOP_K=d.top_k, K_PAD=_pow2(d.top_k), BLOCK_E=_pow2(d.experts), num_warps=4,
    )
    return ids, weights


def latent_moe(x: torch.Tensor, w: GpuMoe, d: MoeDims) -> torch.Tensor:
    """x [M, H] bf16 (normed) -> [M, H] bf16."""
    ids, weights = route(x, w, d)
    x_lat = x @ w.down.t()
    sorted_expert, sorted_pair = torch.sort(ids.flatten(), stable=True)
    gate_up = grouped_w4a16(x_lat, w.w13_packed, w.w13_scales, sorted_expert, sorted_pair, d.top_k, True, None, _ACT)
    act = situ_mul(gate_up)
    y = grouped_w4a16(act, w.w2_packed, w.w2_scales, sorted_expert, sorted_pair, d.top_k, False, weights.flatten(), torch.float32)
    y_lat = y.view(x.shape[0], d.top_k, -1).sum(dim=1)
    shared = situ_mul(x @ w.shared13.t()) @ w.shared2.t()
    return torch.addmm(shared, rms_norm(y_lat, w.latent_norm, d.eps), w.up.t())


@dataclass
class GpuKdaState:
    conv: torch.Tensor  # [M, 3*proj, W-1] bf16
    recurrent: torch.Tensor  # [M, heads, D, D] fp32

    @staticmethod
    def from_reference(state: Any, device: torch.device | str) -> GpuKdaState:
        # Copies always: the state is updated in place, and `.to` returns the fp32 recurrent state itself on the CPU.
        return GpuKdaState(state.conv.to(device, _ACT, copy=True).contiguous(),
                           state.recurrent.to(device, torch.float32, copy=True).contiguous())


def kda_attention(x: torch.Tensor, w: GpuKda, state: GpuKdaState, d: KdaDims) -> torch.Tensor:
    """Updates `state` in place; returns the o_proj output [M, H] bf16."""
    m = x.shape[0]
    projected = x @ w.in_proj.t()
    p, hd = d.proj, d.head_dim
    qkv = projected[:, : 3 * p]
    g_out = projected[:, 3 * p : 4 * p]
    f_a = projected[:, 4 * p : 4 * p + hd]
    beta = projected[:, 4 * p + hd :]
    g_raw = f_a @ w.f_b.t()
    conv_out = torch.empty(m, 3 * p, dtype=_ACT, device=x.device)
    block = 256
    _conv_update_kernel[(m, triton.cdiv(3 * p, block))](
        qkv, state.conv, w.conv, conv_out, projected.stride(0), 3 * p, WIDTH=d.conv_width, BLOCK=block
    )
    core = torch.empty(m, d.heads, hd, dtype=_ACT, device=x.device)
    bv = min(32, hd)
    _kda_step_kernel[(hd // bv, m * d.heads)](
        conv_out, g_raw, beta, w.a_log, w.dt_bias, state.recurrent, core,
        g_raw.stride(0), projected.stride(0), d.gate_lower_bound, hd**-0.5,
        HEADS=d.heads, D=hd, BV=bv, num_warps=4,
    )
    normed = torch.empty_like(core)
    _gated_rms_norm_kernel[(m * d.heads,)](core, g_out, w.o_norm, normed, projected.stride(0), d.norm_eps, HEADS=d.heads, D=hd)
    return normed.view(m, p) @ w.o_proj.t()


@dataclass
class GpuLatentCache:
    pages: torch.Tensor  # [num_pages, page, row] bf16
    block_table: torch.Tensor  # [M, max_pages] int32
    seq_lens: torch.Tensor  # [M] int32
    slots: torch.Tensor  # [M] int64: flat row index of each decoded token (vLLM's slot_mapping)
    splits: int  # split-KV factor, fixed per batch shape so the launch is graph-capturable

    @staticmethod
    def from_reference(cache: PagedLatentCache, device: torch.device | str, sms: int = 132) -> GpuLatentCache:
        page = cache.pages.shape[1]
        slots = [cache.slot(i, int(n) - 1) for i, n in enumerate(cache.seq_lens.tolist())]
        return GpuLatentCache(
            pages=cache.pages.to(device, _ACT, copy=True).contiguous(),  # written in place
            block_table=cache.block_table.to(device, torch.int32).contiguous(),
            seq_lens=cache.seq_lens.to(device, torch.int32),
            slots=torch.tensor([pg * page + off for pg, off in slots], dtype=torch.int64, device=device),
            splits=split_count(len(slots), int(cache.seq_lens.max()), sms),
        )


def split_count(batch: int, max_len: int, sms: int, block_n: int = 32) -> int:
    """Enough (sequence, split) programs to cover two waves of the SMs, never more splits than token blocks."""
    want = max(1, -(-2 * sms // batch))
    return min(_pow2(want), _pow2(max(1, -(-max_len // block_n))))


def mla_attention(x: torch.Tensor, w: GpuMla, cache: GpuLatentCache, d: MlaDims) -> torch.Tensor:
    """Writes the decoded rows into `cache` in place; returns the o_proj output [M, H] bf16."""
    m, h = x.shape[0], d.heads
    projected = x @ w.qkv_a.t()
    q_c = rms_norm(projected[:, : d.q_lora], w.q_a_norm, d.eps)
    kv_c = rms_norm(projected[:, d.q_lora : d.q_lora + d.kv_lora], w.kv_a_norm, d.eps)
    k_pe = projected[:, d.q_lora + d.kv_lora : d.q_lora + d.kv_lora + d.qk_rope]
    gate = projected[:, d.q_lora + d.kv_lora + d.qk_rope :]
    q = (q_c @ w.q_b.t()).view(m, h, d.qk_head)
    ql_nope = torch.bmm(q[..., : d.qk_nope].transpose(0, 1), w.w_uk_t).transpose(0, 1)  # [M, h, kv_lora]
    mqa_q = torch.empty(m, h, d.cache_row, dtype=_ACT, device=x.device)
    _mla_concat_insert_kernel[(m, h + 1)](
        ql_nope, q[..., d.qk_nope :], kv_c, k_pe, cache.slots, mqa_q, cache.pages,
        ql_nope.stride(0), ql_nope.stride(1), q.stride(0), q.stride(1), projected.stride(0),
        HEADS=h, LORA=d.kv_lora, ROPE=d.qk_rope,
    )
    h_pad = max(16, _pow2(h))
    part = torch.empty(m, cache.splits, h_pad, d.kv_lora, dtype=torch.float32, device=x.device)
    lse = torch.empty(m, cache.splits, h_pad, dtype=torch.float32, device=x.device)
    _mla_decode_kernel[(m, cache.splits)](
        mqa_q, cache.pages, cache.block_table, cache.seq_lens, part, lse,
        cache.block_table.stride(0), d.scale, h,
        SPLITS=cache.splits, H_PAD=h_pad, LORA=d.kv_lora, ROPE=d.qk_rope, PAGE=cache.pages.shape[1], BLOCK_N=32,
        DOT=_DOT, num_warps=8,
    )
    latent = torch.empty(m, h, d.kv_lora, dtype=_ACT, device=x.device)
    _mla_combine_kernel[(m, h)](part, lse, latent, h, SPLITS=cache.splits, H_PAD=h_pad, LORA=d.kv_lora)
    v = torch.empty(m, h, d.v_head, dtype=_ACT, device=x.device)
    torch.bmm(latent.transpose(0, 1), w.w_uv, out=v.transpose(0, 1))
    gated = torch.empty(m, h * d.v_head, dtype=_ACT, device=x.device)
    block = min(1024, _pow2(h * d.v_head))
    _sigmoid_gate_kernel[(m, triton.cdiv(h * d.v_head, block))](v, gate, gated, projected.stride(0), h * d.v_head, BLOCK=block)
    return gated @ w.o_proj.t()


@dataclass
class GpuStream:
    blocks: torch.Tensor  # [M, max_blocks, H] bf16, updated in place
    prefix: torch.Tensor  # [M, H] bf16, updated in place

    @staticmethod
    def from_reference(stream: Any, device: torch.device | str) -> GpuStream:
        return GpuStream(stream.blocks.to(device, _ACT, copy=True).contiguous(),
                         stream.prefix.to(device, _ACT, copy=True).contiguous())


def _pre_attention(delta: torch.Tensor, s: GpuStream, n: GpuNorms, pos: LayerPosition,
                   mix: Callable[..., torch.Tensor] = attn_res) -> torch.Tensor:
    return mix(
        s.prefix, delta, s.blocks, pos.blocks_before_attn, pos.blocks_before_attn if pos.writes_block else -1,
        n.attn_res_norm, n.attn_res_proj, n.input_norm, n.eps, n.eps,
    )


def _pre_mlp(attn_out: torch.Tensor, s: GpuStream, n: GpuNorms, pos: LayerPosition,
             mix: Callable[..., torch.Tensor] = attn_res) -> torch.Tensor:
    if pos.writes_block:
        s.prefix.copy_(attn_out)  # a new block starts with this layer's attention output
        delta = None
    else:
        delta = attn_out
    return mix(
        s.prefix, delta, s.blocks, pos.blocks_before_mlp, -1,
        n.mlp_res_norm, n.mlp_res_proj, n.post_attn_norm, n.eps, n.eps,
    )


def attention_part(
    delta: torch.Tensor, stream: GpuStream, norms: GpuNorms, pos: LayerPosition,
    attend: Callable[[torch.Tensor], torch.Tensor], mix: Callable[..., torch.Tensor] = attn_res,
) -> torch.Tensor:
    """A layer up to its MLP input around any attention op `attend` (mixed input -> attention output): AttnRes,
    attention, AttnRes, each AttnRes site by `mix` (attn_res's arguments and result). Updates `stream` in place."""
    return _pre_mlp(attend(_pre_attention(delta, stream, norms, pos, mix)), stream, norms, pos, mix)


def kda_attention_part(
    delta: torch.Tensor, stream: GpuStream, norms: GpuNorms, kda: GpuKda, state: GpuKdaState, pos: LayerPosition,
    kda_dims: KdaDims,
) -> torch.Tensor:
    """A KDA layer up to the MoE input. Updates `stream` and `state` in place."""
    return attention_part(delta, stream, norms, pos, lambda h: kda_attention(h, kda, state, kda_dims))


def mla_attention_part(
    delta: torch.Tensor, stream: GpuStream, norms: GpuNorms, mla: GpuMla, cache: GpuLatentCache, pos: LayerPosition,
    mla_dims: MlaDims,
) -> torch.Tensor:
    """An MLA layer up to the MoE input. Updates `stream` and `cache` in place."""
    return attention_part(delta, stream, norms, pos, lambda h: mla_attention(h, mla, cache, mla_dims))


def kda_moe_layer(
    delta: torch.Tensor, stream: GpuStream, norms: GpuNorms, kda: GpuKda, moe: GpuMoe, state: GpuKdaState,
    pos: LayerPosition, kda_dims: KdaDims, moe_dims: MoeDims,
) -> torch.Tensor:
    """One KDA + MoE decode layer; updates `stream` and `state` in place and returns the layer output."""
    return latent_moe(kda_attention_part(delta, stream, norms, kda, state, pos, kda_dims), moe, moe_dims)


def mla_moe_layer(
    delta: torch.Tensor, stream: GpuStream, norms: GpuNorms, mla: GpuMla, moe: GpuMoe, cache: GpuLatentCache,
    pos: LayerPosition, mla_dims: MlaDims, moe_dims: MoeDims,
) -> torch.Tensor:
    """One MLA + MoE decode layer; updates `stream` and `cache` in place and returns the layer output."""
    return latent_moe(mla_attention_part(delta, stream, norms, mla, cache, pos, mla_dims), moe, moe_dims)


def kernel_spans(fn: Any, graph: bool = False) -> list:
    """timeline.KernelSpan (name, start and end in microseconds) of every GPU kernel one call of `fn` launches, in
    start order, from the torch profiler (memcpy/memset not included). Call `fn` once before, so compilation and
    autotuning stay out. graph: one call captured in a CUDA graph and one replay of it profiled, so that the launches
    overlap as in the timed graphs (programmatic dependent launch, no host between them); eager, the host leaves
    microseconds to milliseconds between launches and none overlaps. A graph replay that shows no kernel is an error
    (a profiler that does not trace graph launches), not an empty breakdown."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.kimi_k3.timeline import KernelSpan

    run = fn
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured, stream=side):
            fn()
        captured.replay()  # once outside the profiler: the graph's upload and first-launch costs
        run = captured.replay
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    kernel_type = getattr(torch.autograd.DeviceType, "CUDA")
    spans = [KernelSpan(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
             if e.device_type == kernel_type and not e.name.lower().startswith(("memcpy", "memset"))]
    if graph and not spans:
        raise RuntimeError("kernel_spans: the profiler recorded no kernel of the graph's replay (it does not trace "
                           "graph launches here); use the eager breakdown")
    return sorted(spans, key=lambda span: span.start_us)


def count_kernels(fn: Any) -> int:
    """GPU kernels one call of `fn` launches (see `kernel_spans`)."""
    return len(kernel_spans(fn))
