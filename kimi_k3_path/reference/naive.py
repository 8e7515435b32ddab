"""Deliberately naive fp64 versions of the references, written from the formulas with explicit loops.

They share no code with the references beyond the weight containers, so a mistake must be made twice, in two
different forms, to pass the cross-checks in tests/kimi_k3_path/reference/. Slow by design: tiny dims only.
"""

from __future__ import annotations

import math

import torch

from .kda import KdaDims, KdaState, KdaWeights
from .mla import MlaDims, MlaWeights, PagedLatentCache
from .moe import MoeDims, MoeWeights

f64 = torch.float64


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    x = x.to(f64)
    out = torch.empty_like(x)
    flat, out_flat = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])
    for r in range(flat.shape[0]):
        mean_sq = sum(float(v) ** 2 for v in flat[r]) / flat.shape[1]
        inv = 1.0 / math.sqrt(mean_sq + eps)
        for c in range(flat.shape[1]):
            out_flat[r, c] = flat[r, c] * inv * (1.0 if weight is None else float(weight[c]))
    return out


def situ_glu(gate: torch.Tensor, up: torch.Tensor, beta: float = 4.0, linear_beta: float = 25.0) -> torch.Tensor:
    def one(g: float, u: float) -> float:
        return beta * math.tanh(g / beta) / (1.0 + math.exp(-g)) * linear_beta * math.tanh(u / linear_beta)

    flat = [one(float(g), float(u)) for g, u in zip(gate.reshape(-1), up.reshape(-1))]
    return torch.tensor(flat, dtype=f64).reshape(gate.shape)


def e2m1_value(nibble: int) -> float:
    """Decode one E2M1 nibble from its bit fields."""
    sign = -1.0 if nibble & 0b1000 else 1.0
    exponent = (nibble >> 1) & 0b11
    mantissa = nibble & 0b1
    magnitude = mantissa * 0.5 if exponent == 0 else 2.0 ** (exponent - 1) * (1.0 + mantissa / 2.0)
    return sign * magnitude


