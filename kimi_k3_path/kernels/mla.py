"""`mla_decode`: the attention of an MLA layer for one TP rank and a decode batch (M <= 64), on the caller's stream,
as `reference.mla_decode` computes it (absorbed: MQA over vLLM's paged latent cache):

  qkv_a     projected = x @ W_qkv_a^T = [q_c | kv_c | k_pe | gate]                    dense.project (bf16)
  norms     q_c = rms_norm(q_c), kv_c = rms_norm(kv_c), and the decoded token's        mla_norms.py (1 launch)
  + insert  row [kv_c | k_pe] into pages at its slot
  q_b       q = q_c @ W_q_b^T, per head [q_nope (128) | q_pe (64)]                     cuBLAS (bf16)
  absorb    the kernel's q [M, heads, 576] = q @ [[W_UK, 0], [0, I]] per head          cuBLAS (one bmm)
  attend    the split launch's partials of softmax(q . row * scale) @ row[:512]       mla_attention.py (split)
  output    latent = their combine, v = latent @ W_UV^T per head,                     mla_output.py (1 launch)
            attn = v * sigmoid(gate)
            (from dispatch.MLA_FUSED_TAIL_MAX_M + 1 tokens: the combine launch, then   mla_attention.py (combine),
            W_UV and the gate in torch, where mla_output's 8 CTAs per head each       cuBLAS, torch (2)
            repeating the combine cost more than the launches it saves)
  o_proj    out = attn @ W_o^T                                                        dense.project (bf16)

dense.project runs dense.py's GEMV at one token (its weight slices loaded before griddepcontrol.wait, so behind
AttnRes qkv_a's first wave streams early) and cuBLAS from two. qkv_a is 3648 x 7168 at TP8 and 2880 x 7168 at TP16, on
dense.py's in_proj form (4 warps a row); o_proj 7168 x 1536 / 768 is KDA's o_proj shape at both TPs.

The absorb bmm writes ql = q_nope @ W_UK and copies q_pe in the same product (its identity block is exact in fp32
accumulation): one launch instead of a bmm and a copy (the stock path's concat kernel). 7 launches in all (torch's
two rms_norm, cat and index_copy_ took 4-6 where mla_norms.py takes one; the combine, a W_UV bmm, a sigmoid and a
mul took the 4 where mla_output.py takes one), against the stock path's 11
(`benchmarks/kimi_k3/stock.py: mla_attention`), whose Triton split-KV decode and combine these replace. Rows are
addressed by vLLM's slot mapping (page * page_size + offset, int64); its padding slot -1 is not supported (the insert
would write outside the pages), so a batch is passed unpadded. No host
synchronization and no allocation outside torch's allocator when check_inputs is False and a workspace is given:
CUDA-graph capturable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .dense import project
from .dispatch import attention_forms
from .mla_attention import MlaWorkspace, check_cache_inputs, mla_attention_decode, mla_split_kv
from .mla_norms import mla_norms_insert
from .mla_output import mla_output
from .runtime import expect


@dataclass(frozen=True)
class MlaAttentionWeights:
    dims: object  # reference MlaDims
    qkv_a: torch.Tensor  # [q_lora + kv_lora + rope + heads*v, hidden] bf16
    q_a_norm: torch.Tensor  # [q_lora] bf16
    kv_a_norm: torch.Tensor  # [kv_lora] bf16
    q_b: torch.Tensor  # [heads*(nope+rope), q_lora] bf16
    absorb: torch.Tensor  # [heads, nope+rope, kv_lora+rope] bf16: [[W_UK, 0], [0, I]] per head
    w_uv: torch.Tensor  # [heads, kv_lora, v] bf16
    o_proj: torch.Tensor  # [hidden, heads*v] bf16


def projection_shapes(d) -> dict[str, tuple[int, int]]:
    """(N, K) of the GEMVs dense.project runs for an MLA layer with reference MlaDims d."""
    return {"qkv_a": (d.qkv_a_rows, d.hidden), "o_proj": (d.hidden, d.heads * d.v_head)}


def prepare_mla_weights(ref, d, device) -> MlaAttentionWeights:
    """The kernels' copy of a reference `MlaWeights` for `MlaDims` d, on `device`."""

    def bf16(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=torch.bfloat16).contiguous()

    w_uk, w_uv = ref.absorbed(d)  # [heads, nope, kv_lora], [heads, v, kv_lora]
    absorb = torch.zeros(d.heads, d.qk_head, d.cache_row, dtype=torch.float32, device=w_uk.device)
    absorb[:, : d.qk_nope, : d.kv_lora] = w_uk
    absorb[:, d.qk_nope :, d.kv_lora :] = torch.eye(d.qk_rope, device=w_uk.device)
    return MlaAttentionWeights(d, bf16(ref.qkv_a), bf16(ref.q_a_norm), bf16(ref.kv_a_norm), bf16(ref.q_b),
                               bf16(absorb), bf16(w_uv.transpose(1, 2)), bf16(ref.o_proj))


