"""A tiny Kimi K3 checkpoint in the published safetensors naming and packing, and vLLM's own model built from it
on this CPU machine (shared by test_vllm_weights.py and test_vllm_decode.py).

The checkpoint names are the ones vLLM 0.33's loader maps (KimiK3ForConditionalGeneration.hf_to_vllm_mapper,
KimiLinearModel.load_weights' stacked and expert mappings): `language_model.layers.{i}.self_attn.{q,k,v,g,f_a,b}_proj`,
`{q,k,v}_conv1d`, `A_log`, `dt_bias`, MLA `q_a_proj` / `kv_a_proj_with_mqa` / `g_proj`, `mlp.{gate,up,down}_proj`,
`block_sparse_moe.experts.{e}.w{1,2,3}.weight_packed` (uint8, two E2M1 codes per byte, element 2i in the low nibble)
and `.weight_scale` (float8_e8m0fnu, one per 32 elements), `block_sparse_moe.gate.e_score_correction_bias` (fp32).

vLLM cannot build this model on a machine without a CUDA driver as it stands; `build_model` patches exactly these,
for the build only:
- `KimiLinearModel.__init__` creates a `torch.cuda.Stream()` (its aux stream): the stream is None instead;
- the platform (no GPU, not a vLLM CPU build) has no `current_device`, attention backend or MLA prefill backend:
  cpu, vLLM's CPU MLA backend and its CPU SDPA prefill backend are named;
- no MXFP4 MoE backend supports CPU (vLLM's CPU backend needs its CPU build, EMULATION needs amd-quark): Marlin,
  the backend sm_90 selects, is named without its device check. Its expert parameters (latent padded to 256 and
  the intermediate to 128 rows) are what `create_weights` makes; its repack (`process_weights_after_loading`, a
  CUDA op) is not run, so the parameters stay as loaded.
The weights are then read by vLLM's real loader (`DefaultModelLoader.load_weights`, safetensors files).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from kimi_k3_path.config import CONFIG_DIR

# Not a multiple of Marlin's 128 rows: the loaded w13 holds padding between the gate and the up halves.
MOE_INTERMEDIATE = 480
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def decode_mxfp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The test's own MXFP4 decoder (OCP MX): low nibble first, value = E2M1[code] * 2^(scale - 127)."""
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).long()
    values = torch.tensor(E2M1, dtype=torch.float64)[codes]
    scale = torch.pow(2.0, scales.to(torch.float64) - 127).repeat_interleave(32, dim=-1)
    return values * scale


def tiny_config() -> dict[str, Any]:
    config = json.loads((CONFIG_DIR / "tiny.json").read_text())
    config["text_config"]["moe_intermediate_size"] = MOE_INTERMEDIATE
    return config


