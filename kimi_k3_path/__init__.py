"""Kimi K3 latency-specialized decode path for the H200 (sm_90): the reference contribution the gatekeeper checks.

Pure modules (no torch, no vllm at import): `config` (the model config and per-rank shard shapes), `support`
(`SUPPORT_MATRIX`, `Deployment`) and `guard` (`check_deployment`). `executor` needs torch (the [kernels] extra);
`vllm_plugin` imports vllm only inside its functions (the [vllm] extra). Scope: README.md beside this file.
"""
