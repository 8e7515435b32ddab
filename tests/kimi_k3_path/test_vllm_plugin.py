"""The vLLM plugin against the real vllm package (the [vllm] extra), on CPU: discovery, registration, and the
startup guard rejecting and accepting deployments when vLLM builds its VllmConfig."""

from __future__ import annotations

import copy
import json
import shutil
from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="the real vllm package is not installed (the [vllm] extra)")
pytestmark = pytest.mark.vllm

from vllm.config import DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.model_executor.models.config import MODELS_CONFIG_MAP  # noqa: E402

from kimi_k3_path import vllm_plugin  # noqa: E402
from kimi_k3_path.config import CONFIG_DIR  # noqa: E402
from kimi_k3_path.guard import UnsupportedDeployment  # noqa: E402

K3 = "KimiK3ForConditionalGeneration"
SPECIALIZED = {"kimi_k3_decode_backend": "latency_specialized"}


def _model_dir(root, edit=None):
    config = json.loads((CONFIG_DIR / "tiny.json").read_text())
    if edit:
        edit(config)
    root.mkdir()
    (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> ModelConfig:
    # Built once: the config hook runs once per ModelConfig, so each test gets a fresh copy (see build()).
    return ModelConfig(model=str(_model_dir(tmp_path_factory.mktemp("k3") / "tiny")), skip_tokenizer_init=True)


@pytest.fixture()
def guarded(monkeypatch):
    """The guard installed for one test; MODELS_CONFIG_MAP and the model registry are restored afterwards."""
    from vllm import ModelRegistry

    monkeypatch.setitem(MODELS_CONFIG_MAP, K3, MODELS_CONFIG_MAP[K3])
    monkeypatch.setitem(ModelRegistry.models, K3, ModelRegistry.models[K3])
    vllm_plugin.register()


@pytest.fixture()
def on_h200(monkeypatch):
    # The CPU machine has no GPU; the arch mapping itself is tested on fake platforms below.
    monkeypatch.setattr(vllm_plugin, "gpu_arch", lambda platform=None: "sm_90")


def build(model: ModelConfig, additional_config=None, tp=8, max_num_seqs=64, max_model_len=None, **configs) -> VllmConfig:
    fresh = copy.deepcopy(model)
    fresh.config_updated = False
    if max_model_len is not None:  # as `--max-model-len` leaves it (the tiny checkpoint's own is 4096)
        fresh.max_model_len = max_model_len
    return VllmConfig(
        model_config=fresh,
        device_config=DeviceConfig(device="cpu"),
        parallel_config=configs.pop("parallel_config", ParallelConfig(tensor_parallel_size=tp)),
        scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=4096, is_encoder_decoder=False),
        additional_config=additional_config or {},
        **configs,
    )


def test_the_entry_point_is_declared_and_loaded_by_vllm(monkeypatch):
    ours = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "kimi_k3_latency_specialized"]
    assert [ep.value for ep in ours] == ["kimi_k3_path.vllm_plugin:register"]

    import vllm.plugins
    from vllm import ModelRegistry

    monkeypatch.setitem(MODELS_CONFIG_MAP, K3, MODELS_CONFIG_MAP[K3])
    monkeypatch.setitem(ModelRegistry.models, K3, ModelRegistry.models[K3])
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    assert not getattr(MODELS_CONFIG_MAP[K3], "_kimi_k3_path_guarded", False)
    vllm.plugins.load_general_plugins()
    assert MODELS_CONFIG_MAP[K3]._kimi_k3_path_guarded


def test_registration_wraps_the_stock_hook_once(guarded):
    hook = MODELS_CONFIG_MAP[K3]
    vllm_plugin.register()
    assert MODELS_CONFIG_MAP[K3] is hook
    stock = hook.__mro__[1]
    assert stock.__name__ == "KimiK3ForConditionalGenerationConfig" and not getattr(stock, "_kimi_k3_path_guarded", False)


def test_an_admitted_deployment_starts(tiny_model, guarded, on_h200):
    config = build(tiny_model, SPECIALIZED, tp=16, max_num_seqs=32)
    d = vllm_plugin.check_vllm_config(config)
    assert (d.arch, d.tp, d.dcp, d.max_batch, d.max_context, d.spec_method) == ("sm_90", 16, 1, 32, 4096, None)
    assert (d.kv_dtype, d.act_dtype, d.expert_quant, d.kda_state_dtypes) == (
        "bfloat16", "bfloat16", "mxfp4", ("bfloat16", "float32"),
    )
    # The stock hook still ran first: it rewrites compressed-tensors MXFP4 to vLLM's mxfp4 method.
    assert config.model_config.hf_text_config.quantization_config["quant_method"] == "mxfp4"


def test_an_unsupported_deployment_fails_at_startup_naming_every_setting(tiny_model, guarded):
    with pytest.raises(ValueError) as caught:
        build(tiny_model, SPECIALIZED, tp=2, max_num_seqs=256, parallel_config=ParallelConfig(
            tensor_parallel_size=2, pipeline_parallel_size=2))
    message = str(caught.value)
    assert "Kimi K3 latency-specialized decode does not support this deployment (arch, tp, max_batch, pp)" in message
    # No GPU on this machine: the platform name stands in for the architecture.
    assert "arch='unknown' (supported: sm_90)" in message or "arch='cpu' (supported: sm_90)" in message
    assert "tp=2 (supported: 8, 16)" in message and "max_batch=256" in message and "pp=2" in message


