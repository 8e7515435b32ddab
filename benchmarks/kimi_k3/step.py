"""A whole decode step of one TP rank, for the bench's `--layer step` rows: the stack of real-shaped layers the model
starts with (by default its first AttnRes block: layer 0 with KDA and the dense MLP, then KDA+MoE and MLA+MoE layers
in the config's order), run layer after layer, captured by the bench as one CUDA graph per batch size.

The two variants differ as the per-layer rows do: the stock-like step runs every layer as `stock.py`'s op sequence;
the specialized step is the same step with each MoE block, each KDA attention and each MLA attention on the CuTe
DSL kernels. Each step starts as vLLM starts
one: the residual stream's prefix is the token embeddings, its blocks are empty and layer 0 has no delta; the KDA
states and MLA caches persist from step to step. Not in the step: the embedding lookup, the final AttnRes mix and
norm, the LM head, sampling, and the tensor-parallel all-reduces (one GPU; issue 40).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.kimi_k3.floors import LayerBytes, layer_bytes

KINDS = ("kda_dense", "kda_moe", "mla_moe")


@dataclass(frozen=True)
class StackLayer:
    pos: Any  # reference.LayerPosition
    kind: str  # one of KINDS

    @property
    def attention(self) -> str:
        return self.kind.split("_")[0]


def stack_layers(config: Any, count: int) -> tuple[StackLayer, ...]:
    """The first `count` layers of the model, in order; ValueError for a count the model does not have."""
    from kimi_k3_path.reference import LayerPosition

    total = config.text_config.num_hidden_layers
    if not 1 <= count <= total:
        raise ValueError(f"a step of {count} layers: the model has 1..{total}")
    block = config.text_config.attn_res_block_size
    layers = tuple(
        StackLayer(LayerPosition(i, block), f"{config.attention_kind(i)}_{config.mlp_kind(i)}") for i in range(count)
    )
    odd = [f"{layer.pos.layer} ({layer.kind})" for layer in layers if layer.kind not in KINDS]
    if odd:
        raise ValueError(f"layers {', '.join(odd)} are of a kind the step does not build ({', '.join(KINDS)})")
    return layers


def describe(layers: tuple[StackLayer, ...]) -> str:
    counts = {kind: sum(layer.kind == kind for layer in layers) for kind in KINDS}
    return f"layers 0-{len(layers) - 1}: " + ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)


def random_weights(layers: tuple[StackLayer, ...], dims: Any, dense_intermediate: int, gen: Any) -> list[Any]:
    """The reference (fp32, MXFP4 experts) weights of every layer."""
    from kimi_k3_path.reference import (
        KdaDenseLayerWeights, random_dense_mlp_weights, random_kda_moe_layer, random_kda_weights, random_layer_norms,
        random_mla_moe_layer,
    )

    def one(layer: StackLayer) -> Any:
        if layer.kind == "kda_dense":
            return KdaDenseLayerWeights(random_layer_norms(dims.moe.hidden, gen), random_kda_weights(dims.kda, gen),
                                        random_dense_mlp_weights(dims.moe.hidden, dense_intermediate, gen))
        if layer.kind == "kda_moe":
            return random_kda_moe_layer(dims.kda, dims.moe, gen)
        return random_mla_moe_layer(dims.mla, dims.moe, gen)

    return [one(layer) for layer in layers]


def random_states(layers: tuple[StackLayer, ...], dims: Any, batch: int, context: int, page: int, gen: Any) -> list[Any]:
    """Per layer, its reference decode state: a KdaState, or a PagedLatentCache holding `context` tokens per
    sequence before the one decoded."""
    from kimi_k3_path.reference import random_kda_state, random_paged_cache

    return [random_kda_state(dims.kda, batch, gen) if layer.attention == "kda"
            else random_paged_cache(dims.mla, [context + 1] * batch, page, gen) for layer in layers]


def reference_step(x: Any, layers: tuple[StackLayer, ...], weights: list[Any], states: list[Any], dims: Any) -> Any:
    """The fp32 reference of the step: the last layer's output [M, H] for embeddings x [M, H]. Pure."""
    import torch

    from kimi_k3_path.reference import ResidualStream, kda_dense_layer, kda_moe_layer, mla_moe_layer

    m, hidden = x.shape
    stream = ResidualStream(blocks=torch.zeros(m, dims.max_blocks, hidden, device=x.device), prefix=x.float())
    delta = torch.zeros(m, hidden, device=x.device)
    for layer, w, state in zip(layers, weights, states):
        if layer.kind == "kda_dense":
            delta, stream, _ = kda_dense_layer(delta, stream, w, state, layer.pos, dims.kda)
        elif layer.kind == "kda_moe":
            delta, stream, _ = kda_moe_layer(delta, stream, w, state, layer.pos, dims.kda, dims.moe)
        else:
            delta, stream, _ = mla_moe_layer(delta, stream, w, state, layer.pos, dims.mla, dims.moe)
    return delta


