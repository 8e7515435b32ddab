"""CuTe DSL kernels of the Kimi K3 decode path for the H200 (sm_90a), one kernel per module:

  moe.py                 `latent_moe_decode`: the block's 4 launches, weights and workspace
  dispatch.py            which form of each launch a (TP, M) runs: the one table (pure, no GPU)
  front.py               launch 1: router + down-projection (+ shared gate_up from 2 tokens)
  gemm1_held.py          launch 2, 1..4 tokens: experts' GEMM1 + SiTU-GLU on the CUDA cores, weights in registers
  gemm1_mma.py           launch 2, 5..64 tokens: the same on the tensor cores
  gemm2_one_token.py     launch 3, 1 token: GEMM2 + combine, whole rows per CTA (+ shared gate_up)
  gemm2_mma.py           launch 3, 2..64 tokens: GEMM2 + combine + latent RMSNorm on the tensor cores
  finalize_streamed.py   launch 4, 1 token: up-projection + shared down, weights streamed through shared memory
  finalize_mma.py        launch 4, 2..64 tokens: the same on the tensor cores
  kda.py                 `kda_attention_decode`: a KDA layer's attention (in_proj, f_b, the middle, o_proj)
  kda_recurrent.py       its middle between the GEMVs (conv, norms, gate, delta rule, gated RMSNorm) in one
                         launch: correct on the H200 (its GPU tests), timed in the layer only
  mla.py                 `mla_decode`: an MLA layer's attention (qkv_a, norms, row insert, q_b, absorb, the
                         split-KV attention, W_UV, gate, o_proj)
  mla_attention.py       its split-KV attention over the paged latent cache + combine (2 launches): correct and
                         timed on the H200 (benchmarks/kimi_k3/bench_mla.py)
  mla_norms.py           `mla_norms_insert`: the q_a / kv_a RMSNorms and the cache row insert in one launch
                         (mla.py's; its GPU tests passed on an H100)
  dense.py               `dense_decode`: a dense bf16 projection (y = x W^T) on the MoE front's row dots: the KDA
                         attention's in_proj and o_proj and MLA's qkv_a and o_proj at one token (`project`;
                         benchmarks/kimi_k3/bench_dense.py)
  attn_res.py            Block AttnRes: prefix update, block snapshot, the sources' softmax mix and its RMSNorm
                         in one launch per site: correct on the H200 (its GPU tests), timed in the layer only

and the device functions they share: `router` (logits, top-k, plan), `gemv` (split-K row dots), `mma` (bf16
mma.sync tiles), `fp4_mma` (MXFP4 on the tensor cores), `shared` (shared experts' gate_up), `norm_tail` (the batch
RMSNorm), `common` (PTX helpers); `runtime` compiles and caches, `trace` records when each CTA ran.
Importing needs torch and nvidia-cutlass-dsl (the [kernels] extra); running needs an sm_90 GPU. Design, byte floors,
measurements and what was tried: docs/design/kimi_k3_kernels.md."""