def write_checkpoint(root: Path, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """config.json + model.safetensors of random bf16 matrices and random MXFP4 experts; returns the tensors."""
    t = tiny_config()["text_config"]
    h, lin, heads = t["hidden_size"], t["linear_attn_config"], t["num_attention_heads"]
    d, kh, w = lin["head_dim"], lin["num_heads"], lin["short_conv_kernel_size"]
    e, i, lat = t["num_experts"], t["moe_intermediate_size"], t["routed_expert_hidden_size"]

    def mat(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=gen) / cols**0.5).to(torch.bfloat16)

    def vec(n: int, around: float = 1.0, dtype=torch.bfloat16) -> torch.Tensor:
        return (around + 0.1 * torch.randn(n, generator=gen)).to(dtype)

    def mxfp4(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        packed = torch.randint(0, 256, (rows, cols // 2), generator=gen, dtype=torch.uint8)
        exponents = torch.randint(120, 125, (rows, cols // 32), generator=gen, dtype=torch.uint8)
        return packed, exponents.view(torch.float8_e8m0fnu)

    out: dict[str, torch.Tensor] = {
        "language_model.model.embed_tokens.weight": mat(t["vocab_size"], h),
        "language_model.lm_head.weight": mat(t["vocab_size"], h),
        "language_model.model.norm.weight": vec(h),
        "language_model.model.output_attn_res_norm.weight": vec(h),
        "language_model.model.output_attn_res_proj.weight": mat(1, h),
    }
    kda_layers = {n - 1 for n in lin["kda_layers"]}
    for layer in range(t["num_hidden_layers"]):
        p = f"language_model.layers.{layer}."
        for name in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"):
            out[p + name + ".weight"] = vec(h)
        out[p + "self_attention_res_proj.weight"] = mat(1, h)
        out[p + "mlp_res_proj.weight"] = mat(1, h)
        a = p + "self_attn."
        if layer in kda_layers:
            for name in ("q", "k", "v", "g"):
                out[a + f"{name}_proj.weight"] = mat(kh * d, h)
            out[a + "f_a_proj.weight"] = mat(d, h)
            out[a + "b_proj.weight"] = mat(kh, h)
            out[a + "f_b_proj.weight"] = mat(kh * d, d)
            for name in ("q", "k", "v"):
                out[a + f"{name}_conv1d.weight"] = (torch.randn(kh * d, 1, w, generator=gen) / w**0.5).to(torch.bfloat16)
            out[a + "A_log"] = (0.5 * torch.randn(kh, generator=gen)).float()
            out[a + "dt_bias"] = (0.5 * torch.randn(kh * d, generator=gen)).float()
            out[a + "o_norm.weight"] = vec(d)
            out[a + "o_proj.weight"] = mat(h, kh * d)
        else:
            out[a + "q_a_proj.weight"] = mat(t["q_lora_rank"], h)
            out[a + "kv_a_proj_with_mqa.weight"] = mat(t["kv_lora_rank"] + t["qk_rope_head_dim"], h)
            out[a + "g_proj.weight"] = mat(heads * t["v_head_dim"], h)
            out[a + "q_a_layernorm.weight"] = vec(t["q_lora_rank"])
            out[a + "kv_a_layernorm.weight"] = vec(t["kv_lora_rank"])
            out[a + "q_b_proj.weight"] = mat(heads * (t["qk_nope_head_dim"] + t["qk_rope_head_dim"]), t["q_lora_rank"])
            out[a + "kv_b_proj.weight"] = mat(heads * (t["qk_nope_head_dim"] + t["v_head_dim"]), t["kv_lora_rank"])
            out[a + "o_proj.weight"] = mat(h, heads * t["v_head_dim"])
        if layer < t["first_k_dense_replace"]:
            out[p + "mlp.gate_proj.weight"] = mat(t["intermediate_size"], h)
            out[p + "mlp.up_proj.weight"] = mat(t["intermediate_size"], h)
            out[p + "mlp.down_proj.weight"] = mat(h, t["intermediate_size"])
            continue
        m = p + "block_sparse_moe."
        out[m + "gate.weight"] = mat(e, h)
        out[m + "gate.e_score_correction_bias"] = (0.1 * torch.randn(e, generator=gen)).float()
        shared = i * t["num_shared_experts"]
        out[m + "shared_experts.gate_proj.weight"] = mat(shared, h)
        out[m + "shared_experts.up_proj.weight"] = mat(shared, h)
        out[m + "shared_experts.down_proj.weight"] = mat(h, shared)
        out[m + "routed_expert_down_proj.weight"] = mat(lat, h)
        out[m + "routed_expert_norm.weight"] = vec(lat)
        out[m + "routed_expert_up_proj.weight"] = mat(h, lat)
        for expert in range(e):
            for proj, (rows, cols) in (("w1", (i, lat)), ("w3", (i, lat)), ("w2", (lat, i))):
                packed, scale = mxfp4(rows, cols)
                out[m + f"experts.{expert}.{proj}.weight_packed"] = packed
                out[m + f"experts.{expert}.{proj}.weight_scale"] = scale
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(tiny_config()))
    save_file(out, str(root / "model.safetensors"))
    return out


@dataclass
class TinyModel:
    model: Any  # KimiK3ForConditionalGeneration (the plugin's subclass)
    vllm_config: Any
    checkpoint: dict[str, torch.Tensor]


def build_model(root: Path, gen: torch.Generator, monkeypatch: Any, additional_config: dict | None) -> TinyModel:
    """vLLM's Kimi K3 model for the tiny checkpoint, TP 1 on CPU, loaded by vLLM's loader (see the docstring)."""
    from vllm.config import (
        CompilationConfig, DeviceConfig, LoadConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig,
        set_current_vllm_config,
    )
    from vllm.distributed import parallel_state
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
    from vllm.model_executor.layers.quantization import mxfp4
    from vllm.model_executor.model_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.platforms import current_platform
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.attention.backends.mla.prefill.registry import MLAPrefillBackendEnum

    checkpoint = write_checkpoint(root, gen)
    model_config = ModelConfig(model=str(root), skip_tokenizer_init=True, dtype="bfloat16", enforce_eager=True,
                               limit_mm_per_prompt={"image": 0})
    vllm_config = VllmConfig(
        model_config=model_config, device_config=DeviceConfig(device="cpu"),
        parallel_config=ParallelConfig(tensor_parallel_size=1),
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_model_len=4096, is_encoder_decoder=False),
        load_config=LoadConfig(load_format="safetensors"), compilation_config=CompilationConfig(),
        additional_config=additional_config or {},
    )
    monkeypatch.setattr(torch.cuda, "Stream", lambda *args, **kwargs: None)
    monkeypatch.setattr(current_platform, "current_device", lambda: torch.device("cpu"), raising=False)
    monkeypatch.setattr(current_platform, "get_attn_backend_cls",
                        lambda *args, **kwargs: "vllm.v1.attention.backends.mla.cpu_mla.CPUMLABackend")
    monkeypatch.setattr(current_platform, "get_mla_prefill_backend_cls",
                        lambda *args, **kwargs: MLAPrefillBackendEnum.CPU.get_class())
    monkeypatch.setattr(mxfp4, "select_deepseek_v4_mxfp4_moe_backend", lambda moe: (Mxfp4MoeBackend.MARLIN, None))
    with set_current_vllm_config(vllm_config):
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.init_distributed_environment(
                world_size=1, rank=0, local_rank=0, distributed_init_method=f"file://{root}/dist", backend="gloo")
            parallel_state.initialize_model_parallel(1, 1)
        with set_default_torch_dtype(torch.bfloat16), torch.device("cpu"):
            model = initialize_model(vllm_config=vllm_config)
        DefaultModelLoader(vllm_config.load_config).load_weights(model, model_config)
    return TinyModel(model, vllm_config, checkpoint)
