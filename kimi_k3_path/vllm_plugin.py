"""vLLM entry point (`vllm.general_plugins`): the opt-in `latency_specialized` Kimi K3 decode backend.

Select it with `--additional-config '{"kimi_k3_decode_backend": "latency_specialized"}'`; `auto` (the default)
keeps vLLM's stock decode. `register()` hooks Kimi K3's config verification, so when vLLM builds its VllmConfig
(`VllmConfig.__post_init__` -> `try_verify_and_update_config`, before any weight or kernel exists) the deployment
is mapped to a `Deployment` and checked by `check_deployment`: an unsupported one fails at startup with the
guard's message naming every unsupported setting.

For such a deployment the plugin also routes decode steps: `register()` replaces vLLM's Kimi K3 model class by
`vllm_model.LatencySpecializedKimiK3` (lazily; vLLM's class, unchanged for `auto`), which installs the decode
executor (`vllm_decode.PathDecode`) in the slot vLLM's own latency_specialized decode uses, once the weights are
loaded. The executor runs its steps eagerly, so the backend also needs `--enforce-eager` (checked at startup).

The key differs from vLLM's own `decode_backend` (its GB300 CuTe DSL path) so the two never select each other.
This module imports without vllm (the gatekeeper's static checks load it); vllm is imported inside functions.
"""

from __future__ import annotations

from typing import Any

from kimi_k3_path.config import ConfigError, KimiK3Config, parse_config
from kimi_k3_path.guard import check_deployment
from kimi_k3_path.support import SUPPORT_MATRIX, Deployment

BACKEND_KEY = "kimi_k3_decode_backend"
BACKEND_NAME = "latency_specialized"
STOCK = "auto"
BACKENDS = (STOCK, BACKEND_NAME)
# The vLLM architectures whose config verification carries the guard (the MTP drafter is a speculative method,
# which the support matrix does not admit yet).
KIMI_K3_ARCHITECTURES = ("KimiK3ForConditionalGeneration",)

_GUARDED = "_kimi_k3_path_guarded"
# What the plugin admits; read at each call, so a CPU test of a one-rank model can widen it for itself.
MATRIX = SUPPORT_MATRIX
# vLLM builds this class for KimiK3ForConditionalGeneration once the plugin is registered.
MODEL_CLASS = "kimi_k3_path.vllm_model:LatencySpecializedKimiK3"


def register() -> None:
    """Install the startup guard on Kimi K3's config verification and the model class that routes decode steps.
    vLLM calls this in every process, possibly more than once; a second call changes nothing."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP, VerifyAndUpdateConfig

    for architecture in KIMI_K3_ARCHITECTURES:
        stock = MODELS_CONFIG_MAP.get(architecture, VerifyAndUpdateConfig)
        if not getattr(stock, _GUARDED, False):
            MODELS_CONFIG_MAP[architecture] = _with_guard(stock)
        # A lazy registration: the class (and vLLM's model code) is imported only when a Kimi K3 model is built.
        ModelRegistry.register_model(architecture, MODEL_CLASS)


def _with_guard(stock: type) -> type:
    """`stock`'s verification, then the guard: the stock hook may rewrite the quantization config we read."""

    def verify_and_update_config(vllm_config: Any) -> None:
        stock.verify_and_update_config(vllm_config)
        check_vllm_config(vllm_config)

    return type(
        f"LatencySpecialized{stock.__name__}",
        (stock,),
        {_GUARDED: True, "verify_and_update_config": staticmethod(verify_and_update_config), "__doc__": stock.__doc__},
    )


def requested_backend(vllm_config: Any) -> str:
    """The decode backend the deployment asks for; raises ValueError for a name that is not a backend."""
    extra = vllm_config.additional_config
    backend = extra.get(BACKEND_KEY, STOCK) if isinstance(extra, dict) else STOCK
    if backend not in BACKENDS:
        raise ValueError(f"additional_config {BACKEND_KEY}={backend!r} is not a backend; use one of {BACKENDS}")
    return backend


