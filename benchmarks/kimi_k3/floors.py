"""The byte floor of a decode layer or step: the bytes it must move at minimum. Every weight read once (only the
experts the batch routes to, at their unpadded MXFP4 size), the KDA state read and written, the MLA cache rows read
and the new row written, the residual stream's AttnRes sources read and the mix written, the layer's input and
output. Their time at the H200's measured copy rate is `kimi_k3_path.kernels.runtime.floor_us`, the rate the kernels'
own floors use. `LayerBytes` keeps those terms apart, so that a perf row states what its floor is made of.

The MoE block's dense weights, input and output are charged once per layer; a layer's activations term is its MLP's
input and output (the attention's input and output are the AttnRes streams').
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any


@dataclass(frozen=True)
class LayerBytes:
    """The bytes one decode layer (or block, or step) must move, by what moves."""

    weights: int = 0  # dense weights, each read once (attention, norms, the MoE's router, down, up, shared experts)
    experts: int = 0  # the routed experts' MXFP4 weights and scales, only those the batch routes to
    active_experts: int = 0  # how many experts that is (summed over a step's layers)
    state: int = 0  # KDA recurrent and conv state read and written; MLA cache rows read and the new row written
    streams: int = 0  # AttnRes: the completed blocks, the prefix and the delta read, the prefix and the mix written
    activations: int = 0  # the MLP's input and output

    @property
    def total(self) -> int:
        return self.weights + self.experts + self.state + self.streams + self.activations

    def __add__(self, other: LayerBytes) -> LayerBytes:
        return LayerBytes(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def describe(self, attention: str = "") -> str:
        """The terms as a perf row's note states them; attention ("kda", "mla" or "") names the state term."""
        state = {"kda": "KDA state read + written", "mla": "MLA cache read + row written"}.get(attention, "state")
        terms = [f"dense weights {self.weights}", f"routed experts {self.experts} ({self.active_experts} active)"]
        terms += [f"{state} {self.state}"] * bool(self.state or attention)
        terms += [f"AttnRes streams {self.streams}"] * bool(self.streams)
        return " + ".join(terms + [f"MLP input and output {self.activations}"])

EXPERT_TENSORS = ("w13_packed", "w13_scales", "w2_packed", "w2_scales")


def tensor_bytes(obj: Any, skip: tuple[str, ...] = ()) -> int:
    """Bytes of every tensor field of a dataclass (recursively), except the named fields."""
    import torch

    total = 0
    for f in fields(obj):
        if f.name in skip:
            continue
        value = getattr(obj, f.name)
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif is_dataclass(value):
            total += tensor_bytes(value, skip)
    return total


def expert_bytes(latent: int, inter: int) -> int:
    """One expert's MXFP4 w13 and w2 with their scales, unpadded."""
    per_matrix = 2 * inter * latent  # w13 elements; w2 has half as many
    return (per_matrix + per_matrix // 2) // 2 + (per_matrix + per_matrix // 2) // 32


def moe_bytes(moe: Any, x: Any, dims: Any) -> LayerBytes:
    """The latent-MoE block (`stock.GpuMoe` weights) on input x [M, H]: its dense weights, the experts x routes to,
    the input and the output."""
    from benchmarks.kimi_k3 import stock

    ids, _ = stock.route(x, moe, dims)
    active = int(ids.unique().numel())
    return LayerBytes(weights=tensor_bytes(moe, skip=EXPERT_TENSORS),
                      experts=active * expert_bytes(dims.latent, dims.intermediate), active_experts=active,
                      activations=2 * x.numel() * x.element_size())


def layer_bytes(layer: str, dims: Any, pos: Any, w: dict[str, Any], item: dict[str, Any],
                mlp_input: Any) -> LayerBytes:
    """One decode layer of kind `layer` ("kda_moe", "mla_moe", "kda_dense"; "moe": the MoE block alone) in the stock
    layouts: `w` holds its weights ("norms", "kda"/"mla", "moe"/"dense"), `item` its state ("state"/"cache"), and
    `mlp_input` [M, H] is what its MLP reads (it decides the routed experts)."""
    m, h = mlp_input.shape
    act = mlp_input.element_size()
    if layer.endswith("_dense"):
        mlp = LayerBytes(weights=tensor_bytes(w["dense"]), activations=2 * m * h * act)
    else:
        mlp = moe_bytes(w["moe"], mlp_input, dims.moe)
    if layer == "moe":
        return mlp
    # Each AttnRes mix reads its blocks, the prefix and the delta, and writes the prefix and its output.
    streams = (pos.blocks_before_attn + pos.blocks_before_mlp + 8) * m * h * act
    if layer.startswith("kda"):
        state = item["state"]
        attention = tensor_bytes(w["kda"])
        moved = 2 * state.recurrent.numel() * 4 + 2 * state.conv.numel() * act  # read + write
    else:
        cache = item["cache"]
        attention = tensor_bytes(w["mla"])
        moved = int(cache.seq_lens.sum()) * dims.mla.cache_row * act + m * dims.mla.cache_row * act
    return mlp + LayerBytes(weights=tensor_bytes(w["norms"]) + attention, state=moved, streams=streams)
