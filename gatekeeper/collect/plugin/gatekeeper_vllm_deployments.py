"""Probe deployments as vLLM itself builds them: a `VllmConfig` made on the CPU, with the platform faked to the
probed GPU. Imported only by gatekeeper_probe_runner.py, in the child process, next to the vLLM under review.

How the platform is faked: vLLM resolves `vllm.platforms.current_platform` once, to one object that every module
shares. On a machine without a GPU it is an `UnspecifiedPlatform`. For the probe, that very object's class is
swapped for a subclass answering as the probed GPU (CUDA capability 9.0 / 10.0 / 10.3, or ROCm gfx942 / gfx950,
whose module-level architecture flags vLLM computes from `torch.cuda.get_device_properties`, faked as well),
while `VllmConfig.__post_init__` runs and while the guard runs, and swapped back afterwards. The sub-configs
(parallel, cache, scheduler, speculative) are built before the swap, as on the CPU: vLLM would otherwise count
the machine's GPUs (none) against the tensor-parallel size.

Only the standard library and vLLM (with torch) are imported: this runs in the environment of the code under review.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import os
import sys
import types

# arch -> (platform, device capability, ROCm GCN arch, compute units)
ARCHES = {
    "sm_90": ("cuda", (9, 0), None, 132),
    "sm_100": ("cuda", (10, 0), None, 148),
    "sm_103": ("cuda", (10, 3), None, 148),
    "gfx942": ("rocm", (9, 4), "gfx942:sramecc+:xnack-", 304),
    "gfx950": ("rocm", (9, 5), "gfx950:sramecc+:xnack-", 256),
    "cpu": ("cpu", None, None, 0),
}
# The deployment keys a probe may set (docs/policy.md, "probe_builder: vllm").
KEYS = frozenset({
    "arch", "tp", "pp", "dp", "dcp", "pcp", "expert_parallel", "max_batch", "max_model_len", "dtype",
    "kv_cache_dtype", "block_size", "mamba_cache_dtype", "spec_method", "spec_tokens", "cudagraph_mode",
    "compilation", "additional_config", "kernel", "attention", "env", "cus",
})


class Builder:
    """Builds one VllmConfig per probe from one HF config.json (`model_dir`), reusing the parsed ModelConfig."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self._models: dict[tuple, object] = {}

    def _model(self, dtype: str, max_model_len: int):
        from vllm.config import ModelConfig

        key = (dtype, max_model_len)
        if key not in self._models:
            self._models[key] = ModelConfig(model=self.model_dir, dtype=dtype, max_model_len=max_model_len,
                                            skip_tokenizer_init=True)
        fresh = copy.deepcopy(self._models[key])
        fresh.config_updated = False  # the model's config hook runs once per VllmConfig, as in a real start
        return fresh

    @contextlib.contextmanager
    def deployment(self, spec: dict):
        """Yields the VllmConfig of one probe deployment, with the platform faked until the block ends."""
        unknown = sorted(set(spec) - KEYS)
        if unknown:
            raise ValueError(f"unknown deployment keys {unknown}; known: {sorted(KEYS)}")
        arch = spec.get("arch", "cpu")
        if arch not in ARCHES:
            raise ValueError(f"unknown arch {arch!r}; known: {sorted(ARCHES)}")
        with _environment({str(k): str(v) for k, v in (spec.get("env") or {}).items()}):
            from vllm.config import (AttentionConfig, CacheConfig, CompilationConfig, DeviceConfig, KernelConfig,
                                     ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig)

            model = self._model(spec.get("dtype", "auto"), int(spec.get("max_model_len", 4096)))
            tp = int(spec.get("tp", 1))
            parallel = ParallelConfig(
                tensor_parallel_size=tp, pipeline_parallel_size=int(spec.get("pp", 1)),
                data_parallel_size=int(spec.get("dp", 1)),
                decode_context_parallel_size=int(spec.get("dcp", 1)),
                prefill_context_parallel_size=int(spec.get("pcp", 1)),
                enable_expert_parallel=bool(spec.get("expert_parallel", False)),
            )
            cache_kwargs = {"cache_dtype": spec.get("kv_cache_dtype", "auto")}
            if "block_size" in spec:
                cache_kwargs["block_size"] = int(spec["block_size"])
            if "mamba_cache_dtype" in spec:
                cache_kwargs["mamba_cache_dtype"] = spec["mamba_cache_dtype"]
            compilation = dict(spec.get("compilation") or {})
            if "cudagraph_mode" in spec:
                compilation["cudagraph_mode"] = spec["cudagraph_mode"]
            configs = {
                "model_config": model,
                "device_config": DeviceConfig(device="cpu"),
                "parallel_config": parallel,
                "cache_config": CacheConfig(**cache_kwargs),
                "scheduler_config": SchedulerConfig(max_num_seqs=int(spec.get("max_batch", 64)),
                                                    max_model_len=model.max_model_len, is_encoder_decoder=False),
                "compilation_config": CompilationConfig(**compilation),
                "kernel_config": KernelConfig(**(spec.get("kernel") or {})),
                "attention_config": AttentionConfig(**(spec.get("attention") or {})),
                "additional_config": dict(spec.get("additional_config") or {}),
            }
            if spec.get("spec_method") is not None:
                configs["speculative_config"] = _speculative(SpeculativeConfig, spec, model, parallel)
            with fake_platform(arch, spec.get("cus")):
                config = VllmConfig(**configs)
                with _as_when_vllm_builds_the_model(config):
                    yield config