def check_slots(slots: list[int], block_table: list[list[int]], seq_lens: list[int], page: int) -> None:
    """Raise ValueError unless every sequence's slot is the row of its last token (position seq_len - 1; the lengths
    already checked against the table)."""
    for i, (slot, n) in enumerate(zip(slots, seq_lens)):
        want = block_table[i][(n - 1) // page] * page + (n - 1) % page
        if slot != want:
            raise ValueError(f"mla_decode: sequence {i} ({n} tokens) has slot {slot}; the row of its token at position "
                             f"{n - 1} is {want}")


def mla_decode(x: torch.Tensor, w: MlaAttentionWeights, pages: torch.Tensor, block_table: torch.Tensor,
               seq_lens: torch.Tensor, slots: torch.Tensor, out: torch.Tensor, stream,
               workspace: MlaWorkspace | None, check_inputs: bool = True) -> None:
    """out [M, hidden] bf16 = the MLA attention of x [M, hidden] bf16; the decoded tokens' rows are written into
    pages [P, 64, 576] bf16 at slots [M] int64 (vLLM's slot mapping) before the attention reads them. block_table
    [M, W] int32 and seq_lens [M] int32 (counting the decoded token) as for `mla_attention_decode`; workspace: its
    partials (allocated per call when None; give one for CUDA graphs). check_inputs reads the lengths, table and
    slots on the host (a synchronization) to reject a slot that is not its sequence's new row and what
    `mla_attention_decode` rejects; pass False under CUDA graph capture."""
    d = w.dims
    m, row = x.shape[0], d.cache_row
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != d.hidden:
        raise ValueError(f"mla_decode: x must be [M, {d.hidden}] bf16, got {tuple(x.shape)} {x.dtype}")
    if pages.dim() != 3:
        raise ValueError(f"mla_decode: pages must be [P, page, {row}], got {tuple(pages.shape)}")
    for spec in (("out", out, (m, d.hidden), "bfloat16"), ("slots", slots, (m,), "int64"),
                 ("pages", pages, (pages.shape[0], pages.shape[1], row), "bfloat16")):
        expect(*spec, device=False)
    if check_inputs:  # before the rows are written
        lens, table = seq_lens.tolist(), block_table.tolist()
        check_cache_inputs(lens, table, pages.shape[0])
        check_slots(slots.tolist(), table, lens, pages.shape[1])
    gate_start = d.q_lora + d.kv_lora + d.qk_rope
    with torch.cuda.stream(stream):  # the torch ops on the stream the CuTe launches take
        projected = torch.empty(m, w.qkv_a.shape[0], device=x.device, dtype=torch.bfloat16)
        project(x, w.qkv_a, projected, stream)
        q_c = torch.empty(m, d.q_lora, device=x.device, dtype=torch.bfloat16)
        mla_norms_insert(projected, w.q_a_norm, w.kv_a_norm, d.eps, d.qk_rope, pages, slots, q_c, stream)
        q = (q_c @ w.q_b.t()).view(m, d.heads, d.qk_head)
        mqa_q = torch.empty(m, d.heads, row, device=x.device, dtype=torch.bfloat16)
        torch.bmm(q.transpose(0, 1), w.absorb, out=mqa_q.transpose(0, 1))
        if attention_forms(m).mla_fused_tail:
            partials = mla_split_kv(mqa_q, pages, block_table, seq_lens, stream, d.scale, workspace=workspace,
                                    check_inputs=check_inputs)
            gated = torch.empty(m, d.heads * d.v_head, device=x.device, dtype=torch.bfloat16)
            mla_output(partials, w.w_uv, projected, gate_start, gated, stream)
        else:
            latent = torch.empty(m, d.heads, d.kv_lora, device=x.device, dtype=torch.bfloat16)
            mla_attention_decode(mqa_q, pages, block_table, seq_lens, latent, stream, d.scale, workspace=workspace,
                                 check_inputs=check_inputs)
            v = torch.empty(m, d.heads, d.v_head, device=x.device, dtype=torch.bfloat16)
            torch.bmm(latent.transpose(0, 1), w.w_uv, out=v.transpose(0, 1))
            gated = torch.sigmoid(projected[:, gate_start:]).mul_(v.view(m, -1))
        project(gated, w.o_proj, out, stream)