def test_a_context_longer_than_measured_fails_at_startup(tiny_model, guarded, on_h200):
    with pytest.raises(ValueError) as caught:
        build(tiny_model, SPECIALIZED, max_model_len=131072)
    message = str(caught.value)
    assert "does not support this deployment (max_context)" in message
    assert "max_context=131072: longer contexts are not measured (supported: 1..32768)" in message
    assert vllm_plugin.check_vllm_config(build(tiny_model, SPECIALIZED, max_model_len=2048)).max_context == 2048


def test_blackwell_is_refused_for_lack_of_evidence(tiny_model, guarded, monkeypatch):
    monkeypatch.setattr(vllm_plugin, "gpu_arch", lambda platform=None: "sm_100")
    with pytest.raises(ValueError, match="arch='sm_100': no evidence from that hardware exists yet"):
        build(tiny_model, SPECIALIZED)


def test_kv_cache_and_kda_state_dtypes_come_from_the_cache_config(tiny_model, on_h200):
    config = build(tiny_model)
    config.additional_config = dict(SPECIALIZED)
    config.cache_config.cache_dtype = "fp8"
    config.cache_config.mamba_ssm_cache_dtype = "bfloat16"
    with pytest.raises(UnsupportedDeployment) as caught:
        vllm_plugin.check_vllm_config(config)
    assert caught.value.fields == ("kv_dtype", "kda_state_dtypes")


def test_speculative_decoding_is_mapped_and_refused(tiny_model, on_h200):
    config = build(tiny_model)
    config.additional_config = dict(SPECIALIZED)
    config.speculative_config = SimpleNamespace(method="dspark", num_speculative_tokens=3)
    with pytest.raises(UnsupportedDeployment) as caught:
        vllm_plugin.check_vllm_config(config)
    assert caught.value.fields == ("spec_method", "spec_tokens")


def test_auto_keeps_the_stock_path_whatever_the_deployment(tiny_model, guarded):
    config = build(tiny_model, tp=2, max_num_seqs=256)
    assert vllm_plugin.check_vllm_config(config) is None
    config = build(tiny_model, {"kimi_k3_decode_backend": "auto", "decode_backend": "auto"}, tp=2)
    assert vllm_plugin.check_vllm_config(config) is None


def test_an_unknown_backend_name_is_refused(tiny_model, guarded):
    with pytest.raises(ValueError, match=r"kimi_k3_decode_backend='fast' is not a backend; use one of \('auto', "):
        build(tiny_model, {"kimi_k3_decode_backend": "fast"})


def test_a_model_the_decode_path_cannot_run_is_refused_with_the_field(tmp_path, guarded, on_h200):
    def grouped(config):
        config["text_config"]["num_expert_group"] = 8
        config["text_config"]["topk_group"] = 2

    model = ModelConfig(model=str(_model_dir(tmp_path / "grouped", grouped)), skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="text_config.num_expert_group: Input should be 1"):
        build(model, SPECIALIZED)
    shutil.rmtree(tmp_path / "grouped")


@pytest.mark.parametrize(
    ("platform", "arch"),
    [
        (SimpleNamespace(is_cuda=lambda: True, get_device_capability=lambda: SimpleNamespace(major=9, minor=0)), "sm_90"),
        (SimpleNamespace(is_cuda=lambda: True, get_device_capability=lambda: SimpleNamespace(major=10, minor=3)),
         "sm_103"),
        (SimpleNamespace(is_cuda=lambda: True, get_device_capability=lambda: None), "unknown"),
        (SimpleNamespace(is_cuda=lambda: False, is_rocm=lambda: True), "rocm"),
        (SimpleNamespace(is_cuda=lambda: False, is_rocm=lambda: False, device_type="cpu"), "cpu"),
        (SimpleNamespace(is_cuda=lambda: False, is_rocm=lambda: False, device_type=""), "unknown"),
    ],
)
def test_gpu_arch_names_the_platform(platform, arch):
    assert vllm_plugin.gpu_arch(platform) == arch


def test_a_config_without_a_model_is_refused_when_the_backend_is_requested():
    config = SimpleNamespace(additional_config=dict(SPECIALIZED), model_config=None, parallel_config=None,
                             cache_config=None, speculative_config=None)
    with pytest.raises(ValueError, match="kimi_k3_decode_backend=latency_specialized needs a model config"):
        vllm_plugin.check_vllm_config(config)


def test_the_specialized_backend_needs_eager_decode_steps(tiny_model, on_h200):
    """CUDA graphs would capture vLLM's stock decode step and replay it: the executor would never run."""
    from vllm.config import CUDAGraphMode

    config = build(tiny_model)
    config.additional_config = dict(SPECIALIZED)
    config.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    with pytest.raises(ValueError, match="runs its decode steps eagerly.*start vLLM with --enforce-eager"):
        vllm_plugin.check_vllm_config(config)
    config.compilation_config.cudagraph_mode = CUDAGraphMode.NONE
    assert vllm_plugin.check_vllm_config(config).tp == 8


def test_registration_routes_kimi_k3_to_the_plugins_model_class(guarded):
    from vllm import ModelRegistry

    registered = ModelRegistry.models[K3]
    assert (registered.module_name, registered.class_name) == ("kimi_k3_path.vllm_model", "LatencySpecializedKimiK3")