@contextlib.contextmanager
def _as_when_vllm_builds_the_model(config):
    """The context a model's constructor runs in: the current VllmConfig set, and vLLM's process groups up. This
    process is one rank (a guard's collective over the TP group is then this rank's own answer)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state

    with set_current_vllm_config(config):
        if not parallel_state.model_parallel_is_initialized():
            import socket

            with socket.socket() as free:
                free.bind(("127.0.0.1", 0))
                port = free.getsockname()[1]
            parallel_state.init_distributed_environment(
                world_size=1, rank=0, local_rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo")
            parallel_state.initialize_model_parallel(1, 1)
        yield


def _speculative(cls, spec: dict, model, parallel):
    method, tokens = spec["spec_method"], int(spec.get("spec_tokens", 1))
    kwargs = {"method": method, "num_speculative_tokens": tokens, "target_model_config": model,
              "target_parallel_config": parallel}
    if method == "ngram":  # the one method without a draft model: what a CPU probe can build
        kwargs.update(prompt_lookup_max=max(tokens, 2), prompt_lookup_min=1)
    return cls(**kwargs)


def describe(config) -> dict:
    """The deployment as the built VllmConfig states it: what the guard actually saw."""
    from vllm.platforms import current_platform

    pc, cc, spec = config.parallel_config, config.cache_config, config.speculative_config
    capability = current_platform.get_device_capability()
    return {
        "platform": type(current_platform).__name__,
        "capability": None if capability is None else f"{capability.major}.{capability.minor}",
        "tp": pc.tensor_parallel_size, "pp": pc.pipeline_parallel_size, "dp": pc.data_parallel_size,
        "dcp": pc.decode_context_parallel_size, "expert_parallel": bool(pc.enable_expert_parallel),
        "max_batch": config.scheduler_config.max_num_seqs, "dtype": str(config.model_config.dtype).replace("torch.", ""),
        "kv_cache_dtype": str(cc.cache_dtype), "block_size": cc.block_size,
        "mamba_cache_dtype": str(cc.mamba_cache_dtype),
        "spec_method": None if spec is None else spec.method,
        "spec_tokens": 0 if spec is None else spec.num_speculative_tokens,
        "cudagraph_mode": str(config.compilation_config.cudagraph_mode),
        "v2_model_runner": bool(config.use_v2_model_runner),
    }


@contextlib.contextmanager
def fake_platform(arch: str, cus: int | None = None):
    """`vllm.platforms.current_platform` answering as `arch` until the block ends."""
    kind, capability, gcn, default_cus = ARCHES[arch]
    if kind == "cpu":
        yield
        return
    import torch

    import vllm.platforms as platforms
    from vllm.platforms.interface import DeviceCapability, PlatformEnum

    platform = platforms.current_platform
    real_class, real_props = type(platform), torch.cuda.get_device_properties
    props = types.SimpleNamespace(name=f"faked {arch}", gcnArchName=gcn or "", multi_processor_count=cus or default_cus,
                                  major=capability[0], minor=capability[1], total_memory=192 << 30)
    torch.cuda.get_device_properties = lambda *args, **kwargs: props
    rocm_flags = _fake_rocm_flags(gcn) if kind == "rocm" else contextlib.nullcontext()

    class FakedGpu(real_class):
        _enum = PlatformEnum.CUDA if kind == "cuda" else PlatformEnum.ROCM
        device_name = device_type = "cuda"
        dispatch_key = "CUDA"

        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(*capability)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return f"faked {arch}"

        @classmethod
        def support_static_graph_mode(cls) -> bool:
            return True

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            return props.multi_processor_count

    FakedGpu.__name__ = FakedGpu.__qualname__ = f"Faked{kind.capitalize()}Platform_{arch}"
    try:
        with rocm_flags:
            platform.__class__ = FakedGpu
            yield
    finally:
        platform.__class__ = real_class
        torch.cuda.get_device_properties = real_props


@contextlib.contextmanager
def _fake_rocm_flags(gcn: str):
    """vllm.platforms.rocm computes its gfx flags once, at import, from the device: import it (or reset its flags)
    as if `gcn` were the device, and restore the flags afterwards."""
    name = "vllm.platforms.rocm"
    if name not in sys.modules:
        importlib.import_module(name)  # torch.cuda.get_device_properties is faked by the caller
    module = sys.modules[name]
    saved = {k: v for k, v in vars(module).items() if k.startswith("_ON_") or k == "_GCN_ARCH"}
    module._GCN_ARCH = gcn
    for flag in saved:
        if flag.startswith("_ON_GFX") and flag[len("_ON_GFX"):].isdigit():
            setattr(module, flag, f"gfx{flag[len('_ON_GFX'):].lower()}" in gcn)
    module._ON_CDNA = "gfx9" in gcn
    try:
        yield
    finally:
        for flag, value in saved.items():
            setattr(module, flag, value)


@contextlib.contextmanager
def _environment(env: dict[str, str]):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