def check_vllm_config(vllm_config: Any) -> Deployment | None:
    """The startup gate. None for the stock backend; the admitted Deployment for `latency_specialized`;
    otherwise raises `UnsupportedDeployment` (a ValueError) naming every unsupported setting."""
    if requested_backend(vllm_config) == STOCK:
        return None
    deployment = deployment_from_vllm_config(vllm_config)
    check_deployment(deployment, MATRIX)
    _require_eager(vllm_config)
    return deployment


def _require_eager(vllm_config: Any) -> None:
    """The executor runs each decode step in Python (the reference ops read sequence lengths on the host): a CUDA
    graph would capture the stock step and replay it, so the specialized path would never run."""
    compilation = vllm_config.compilation_config
    mode = getattr(compilation, "cudagraph_mode", None)
    if mode is not None and getattr(mode, "name", str(mode)) != "NONE":
        raise ValueError(
            f"{BACKEND_KEY}={BACKEND_NAME} runs its decode steps eagerly, but this deployment captures CUDA graphs "
            f"(cudagraph_mode={getattr(mode, 'name', mode)}): start vLLM with --enforce-eager"
        )


def deployment_from_vllm_config(vllm_config: Any) -> Deployment:
    """Map vLLM's settings onto the Deployment the support matrix speaks about."""
    model, parallel, cache = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
    spec = vllm_config.speculative_config
    if model is None:
        raise ValueError(f"{BACKEND_KEY}={BACKEND_NAME} needs a model config (Kimi K3)")
    act_dtype = _dtype_name(model.dtype)
    return Deployment(
        arch=gpu_arch(),
        tp=parallel.tensor_parallel_size,
        dcp=parallel.decode_context_parallel_size,
        pp=parallel.pipeline_parallel_size,
        expert_parallel=bool(parallel.enable_expert_parallel),
        max_batch=vllm_config.scheduler_config.max_num_seqs,
        max_context=model.max_model_len,
        spec_method=None if spec is None else spec.method,
        spec_tokens=0 if spec is None else spec.num_speculative_tokens,
        kv_dtype=act_dtype if cache.cache_dtype == "auto" else str(cache.cache_dtype),
        act_dtype=act_dtype,
        expert_quant=_expert_quant(model.hf_config),
        kda_state_dtypes=_kda_state_dtypes(model.dtype, cache),
    )


def gpu_arch(platform: Any = None) -> str:
    """'sm_90' style for CUDA GPUs, else the platform's name ('rocm', 'cpu', ...), from vLLM's current platform."""
    if platform is None:
        from vllm.platforms import current_platform as platform
    if platform.is_cuda():
        capability = platform.get_device_capability()
        return "unknown" if capability is None else f"sm_{capability.major}{capability.minor}"
    if platform.is_rocm():
        return "rocm"
    return platform.device_type if platform.device_type in ("cpu", "xpu", "tpu") else "unknown"


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def kimi_k3_config(hf_config: Any) -> KimiK3Config:
    """The model's config read through our own parser, so a config the decode path cannot run (another model under
    the same architecture name) fails here with the field named."""
    data = hf_config.to_dict() if hasattr(hf_config, "to_dict") else hf_config
    try:
        return parse_config(data, source="the model's config.json")
    except ConfigError as error:
        raise ValueError(f"{BACKEND_KEY}={BACKEND_NAME} cannot serve this model:\n{error}") from None


def _expert_quant(hf_config: Any) -> str:
    """The routed experts' format."""
    return kimi_k3_config(hf_config).text_config.expert_quant


def _kda_state_dtypes(model_dtype: Any, cache: Any) -> tuple[str, str]:
    """(conv, recurrent) KDA state dtypes, resolved the way vLLM's KDA layers resolve them."""
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator

    conv, recurrent = MambaStateDtypeCalculator.kda_state_dtype(
        model_dtype, cache.mamba_cache_dtype, cache.mamba_ssm_cache_dtype
    )
    return _dtype_name(conv), _dtype_name(recurrent)
