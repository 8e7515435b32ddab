"""The stock-like op sequence behind the executor's `LayerPath` signatures: what `build_executor(..., stock=...)`
gets in the bench and the tests, where vLLM would run its own layers."""

from __future__ import annotations

from typing import Any

from benchmarks.kimi_k3 import stock
from kimi_k3_path.executor import PerWeights, back_to, to_act
from kimi_k3_path.reference import KdaState, PagedLatentCache, ResidualStream


class StockLikeLayers:
    """The stock-like op sequence (`stock.py`: cuBLAS GEMMs + Triton kernels, bf16, what vLLM's stock decode
    launches on Hopper) behind the reference signatures. Inputs are copied to `device` in the stock layouts and
    results come back as fp32 reference types on the caller's device, so this is the stock path for correctness
    (tests; on CPU under TRITON_INTERPRET=1), not for speed. Weights are converted once per weights object."""

    name = "stock-like"

    def __init__(self, device: str = "cuda"):
        self.device = device
        self._converted = PerWeights()

    def _weights(self, weights: Any, attention: str, dims: Any) -> tuple:
        def convert() -> tuple:
            attn = (
                stock.GpuKda.from_reference(weights.kda, self.device)
                if attention == "kda"
                else stock.GpuMla.from_reference(weights.mla, dims.mla, self.device)
            )
            return (
                stock.GpuNorms.from_reference(weights.norms, self.device),
                attn,
                stock.GpuMoe.from_reference(weights.moe, dims.moe, self.device),
            )

        return self._converted.get(weights, convert)

    def kda_moe(self, delta, stream, weights, state, pos, dims):
        norms, kda, moe = self._weights(weights, "kda", dims)
        gpu_stream = stock.GpuStream.from_reference(stream, self.device)
        gpu_state = stock.GpuKdaState.from_reference(state, self.device)
        act = to_act(delta, self.device)
        out = stock.kda_moe_layer(act, gpu_stream, norms, kda, moe, gpu_state, pos, dims.kda, dims.moe)
        back = back_to(delta)
        return (
            back(out),
            ResidualStream(blocks=back(gpu_stream.blocks), prefix=back(gpu_stream.prefix)),
            KdaState(conv=back(gpu_state.conv), recurrent=back(gpu_state.recurrent)),
        )

    def mla_moe(self, delta, stream, weights, cache, pos, dims):
        norms, mla, moe = self._weights(weights, "mla", dims)
        gpu_stream = stock.GpuStream.from_reference(stream, self.device)
        gpu_cache = stock.GpuLatentCache.from_reference(cache, self.device)
        act = to_act(delta, self.device)
        out = stock.mla_moe_layer(act, gpu_stream, norms, mla, moe, gpu_cache, pos, dims.mla, dims.moe)
        back = back_to(delta)
        return (
            back(out),
            ResidualStream(blocks=back(gpu_stream.blocks), prefix=back(gpu_stream.prefix)),
            PagedLatentCache(pages=back(gpu_cache.pages), block_table=cache.block_table, seq_lens=cache.seq_lens),
        )
