"""The tiny Kimi K3 model vLLM builds and loads on CPU, shared by the vllm-marked tests of this directory (built
once per session: importing and building vLLM's model takes most of a minute on the 2-core CI machine)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_k3(tmp_path_factory):
    """The plugin registered, the deployment admitted (`latency_specialized`), the model built and loaded by vLLM
    (tiny_vllm.py says what is patched to build it on CPU). Everything patched is restored once it is built, so
    the other tests of the session see vLLM and the plugin unregistered."""
    pytest.importorskip("vllm", reason="the real vllm package is not installed (the [vllm] extra)")
    import torch
    from tiny_vllm import build_model
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    from kimi_k3_path import vllm_plugin
    from kimi_k3_path.support import SUPPORT_MATRIX

    with pytest.MonkeyPatch.context() as patch:
        for table in (MODELS_CONFIG_MAP, ModelRegistry.models):
            patch.setitem(table, "KimiK3ForConditionalGeneration", table["KimiK3ForConditionalGeneration"])
        vllm_plugin.register()
        patch.setattr(vllm_plugin, "gpu_arch", lambda platform=None: "sm_90")  # no GPU here; the guard wants sm_90
        # One process is one rank: the model is built at TP 1, which the matrix admits for these tests only.
        patch.setattr(vllm_plugin, "MATRIX", SUPPORT_MATRIX.model_copy(update={"tp": (1, 8, 16)}))
        tiny = build_model(tmp_path_factory.mktemp("k3"), torch.Generator().manual_seed(37), patch,
                           {"kimi_k3_decode_backend": "latency_specialized"})
    return tiny
