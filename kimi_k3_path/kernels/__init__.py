"""CuTe DSL kernels of the Kimi K3 latent-MoE decode block for the H200 (sm_90a), one family per module:
`router` (logits + top-k + expert plan), `gemv` (skinny bf16 GEMM: down-projection, whole or sharded), `experts`
(MXFP4 W4A16 GEMM1+SiTU and GEMM2+combine; `experts_mma` on the tensor cores), `norm_tail` (the latent RMSNorm
both GEMM2 forms end with), `shared` (shared experts), `finalize` (latent RMSNorm, up-projection
+ shared-expert add) and `moe` (`latent_moe_decode`). Importing needs torch and nvidia-cutlass-dsl (the [kernels]
extra); running needs an sm_90 GPU. Design, byte floors, measurements and what was
tried: docs/design/kimi_k3_kernels.md (the per-version history: git history of kernels/NOTES.md, last at 91cdaff)."""