def mxfp4_unpack(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    k = packed.shape[-1] * 2
    flat_p, flat_s = packed.reshape(-1, packed.shape[-1]), scales.reshape(-1, scales.shape[-1])
    out = torch.empty(flat_p.shape[0], k, dtype=f64)
    for r in range(flat_p.shape[0]):
        for i in range(k):
            byte = int(flat_p[r, i // 2])
            nibble = byte & 0xF if i % 2 == 0 else byte >> 4
            out[r, i] = e2m1_value(nibble) * 2.0 ** (int(flat_s[r, i // 32]) - 127)
    return out.reshape(*packed.shape[:-1], k)


def mxfp4_pack(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Brute force: the OCP shared exponent from log2, then the nearest of all 16 codes (ties: even code)."""
    k = w.shape[-1]
    flat = w.reshape(-1, k).to(f64)
    packed = torch.zeros(flat.shape[0], k // 2, dtype=torch.uint8)
    scales = torch.zeros(flat.shape[0], k // 32, dtype=torch.uint8)
    for r in range(flat.shape[0]):
        for g in range(k // 32):
            group = [float(v) for v in flat[r, 32 * g : 32 * g + 32]]
            amax = max(abs(v) for v in group)
            shared = -127 if amax == 0 else max(-127, min(127, math.floor(math.log2(amax)) - 2))
            scales[r, g] = shared + 127
            for j, v in enumerate(group):
                target = v / 2.0**shared
                best = min(range(16), key=lambda c: (abs(e2m1_value(c) - target), c % 2, c >= 8 and v >= 0))
                if best == 8:  # -0 encodes the same value; the canonical form is +0
                    best = 0
                i = 32 * g + j
                packed[r, i // 2] |= best << (4 * (i % 2))
    return packed.reshape(*w.shape[:-1], k // 2), scales.reshape(*w.shape[:-1], k // 32)


def attn_res_mix(blocks, prefix, w, eps: float, out_eps: float) -> torch.Tensor:
    m, n, h = blocks.shape
    out = torch.empty(m, h, dtype=f64)
    for t in range(m):
        sources = [blocks[t, s].to(f64) for s in range(n)] + [prefix[t].to(f64)]
        logits = []
        for src in sources:
            normed = rms_norm(src.unsqueeze(0), w.res_norm, eps)[0]
            logits.append(sum(float(normed[c]) * float(w.res_proj[c]) for c in range(h)))
        top = max(logits)
        e = [math.exp(v - top) for v in logits]
        mixed = sum((ei / sum(e)) * src for ei, src in zip(e, sources))
        out[t] = rms_norm(mixed.unsqueeze(0), w.out_norm, out_eps)[0]
    return out


def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def kda_decode_step(x: torch.Tensor, w: KdaWeights, state: KdaState, d: KdaDims) -> tuple[torch.Tensor, KdaState]:
    """Per token and head, the matrix form S' = S diag(exp g) (I - beta k k^T) + beta v k^T."""
    m, D, P = x.shape[0], d.head_dim, d.proj
    proj = x.to(f64) @ w.in_proj.to(f64).T
    conv_state = state.conv.to(f64).clone()
    recurrent = state.recurrent.to(f64).clone()
    out = torch.zeros(m, d.hidden, dtype=f64)
    for t in range(m):
        qkv = proj[t, : 3 * P]
        g_out = proj[t, 3 * P : 4 * P]
        f_a = proj[t, 4 * P : 4 * P + D]
        beta_raw = proj[t, 4 * P + D :]
        g_raw = w.f_b.to(f64) @ f_a
        conv_out = torch.empty(3 * P, dtype=f64)
        for c in range(3 * P):
            window = [float(v) for v in conv_state[t, c]] + [float(qkv[c])]
            acc = sum(float(w.conv[c, j]) * window[j] for j in range(d.conv_width))
            conv_out[c] = acc * _sigmoid(acc)
            conv_state[t, c] = torch.tensor(window[1:], dtype=f64)
        o_all = torch.empty(P, dtype=f64)
        for h in range(d.heads):
            sl = slice(h * D, (h + 1) * D)
            q, k, v = conv_out[sl], conv_out[P + h * D : P + (h + 1) * D], conv_out[2 * P + h * D : 2 * P + (h + 1) * D]
            q = q / math.sqrt(float(q @ q) + 1e-6) / math.sqrt(D)
            k = k / math.sqrt(float(k @ k) + 1e-6)
            a = math.exp(float(w.a_log[h]))
            decay = torch.tensor(
                [math.exp(d.gate_lower_bound * _sigmoid(a * (float(g_raw[h * D + j]) + float(w.dt_bias[h * D + j])))) for j in range(D)],
                dtype=f64,
            )
            beta = _sigmoid(float(beta_raw[h]))
            s = recurrent[t, h]
            s = s @ torch.diag(decay) @ (torch.eye(D, dtype=f64) - beta * torch.outer(k, k)) + beta * torch.outer(v, k)
            recurrent[t, h] = s
            o = s @ q
            normed = rms_norm(o.unsqueeze(0), w.o_norm, d.norm_eps)[0]
            o_all[sl] = torch.tensor([float(normed[j]) * _sigmoid(float(g_out[h * D + j])) for j in range(D)], dtype=f64)
        out[t] = w.o_proj.to(f64) @ o_all
    return out, KdaState(conv=conv_state, recurrent=recurrent)


def mla_decode(x: torch.Tensor, w: MlaWeights, cache: PagedLatentCache, d: MlaDims) -> torch.Tensor:
    """Non-absorbed attention, token by token and head by head, reading the paged cache slot by slot."""
    m = x.shape[0]
    out = torch.zeros(m, d.hidden, dtype=f64)
    kv_b = w.kv_b.to(f64).reshape(d.heads, d.qk_nope + d.v_head, d.kv_lora)
    page_size = cache.pages.shape[1]
    for t in range(m):
        a = w.qkv_a.to(f64) @ x[t].to(f64)
        q_c = a[: d.q_lora]
        kv_c = a[d.q_lora : d.q_lora + d.kv_lora]
        k_pe_new = a[d.q_lora + d.kv_lora : d.q_lora + d.kv_lora + d.qk_rope]
        gate = a[d.q_lora + d.kv_lora + d.qk_rope :]
        q = (w.q_b.to(f64) @ rms_norm(q_c.unsqueeze(0), w.q_a_norm, d.eps)[0]).reshape(d.heads, d.qk_head)
        new_row = torch.cat([rms_norm(kv_c.unsqueeze(0), w.kv_a_norm, d.eps)[0], k_pe_new])
        n = int(cache.seq_lens[t])
        rows = []
        for pos in range(n):
            if pos == n - 1:
                rows.append(new_row)
            else:
                page = int(cache.block_table[t, pos // page_size])
                rows.append(cache.pages[page, pos % page_size].to(f64))
        attn = torch.empty(d.heads * d.v_head, dtype=f64)
        for h in range(d.heads):
            keys = [torch.cat([kv_b[h, : d.qk_nope] @ r[: d.kv_lora], r[d.kv_lora :]]) for r in rows]
            values = [kv_b[h, d.qk_nope :] @ r[: d.kv_lora] for r in rows]
            logits = [float(q[h] @ key) / math.sqrt(d.qk_head) for key in keys]
            top = max(logits)
            e = [math.exp(v - top) for v in logits]
            o = sum((ei / sum(e)) * val for ei, val in zip(e, values))
            for j in range(d.v_head):
                attn[h * d.v_head + j] = o[j] * _sigmoid(float(gate[h * d.v_head + j]))
        out[t] = w.o_proj.to(f64) @ attn
    return out


def route(x: torch.Tensor, w: MoeWeights, d: MoeDims) -> tuple[list[list[int]], list[list[float]]]:
    ids, weights = [], []
    for t in range(x.shape[0]):
        logits = w.router.to(f64) @ x[t].to(f64)
        scores = [_sigmoid(float(v)) for v in logits]
        keyed = sorted(range(d.experts), key=lambda e: (-(scores[e] + float(w.router_bias[e])), e))
        chosen = keyed[: d.top_k]
        total = sum(scores[e] for e in chosen)
        ids.append(chosen)
        weights.append([scores[e] / total * d.routed_scaling_factor for e in chosen])
    return ids, weights


def latent_moe(x: torch.Tensor, w: MoeWeights, d: MoeDims) -> torch.Tensor:
    ids, weights = route(x, w, d)
    out = torch.empty(x.shape[0], d.hidden, dtype=f64)
    for t in range(x.shape[0]):
        xt = x[t].to(f64)
        x_lat = w.down.to(f64) @ xt
        y = torch.zeros(d.latent, dtype=f64)
        for e, weight in zip(ids[t], weights[t]):
            w13 = mxfp4_unpack(w.w13_packed[e], w.w13_scales[e])
            w2 = mxfp4_unpack(w.w2_packed[e], w.w2_scales[e])
            gu = w13 @ x_lat
            y += weight * (w2 @ situ_glu(gu[: d.intermediate], gu[d.intermediate :]))
        shared = w.shared13.to(f64) @ xt
        s = w.shared2.to(f64) @ situ_glu(shared[: d.shared_intermediate], shared[d.shared_intermediate :])
        out[t] = w.up.to(f64) @ rms_norm(y.unsqueeze(0), w.latent_norm, d.eps)[0] + s
    return out
