"""vLLM's Kimi K3 model with the latency-specialized decode installed once its weights are loaded.

Registered by the plugin under vLLM's own architecture name (`KimiK3ForConditionalGeneration`), lazily: this module
is imported only when vLLM builds a Kimi K3 model. With `kimi_k3_decode_backend` unset or `auto` the class is
vLLM's, unchanged. For an admitted `latency_specialized` deployment, `load_weights` ends by installing a
`vllm_decode.PathDecode` in the language model's `specialized_decode` slot, which vLLM's
`KimiLinearForCausalLM.forward` consults on every step (the slot its own decode_backend=latency_specialized uses).
It is built here, after the checkpoint is loaded and before `process_weights_after_loading` lets the MoE backend
repack the experts, so the specialized path reads the MXFP4 codes and E8M0 scales as the checkpoint stores them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from vllm.distributed import get_tensor_model_parallel_world_size, tensor_model_parallel_all_reduce
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.models.kimi_k3 import KimiK3ForConditionalGeneration

from kimi_k3_path.vllm_decode import PathDecode
from kimi_k3_path import vllm_plugin
from kimi_k3_path.vllm_plugin import check_vllm_config, kimi_k3_config


class LatencySpecializedKimiK3(KimiK3ForConditionalGeneration):
    def __init__(self, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        # The startup guard already admitted (or refused) this deployment; None keeps the stock decode, and then
        # nothing here reads the config (a checkpoint the decode path cannot run still serves with `auto`).
        self.kimi_k3_path_deployment = check_vllm_config(vllm_config)
        if self.kimi_k3_path_deployment is not None:
            self._kimi_k3_path_config = kimi_k3_config(vllm_config.model_config.hf_config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded = super().load_weights(weights)
        deployment = self.kimi_k3_path_deployment
        if deployment is not None:
            language_model = self.language_model
            backbone = language_model.model
            tp = get_tensor_model_parallel_world_size()
            language_model.specialized_decode = PathDecode(
                backbone, deployment, self._kimi_k3_path_config,
                device=backbone.embed_tokens.weight.device,
                conv_state_dim_first=is_conv_state_dim_first(),
                all_reduce=tensor_model_parallel_all_reduce if tp > 1 else None,
                matrix=vllm_plugin.MATRIX,
            )
        return loaded