class DeviceStack:
    """The stack's weights in the stock layouts on `device`, shared read-only by both variants. Where kernels run,
    `moe_kernels` maps a layer's reference MoE weights to the specialized MoE (x -> out) and `kda_kernels` its
    reference KDA weights to the specialized KDA attention ((x, stock state) -> out) and `mla_kernels` its reference
    MLA weights to the specialized MLA attention ((x, stock latent cache) -> out); None where none run. `mix` is the
    specialized step's AttnRes (stock.attn_res's signature), stock.attn_res where None."""

    def __init__(self, layers: tuple[StackLayer, ...], weights: list[Any], dims: Any, device: str,
                 moe_kernels: Callable[[Any], Callable[[Any], Any]] | None,
                 kda_kernels: Callable[[Any], Callable[[Any, Any], Any]] | None, sms: int,
                 mla_kernels: Callable[[Any], Callable[[Any, Any], Any]] | None = None,
                 mix: Callable[..., Any] | None = None):
        from benchmarks.kimi_k3 import stock

        self.layers, self.dims, self.device, self.sms, self.mix = layers, dims, device, sms, mix
        self.parts: list[dict[str, Any]] = []
        for layer, w in zip(layers, weights):
            part: dict[str, Any] = {"norms": stock.GpuNorms.from_reference(w.norms, device)}
            if layer.attention == "kda":
                part["kda"] = stock.GpuKda.from_reference(w.kda, device)
                part["kda_kernels"] = kda_kernels(w.kda) if kda_kernels is not None else None
            else:
                part["mla"] = stock.GpuMla.from_reference(w.mla, dims.mla, device)
                part["mla_kernels"] = mla_kernels(w.mla) if mla_kernels is not None else None
            if layer.kind == "kda_dense":
                part["dense"] = stock.GpuDense.from_reference(w.mlp, device)
            else:
                part["moe"] = stock.GpuMoe.from_reference(w.moe, dims.moe, device, pad_intermediate=dims.stock_intermediate)
                part["kernels"] = moe_kernels(w.moe) if moe_kernels is not None else None
            self.parts.append(part)

    def step_fn(self, x: Any, states: list[Any], specialized: bool,
                observe: Callable[[int, str, Any], None] | None = None) -> Callable[[], Any]:
        """A closure running one step on its own device copies of `states` (updated in place, step after step) for
        embeddings x [M, H] bf16; returns the last layer's output. `observe(i, "attention" | "mlp", input)` sees what
        each layer's attention and MLP read (eager runs only)."""
        import torch

        from benchmarks.kimi_k3 import stock

        m, hidden = x.shape
        stream = stock.GpuStream(torch.zeros(m, self.dims.max_blocks, hidden, device=self.device, dtype=torch.bfloat16),
                                 torch.empty(m, hidden, device=self.device, dtype=torch.bfloat16))
        zeros = torch.zeros(m, hidden, device=self.device, dtype=torch.bfloat16)
        device_states = [stock.GpuKdaState.from_reference(s, self.device) if layer.attention == "kda"
                         else stock.GpuLatentCache.from_reference(s, self.device, sms=self.sms)
                         for layer, s in zip(self.layers, states)]

        sites = {"mix": self.mix} if specialized and self.mix is not None else {}

        def step() -> Any:
            stream.prefix.copy_(x)
            stream.blocks.zero_()
            delta = zeros
            for i, (layer, part, state) in enumerate(zip(self.layers, self.parts, device_states)):
                attend = self.attention(part, state, specialized)
                if observe is not None:
                    attend = _observed(attend, lambda a, i=i: observe(i, "attention", a))
                h = stock.attention_part(delta, stream, part["norms"], layer.pos, attend, **sites)
                if observe is not None:
                    observe(i, "mlp", h)
                if layer.kind == "kda_dense":
                    delta = stock.dense_mlp(h, part["dense"])
                elif specialized and part["kernels"] is not None:
                    delta = part["kernels"](h)
                else:
                    delta = stock.latent_moe(h, part["moe"], self.dims.moe)
            return delta

        return step

    def attention(self, part: dict[str, Any], state: Any, specialized: bool) -> Callable[[Any], Any]:
        """The layer's attention op on its device state: the KDA or MLA kernels in the specialized step where they
        run, else the stock-like ops."""
        from benchmarks.kimi_k3 import stock

        kernels = part.get("kda_kernels" if "kda" in part else "mla_kernels") if specialized else None
        if kernels is not None:
            return lambda h: kernels(h, state)
        if "kda" in part:
            return lambda h: stock.kda_attention(h, part["kda"], state, self.dims.kda)
        return lambda h: stock.mla_attention(h, part["mla"], state, self.dims.mla)

    def floor_bytes(self, x: Any, states: list[Any]) -> LayerBytes:
        """The step's byte floor: its layers' floors (floors.layer_bytes), each with the MLP input the stock-like
        step computes for it from x and `states` (an eager run on copies; the routed experts depend on it)."""
        inputs: dict[int, Any] = {}

        def keep(i: int, stage: str, h: Any) -> None:
            if stage == "mlp":
                inputs[i] = h.clone()

        self.step_fn(x, states, specialized=False, observe=keep)()
        return sum(
            (layer_bytes(layer.kind, self.dims, layer.pos, part,
                         {"state" if layer.attention == "kda" else "cache": state}, inputs[i])
             for i, (layer, part, state) in enumerate(zip(self.layers, self.parts, states))),
            LayerBytes(),
        )


def _observed(attend: Callable[[Any], Any], see: Callable[[Any], None]) -> Callable[[Any], Any]:
    def run(h: Any) -> Any:
        see(h)
        return attend(h)

    return run
