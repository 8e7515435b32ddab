"""The whole-step case of the bench (benchmarks/kimi_k3/step.py) on CPU: the stack follows the config, the stock-like
step composes its layers as the fp32 reference step does (Triton's CPU interpreter, tiny config, two AttnRes
blocks), and `--layer step --cpu-smoke` writes valid perf evidence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the bench needs the [kernels] extra")
pytest.importorskip("triton", reason="the bench needs Triton (installed with torch on Linux)")

from benchmarks.kimi_k3 import step  # noqa: E402
from kimi_k3_path.config import named_config  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
COMPOSITION_BAR = 0.2


def _run(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_stack_is_the_models_first_layers_in_order():
    layers = step.stack_layers(named_config("kimi_k3"), 12)
    assert [layer.pos.layer for layer in layers] == list(range(12))
    assert [layer.kind for layer in layers] == ["kda_dense", "kda_moe", "kda_moe", "mla_moe"] + ["kda_moe"] * 3 + [
        "mla_moe"] + ["kda_moe"] * 3 + ["mla_moe"]
    assert layers[0].pos.writes_block and not any(layer.pos.writes_block for layer in layers[1:])
    assert step.describe(layers) == "layers 0-11: 1 kda_dense, 8 kda_moe, 3 mla_moe"


@pytest.mark.parametrize("count", [0, 94])
def test_a_step_of_layers_the_model_does_not_have_is_refused(count):
    with pytest.raises(ValueError, match=r"a step of -?\d+ layers: the model has 1..93"):
        step.stack_layers(named_config("kimi_k3"), count)


# Runs in its own interpreter: Triton reads TRITON_INTERPRET when the stock kernels are defined.
_COMPOSITION = textwrap.dedent("""
    import copy, dataclasses, json, sys
    import torch
    from benchmarks.kimi_k3 import step
    from kimi_k3_path.config import named_config, shard_shapes
    from kimi_k3_path.reference import (KdaState, LayerPosition, PagedLatentCache, kda_decode_step, latent_moe,
                                        mla_decode, rel_err)
    from kimi_k3_path.reference.dims import layer_dims

    def rounded(obj):
        # bf16-representable weights and state, so that only the activations differ between the two paths
        if isinstance(obj, torch.Tensor):
            return obj.bfloat16().float() if obj.is_floating_point() else obj
        if dataclasses.is_dataclass(obj):
            return dataclasses.replace(obj, **{f.name: rounded(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
        return obj

    def margins(w, gen):
        # Correction biases a whole score range apart: bf16 rounding upstream cannot flip the top-k selection.
        if not hasattr(w, "moe"):
            return w
        bias = torch.randperm(w.moe.router_bias.numel(), generator=gen).float() * 1.5
        return dataclasses.replace(w, moe=dataclasses.replace(w.moe, router_bias=bias))

    config, tp, batch = named_config("tiny"), 8, 3
    dims = layer_dims(config, tp)
    layers = step.stack_layers(config, config.text_config.num_hidden_layers)  # two AttnRes blocks
    gen = torch.Generator().manual_seed(int(sys.argv[1]))
    weights = [rounded(margins(w, gen)) for w in
               step.random_weights(layers, dims, shard_shapes(config, tp).dense_intermediate, gen)]
    states = [rounded(s) for s in step.random_states(layers, dims, batch, 20, 8, gen)]
    x = torch.randn(batch, dims.moe.hidden, generator=gen).bfloat16()
    before = copy.deepcopy(states)
    expected = step.reference_step(x.float(), layers, weights, states, dims)
    stack = step.DeviceStack(layers, weights, dims, "cpu", None, None, sms=4)
    fn = stack.step_fn(x, states, specialized=False)
    first, second = fn().float(), fn().float()
    fresh = stack.step_fn(x, states, specialized=True)().float()
    # The specialized step with stand-ins for the kernels (the fp32 reference ops, state updated in place as the
    # kernels update it): every MoE, KDA and MLA layer must go through them.
    calls = {"moe": 0, "kda": 0, "mla": 0}

    def moe_kernels(w):
        def run(h):
            calls["moe"] += 1
            return latent_moe(h.float(), w, dims.moe).bfloat16()
        return run

    def kda_kernels(w):
        def run(h, state):
            calls["kda"] += 1
            o, new = kda_decode_step(h.float(), w, KdaState(state.conv.float(), state.recurrent), dims.kda)
            state.conv.copy_(new.conv)
            state.recurrent.copy_(new.recurrent)
            return o.bfloat16()
        return run

    def mla_kernels(w):
        def run(h, cache):
            calls["mla"] += 1
            o, new = mla_decode(h.float(), w, PagedLatentCache(cache.pages.float(), cache.block_table, cache.seq_lens),
                                dims.mla)
            row = cache.pages.shape[2]
            cache.pages.view(-1, row)[cache.slots] = new.pages.view(-1, row)[cache.slots].bfloat16()
            return o.bfloat16()
        return run

    special = step.DeviceStack(layers, weights, dims, "cpu", moe_kernels, kda_kernels, sms=4, mla_kernels=mla_kernels)
    special_err = rel_err(special.step_fn(x, states, specialized=True)().float(), expected)
    # The same stack without its second block boundary (layer 4 mixing as if inside block 0): a composition mistake.
    shifted = tuple(dataclasses.replace(l, pos=LayerPosition(l.pos.layer, 2 * l.pos.block_size)) for l in layers)
    wrong = step.reference_step(x.float(), shifted, weights, states, dims)
    print(json.dumps({
        "err": rel_err(first, expected), "wrong": rel_err(first, wrong), "fresh": rel_err(fresh, first),
        "second": rel_err(second, first), "special": special_err, "calls": calls,
        "untouched": all(torch.equal(a.recurrent if hasattr(a, "recurrent") else a.pages,
                                     b.recurrent if hasattr(b, "recurrent") else b.pages) for a, b in zip(before, states)),
    }))
""")


@pytest.mark.slow
def test_the_stock_like_step_composes_the_layers_as_the_reference_step():
    # A fixed seed: over random ones the bar cannot separate the two cases every time. Seed 13951513 put the right
    # composition 0.34 off (the same stack with fp32 ops and bf16 only between layers: 0.28 off, so the bf16 rounding
    # between 8 tiny random layers, not the composition), seed 31689 the shifted one only 0.16 off; the other seeds
    # 7932 + 7919 k (k < 12) gave 0.027-0.064 and 0.78-1.27.
    seed = 7932
    proc = _run(["-c", _COMPOSITION, str(seed)])
    assert proc.returncode == 0, f"seed {seed}\n{proc.stderr[-3000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # bf16 activations and residual stream through 8 tiny layers against fp32: 1.4e-2 to 9e-2 over the seeds tried;
    # without the second block boundary 0.49 to 1.16. The same bar rejects that mistake.
    assert result["err"] < COMPOSITION_BAR, (seed, result)
    assert result["wrong"] > COMPOSITION_BAR, (seed, result)
    # Each closure has its own state copies, updated in place: a fresh closure repeats the first step exactly,
    # the same closure's second step differs (the state moved on), and the reference states are untouched.
    assert result["fresh"] == 0.0 and result["second"] > 1e-3 and result["untouched"], (seed, result)
    # The tiny config's 8 layers: KDA at 0, 1, 2, 4, 5, 6, MLA at 3 and 7; an MoE everywhere but layer 0.
    assert result["calls"] == {"moe": 7, "kda": 6, "mla": 2} and result["special"] < COMPOSITION_BAR, (seed, result)


@pytest.mark.slow
def test_cpu_smoke_step_rows_are_valid_perf_evidence(tmp_path):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema comes with the [dev] extra")
    out = tmp_path / "step.json"
    proc = _run(["-m", "benchmarks.kimi_k3.bench", "--cpu-smoke", "--layer", "step", "--tp", "16", "--batch", "2",
                 "--replays", "1", "--commit", "0123abc", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    schema = json.loads((REPO / "schemas" / "perf_evidence.v1.json").read_text())
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(json.loads(out.read_text()))
    (row,) = json.loads(out.read_text())["rows"]
    assert row["axes"]["layer"] == "step" and row["axes"]["batch"] == 2 and row["axes"]["context"] == 24
    assert row["floor"] > 0 and row["baseline"]["runs"] == 1
    assert "layers 0-3: 1 kda_dense, 2 kda_moe, 1 mla_moe" in row["note"]
    assert "specialized vs stock-like step output rel err 0.00e+00" in row["note"]  # A/A on CPU: the same ops
    assert "tokens/s per rank" in row["note"]
