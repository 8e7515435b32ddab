from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

from kimi_k3_path.config import named_config  # noqa: E402
from kimi_k3_path.executor import (  # noqa: E402
    SPECIALIZED,
    ComposedPath,
    DecodeExecutor,
    DecodeOps,
    KernelKdaStep,
    KernelLatentMoe,
    KernelMlaDecode,
    ReferenceLayers,
    StepBatch,
    build_executor,
    kernel_ops,
    kernels_unavailable,
)
from kimi_k3_path.reference import (  # noqa: E402
    KdaDims,
    KdaMoeLayerWeights,
    KdaState,
    LayerPosition,
    MlaDims,
    MlaMoeLayerWeights,
    MoeDims,
    PagedLatentCache,
    kda_decode_step,
    latent_moe,
    mla_decode,
    mla_decode_unabsorbed,
    naive,
    random_kda_moe_layer,
    random_kda_state,
    random_kda_weights,
    random_layer_norms,
    random_mla_moe_layer,
    random_mla_weights,
    random_moe_weights,
    random_paged_cache,
    random_residual_stream,
)
from kimi_k3_path.reference.compare import rel_err  # noqa: E402
from kimi_k3_path.reference.dims import layer_dims  # noqa: E402
from kimi_k3_path.support import SUPPORT_MATRIX, Deployment  # noqa: E402

H200_TP8 = Deployment(arch="sm_90", tp=8, max_batch=64, max_context=4096)


@pytest.fixture
def gen(request) -> torch.Generator:
    seed = int(os.environ.get("KIMI_K3_TEST_SEED", secrets.randbits(31)))
    print(f"torch.Generator seed {seed} (replay with KIMI_K3_TEST_SEED={seed})")
    return torch.Generator().manual_seed(seed)


# --- batch classification ------------------------------------------------------------------------------------


def test_batch_kinds():
    assert StepBatch.decode([5, 1, 300]).kind() == "decode"
    assert StepBatch(query_lens=(7, 3), context_lens=(0, 0)).kind() == "prefill"
    # A later chunk of a chunked prefill has context but brings several tokens: still prefill.
    assert StepBatch(query_lens=(16,), context_lens=(512,)).kind() == "prefill"
    assert StepBatch(query_lens=(1, 9), context_lens=(40, 0)).kind() == "mixed"
    # With 3 draft tokens a decoding sequence brings 4 tokens (verify); a single token is then not a decode.
    assert StepBatch(query_lens=(4, 4), context_lens=(10, 20)).kind(tokens_per_step=4) == "decode"
    assert StepBatch.decode([10]).kind(tokens_per_step=4) == "prefill"


@pytest.mark.parametrize(
    ("query_lens", "context_lens", "message"),
    [((), (), "at least one sequence"), ((1,), (1, 2), "1 query_lens but 2 context_lens"),
     ((0,), (3,), "query_lens must be >= 1"), ((1,), (-1,), "context_lens >= 0")],
)
def test_malformed_batches_are_refused(query_lens, context_lens, message):
    with pytest.raises(ValueError, match=message):
        StepBatch(query_lens=query_lens, context_lens=context_lens)


# --- dispatch follows the guard ------------------------------------------------------------------------------


@dataclass
class Recorder:
    """A path that records which layers it ran and returns its name as the output."""

    name: str
    calls: list[str] = field(default_factory=list)

    def kda_moe(self, delta, stream, weights, state, pos, dims):
        self.calls.append("kda_moe")
        return self.name, stream, state

    def mla_moe(self, delta, stream, weights, cache, pos, dims):
        self.calls.append("mla_moe")
        return self.name, stream, cache


def run_step(executor: DecodeExecutor, batch: StepBatch, layer: str = "kda_moe"):
    delta = torch.zeros(sum(batch.query_lens), 4)
    out, _, _ = getattr(executor, layer)(batch, delta, "stream", "weights", "state", "pos", "dims")
    return out


def recording_executor(deployment: Deployment) -> DecodeExecutor:
    return DecodeExecutor(deployment, Recorder(SPECIALIZED), Recorder("stock"))


@pytest.mark.parametrize("d", SUPPORT_MATRIX.example_deployments(), ids=lambda d: f"tp{d.tp}")
@pytest.mark.parametrize("layer", ["kda_moe", "mla_moe"])
def test_decode_batches_of_an_admitted_deployment_take_the_specialized_path(d, layer):
    executor = recording_executor(d)
    for batch in SUPPORT_MATRIX.perf_batches:
        assert run_step(executor, StepBatch.decode([3] * batch), layer) == SPECIALIZED
    assert executor.specialized.calls == [layer] * len(SUPPORT_MATRIX.perf_batches)
    assert executor.stock.calls == []
    assert executor.summary() == {
        f"{SPECIALIZED}: decode batch inside the support matrix": len(SUPPORT_MATRIX.perf_batches)
    }


@pytest.mark.parametrize(
    ("batch", "reason"),
    [
        (StepBatch(query_lens=(5, 2), context_lens=(0, 0)), "prefill batch"),
        (StepBatch(query_lens=(1, 5), context_lens=(9, 0)), "mixed batch"),
        (StepBatch.decode([2] * 65), "decode batch of 65 exceeds max_batch 64"),
        (StepBatch.decode([4096, 4097]), "context of 4097 cached tokens exceeds max_context 4096"),
    ],
)
def test_prefill_mixed_and_oversized_batches_take_the_stock_path(batch, reason):
    executor = recording_executor(H200_TP8)
    assert run_step(executor, batch) == "stock"
    assert executor.summary() == {f"stock: {reason}": 1}


def test_the_measured_contexts_take_the_specialized_path_and_longer_ones_the_stock_path():
    executor = recording_executor(H200_TP8.model_copy(update={"max_context": SUPPORT_MATRIX.max_context}))
    for context in (1, *SUPPORT_MATRIX.perf_contexts):
        assert run_step(executor, StepBatch.decode([context, 1]), "mla_moe") == SPECIALIZED
    longer = SUPPORT_MATRIX.max_context + 1
    assert run_step(executor, StepBatch.decode([1, longer]), "mla_moe") == "stock"
    assert executor.summary() == {
        f"{SPECIALIZED}: decode batch inside the support matrix": 1 + len(SUPPORT_MATRIX.perf_contexts),
        f"stock: context of {longer} cached tokens exceeds max_context {SUPPORT_MATRIX.max_context}": 1,
    }


def test_the_deployment_context_bound_applies_when_tighter_than_the_matrix():
    executor = recording_executor(Deployment(arch="sm_90", tp=8, max_batch=64, max_context=2048))
    assert run_step(executor, StepBatch.decode([2048] * 4)) == SPECIALIZED
    assert executor.decide(StepBatch.decode([2049] * 4)).reason == "context of 2049 cached tokens exceeds max_context 2048"
    widened = SUPPORT_MATRIX.model_copy(update={"max_context": 32768, "perf_contexts": (4096, 32768)})
    wide = DecodeExecutor(Deployment(arch="sm_90", tp=8, max_batch=64, max_context=32768), Recorder(SPECIALIZED),
                          Recorder("stock"), widened)
    assert wide.decide(StepBatch.decode([32768])).path == SPECIALIZED
    assert wide.decide(StepBatch.decode([32769])).reason == "context of 32769 cached tokens exceeds max_context 32768"


def test_the_deployment_bound_applies_when_tighter_than_the_matrix():
    executor = recording_executor(Deployment(arch="sm_90", tp=16, max_batch=8, max_context=4096))
    assert run_step(executor, StepBatch.decode([1] * 8)) == SPECIALIZED
    assert run_step(executor, StepBatch.decode([1] * 9)) == "stock"
    assert executor.decide(StepBatch.decode([1] * 9)).reason == "decode batch of 9 exceeds max_batch 8"


@pytest.mark.parametrize(
    ("deployment", "fields"),
    [
        (Deployment(arch="sm_100", tp=8, max_batch=64, max_context=4096), "arch"),
        (Deployment(arch="sm_90", tp=4, max_batch=64, max_context=4096, kv_dtype="fp8"), "tp, kv_dtype"),
        (Deployment(arch="sm_90", tp=8, max_batch=64, max_context=4096, spec_method="dspark", spec_tokens=3), "spec_method, spec_tokens"),
    ],
)
def test_a_deployment_the_guard_rejects_always_takes_the_stock_path(deployment, fields):
    executor = recording_executor(deployment)
    assert executor.rejection is not None and executor.rejection.deployment is deployment
    assert run_step(executor, StepBatch.decode([4, 4])) == "stock"
    assert run_step(executor, StepBatch.decode([4, 4]), "mla_moe") == "stock"
    assert executor.summary() == {f"stock: deployment outside the support matrix ({fields})": 2}
    assert executor.specialized.calls == []


def test_the_guard_decides_with_the_matrix_it_is_given():
    widened = SUPPORT_MATRIX.model_copy(update={"tp": (4, 8, 16)})
    executor = DecodeExecutor(Deployment(arch="sm_90", tp=4, max_batch=64, max_context=4096), Recorder(SPECIALIZED),
                              Recorder("stock"), widened)
    assert run_step(executor, StepBatch.decode([1])) == SPECIALIZED


def test_the_input_must_match_the_batch():
    executor = recording_executor(H200_TP8)
    with pytest.raises(ValueError, match="the layer input has 4 rows but the batch brings 3 tokens"):
        executor.kda_moe(StepBatch.decode([1, 1, 1]), torch.zeros(4, 8), None, None, None, None, None)


# --- both paths compute the same layer -----------------------------------------------------------------------

TINY_TP8 = layer_dims(named_config("tiny"), tp=8)
# Smaller still for the fp64 loops of the naive ops (same structure; MXFP4 dims multiples of 32).
MINI = replace(
    TINY_TP8,
    kda=KdaDims(hidden=48, heads=2, head_dim=16),
    mla=MlaDims(hidden=48, heads=3, q_lora=24, kv_lora=32, qk_nope=16, qk_rope=8, v_head=16),
    moe=MoeDims(hidden=48, latent=32, experts=8, top_k=3, intermediate=32, shared_intermediate=24),
    attn_res_block=4,
)


def naive_ops() -> DecodeOps:
    """An op set written independently of the reference ops (fp64 loops; MLA computed the prefill way): the
    composition must give the stock layer's result with any correct ops plugged in."""

    def kda_step(x, w, state, d):
        out, new = naive.kda_decode_step(x, w, state, d)
        return out.float(), type(new)(conv=new.conv.float(), recurrent=new.recurrent.float())

    return DecodeOps(
        name="naive",
        kda_step=kda_step,
        mla_decode=mla_decode_unabsorbed,
        latent_moe=lambda x, w, d: naive.latent_moe(x, w, d).float(),
    )


def decisive_routing(w, gen):
    """`w` with a correction-bias ladder spaced wider than the sigmoid scores' range (0..1) over a random expert
    order. A bf16 path and the fp32 reference may legitimately pick different experts when two selection keys lie
    within rounding of each other; fixing the selection makes the comparison measure the arithmetic (routing
    selection itself is tested against the references in tests/kimi_k3_path/reference and kernels)."""
    ladder = torch.randperm(w.moe.router_bias.shape[0], generator=gen).float() * 2.0
    return replace(w, moe=replace(w.moe, router_bias=ladder))


def assert_close(a, b, tol: float) -> None:
    assert rel_err(a, b) < tol, rel_err(a, b)


OPS_AND_DIMS = pytest.mark.parametrize(
    ("ops", "d"), [(naive_ops, MINI), (None, TINY_TP8)], ids=["naive-ops", "reference-ops-tiny-config"]
)


@pytest.mark.parametrize("layer", [1, 4], ids=["mid-block", "block-start"])
@OPS_AND_DIMS
def test_kda_moe_paths_agree(gen, layer, ops, d):
    executor = build_executor(H200_TP8)
    if ops is not None:
        executor.specialized = ComposedPath(ops())
    w = random_kda_moe_layer(d.kda, d.moe, gen)
    batch = StepBatch.decode([7, 1, 30])
    state = random_kda_state(d.kda, batch.num_seqs, gen)
    stream = random_residual_stream(batch.num_seqs, d.kda.hidden, d.max_blocks, gen)
    delta = torch.randn(batch.num_seqs, d.kda.hidden, generator=gen)
    pos = LayerPosition(layer, block_size=d.attn_res_block)
    before = (delta.clone(), stream.prefix.clone(), state.recurrent.clone())

    fast = executor.kda_moe(batch, delta, stream, w, state, pos, d)
    assert executor.summary() == {f"{SPECIALIZED}: decode batch inside the support matrix": 1}
    prefill_like = StepBatch(query_lens=(1, 1, 1), context_lens=(0, 0, 0))  # same rows, routed to stock
    slow = executor.kda_moe(prefill_like, delta, stream, w, state, pos, d)
    assert executor.decisions[executor.decide(prefill_like)] == 1

    out_f, stream_f, state_f = fast
    out_s, stream_s, state_s = slow
    assert_close(out_f, out_s, 1e-5)
    assert_close(stream_f.prefix, stream_s.prefix, 1e-5)
    assert_close(stream_f.blocks, stream_s.blocks, 1e-5)
    assert_close(state_f.recurrent, state_s.recurrent, 1e-5)
    assert_close(state_f.conv, state_s.conv, 1e-5)
    # Both paths are pure: the caller's tensors are untouched.
    assert all(torch.equal(x, y) for x, y in zip(before, (delta, stream.prefix, state.recurrent)))


@OPS_AND_DIMS
def test_mla_moe_paths_agree(gen, ops, d):
    executor = build_executor(Deployment(arch="sm_90", tp=8, max_batch=4, max_context=4096))
    if ops is not None:
        executor.specialized = ComposedPath(ops())
    w = random_mla_moe_layer(d.mla, d.moe, gen)
    seq_lens = [5, 17, 1]
    cache = random_paged_cache(d.mla, seq_lens, page_size=4, gen=gen)
    batch = StepBatch.decode([n - 1 for n in seq_lens[:2]] + [1])
    stream = random_residual_stream(3, d.mla.hidden, d.max_blocks, gen)
    delta = torch.randn(3, d.mla.hidden, generator=gen)
    pos = LayerPosition(3, block_size=d.attn_res_block)

    out_f, stream_f, cache_f = executor.mla_moe(batch, delta, stream, w, cache, pos, d)
    too_big = DecodeExecutor(Deployment(arch="sm_90", tp=8, max_batch=2, max_context=4096), executor.specialized, executor.stock)
    out_s, stream_s, cache_s = too_big.mla_moe(batch, delta, stream, w, cache, pos, d)
    assert list(too_big.summary()) == ["reference: decode batch of 3 exceeds max_batch 2"]
    assert list(executor.summary()) == [f"{SPECIALIZED}: decode batch inside the support matrix"]

    assert_close(out_f, out_s, 1e-5)
    assert_close(stream_f.prefix, stream_s.prefix, 1e-5)
    assert_close(cache_f.pages, cache_s.pages, 1e-6)
    assert not torch.equal(cache_f.pages, cache.pages)  # the decoded rows were written (to a copy)


def test_the_default_paths_name_themselves():
    executor = build_executor(H200_TP8)
    assert executor.specialized.name == f"{SPECIALIZED}[reference]"
    assert isinstance(executor.stock, ReferenceLayers) and executor.stock.name == "reference"


STOCK_LIKE_ON_CPU = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: runs the stock-like kernels on the CPU
import torch
from kimi_k3_path import reference as R
from kimi_k3_path.config import named_config
from benchmarks.kimi_k3.stock_layers import StockLikeLayers
from kimi_k3_path.executor import SPECIALIZED, StepBatch, build_executor
from kimi_k3_path.reference.compare import rel_err
from kimi_k3_path.reference.dims import layer_dims
from kimi_k3_path.support import Deployment

sys.path.insert(0, sys.argv[2])
from test_executor import decisive_routing

gen = torch.Generator().manual_seed(int(sys.argv[1]))

d = layer_dims(named_config("tiny"), tp=8)
executor = build_executor(Deployment(arch="sm_90", tp=8, max_batch=64, max_context=4096), device="cpu", stock=StockLikeLayers("cpu"))
decode = StepBatch.decode([6, 9, 1])
prefill = StepBatch(query_lens=(1, 1, 1), context_lens=(0, 0, 0))  # same rows, routed to the stock path
stream = R.random_residual_stream(3, d.kda.hidden, d.max_blocks, gen)
delta = torch.randn(3, d.kda.hidden, generator=gen)
errors = {}

w = decisive_routing(R.random_kda_moe_layer(d.kda, d.moe, gen), gen)
state = R.random_kda_state(d.kda, 3, gen)
for layer in (1, 4):
    pos = R.LayerPosition(layer, block_size=d.attn_res_block)
    fast = executor.kda_moe(decode, delta, stream, w, state, pos, d)
    slow = executor.kda_moe(prefill, delta, stream, w, state, pos, d)
    errors[f"kda{layer}.out"] = rel_err(slow[0], fast[0])
    errors[f"kda{layer}.prefix"] = rel_err(slow[1].prefix, fast[1].prefix)
    errors[f"kda{layer}.recurrent"] = rel_err(slow[2].recurrent, fast[2].recurrent)

w = decisive_routing(R.random_mla_moe_layer(d.mla, d.moe, gen), gen)
cache = R.random_paged_cache(d.mla, [7, 10, 2], page_size=4, gen=gen)
pos = R.LayerPosition(3, block_size=d.attn_res_block)
fast = executor.mla_moe(decode, delta, stream, w, cache, pos, d)
slow = executor.mla_moe(prefill, delta, stream, w, cache, pos, d)
errors["mla.out"] = rel_err(slow[0], fast[0])
errors["mla.pages"] = rel_err(slow[2].pages, fast[2].pages)

assert executor.summary() == {f"{SPECIALIZED}: decode batch inside the support matrix": 3,
                              "stock-like: prefill batch": 3}, executor.summary()
print(errors)
# bf16 activations and weights on the stock-like side against the fp32 reference ops. Over 25 seeds (2026-12-01) the
# layer-4 KDA output had median 0.010 and a tail to 0.031 (seed 178457753; next 0.020), every other entry < 0.02; a
# wrong op or layout gives O(1).
bad = {k: v for k, v in errors.items() if not 0 < v < 5e-2}  # 0 would mean one path ran twice
assert not bad, bad
print("ok")
"""


def test_the_stock_like_sequence_agrees_with_the_specialized_path_on_cpu():
    """Given the stock-like op sequence as its stock path (cuBLAS-style GEMMs + Triton kernels, bf16), the two
    paths agree; run by Triton's CPU interpreter in a fresh process (chosen before Triton loads)."""
    import subprocess
    import sys

    pytest.importorskip("triton", reason="triton is not installed (it comes with the CUDA build of torch)")
    seed = int(os.environ.get("KIMI_K3_TEST_SEED", secrets.randbits(31)))
    result = subprocess.run(
        [sys.executable, "-c", STOCK_LIKE_ON_CPU, str(seed), os.path.dirname(__file__)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, f"seed {seed}\n{result.stdout}\n{result.stderr[-3000:]}"
    assert result.stdout.strip().endswith("ok")


# --- the kernel op: plumbing on CPU with a stand-in for kimi_k3_path.kernels.moe ---------------------------------


class StandInKernels:
    """kimi_k3_path.kernels.moe's interface (prepare_weights, MoeWorkspace, latent_moe_decode), computed by the
    fp32 reference on the CPU: checks what the adapter hands the kernels and what it does with the result."""

    def __init__(self):
        self.prepared = 0
        self.launches = 0

    def prepare_weights(self, ref, top_k, routed_scaling_factor, eps, device):
        self.prepared += 1
        d = SimpleNamespace(top_k=top_k, routed_scaling_factor=routed_scaling_factor, eps=eps)
        return SimpleNamespace(ref=ref, d=d, device=device)

    def MoeWorkspace(self, kernel_weights, device):  # noqa: N802 (mirrors the class it stands in for)
        return SimpleNamespace(for_weights=kernel_weights)

    def latent_moe_decode(self, x, kernel_weights, workspace, out, stream):
        assert workspace.for_weights is kernel_weights and stream is None
        assert x.dtype == torch.bfloat16 and out.dtype == torch.bfloat16 and x.is_contiguous()
        assert 1 <= x.shape[0] <= 64
        self.launches += 1
        out.copy_(latent_moe(x.float(), kernel_weights.ref, kernel_weights.d))


def test_the_kernel_op_prepares_once_and_returns_fp32(gen):
    d = TINY_TP8
    kernels = StandInKernels()
    op = KernelLatentMoe(device="cpu", kernels=kernels)
    w = decisive_routing(random_kda_moe_layer(d.kda, d.moe, gen), gen).moe
    x = torch.randn(5, d.moe.hidden, generator=gen)
    first, second = op(x, w, d.moe), op(x[:2], w, d.moe)
    assert (kernels.prepared, kernels.launches) == (1, 2)
    assert first.dtype == torch.float32 and first.shape == (5, d.moe.hidden)
    assert_close(first, latent_moe(x, w, d.moe), 2e-2)  # the input crossed in bf16
    # The output crosses in bf16: the same rows batched differently (BLAS may reorder sums) can round one ulp apart.
    assert_close(second, first[:2], 2.0**-8)
    op(x, replace(w, router_bias=w.router_bias.clone()), d.moe)  # other weights: prepared again
    assert kernels.prepared == 2


class StandInKdaKernels:
    """kimi_k3_path.kernels.kda's interface (prepare_attention_weights, kda_attention_decode: state updated in place at
    its slots), computed by the fp32 reference on the CPU."""

    def __init__(self):
        self.prepared = 0
        self.launches = 0

    def prepare_attention_weights(self, ref, d, device):
        self.prepared += 1
        return SimpleNamespace(ref=ref, d=d, device=device)

    def kda_attention_decode(self, x, w, slots, conv_state, state, out, stream, check_slots=True):
        assert x.dtype == torch.bfloat16 and out.dtype == torch.bfloat16 and stream is None
        assert conv_state.dtype == torch.bfloat16 and state.dtype == torch.float32 and slots.dtype == torch.int32
        self.launches += 1
        idx = slots.long()
        o, new = kda_decode_step(x.float(), w.ref, KdaState(conv_state[idx].float(), state[idx]), w.d)
        conv_state[idx] = new.conv.to(torch.bfloat16)
        state[idx] = new.recurrent
        out.copy_(o)


def test_the_kda_kernel_op_is_pure_prepares_once_and_returns_fp32(gen):
    d = TINY_TP8
    kernels = StandInKdaKernels()
    op = KernelKdaStep(device="cpu", kernels=kernels)
    w = random_kda_weights(d.kda, gen)
    state = random_kda_state(d.kda, 3, gen)
    state = KdaState(conv=state.conv.bfloat16().float(), recurrent=state.recurrent)  # the kernels keep it in bf16
    before = KdaState(conv=state.conv.clone(), recurrent=state.recurrent.clone())
    x = torch.randn(3, d.kda.hidden, generator=gen).bfloat16().float()
    out, new = op(x, w, state, d.kda)
    op(x[:1], w, KdaState(state.conv[:1], state.recurrent[:1]), d.kda)
    assert (kernels.prepared, kernels.launches) == (1, 2)
    assert torch.equal(state.conv, before.conv) and torch.equal(state.recurrent, before.recurrent)
    ref_out, ref_new = kda_decode_step(x, w, state, d.kda)
    assert out.dtype == torch.float32 and new.recurrent.dtype == torch.float32
    assert_close(out, ref_out, 2.0**-7)  # the output crosses in bf16
    assert_close(new.recurrent, ref_new.recurrent, 1e-6)
    assert_close(new.conv, ref_new.conv, 2.0**-7)  # stored in bf16


class StandInMlaKernels:
    """kimi_k3_path.kernels.mla's interface (prepare_mla_weights, mla_decode: the decoded rows written into the pages
    at their slots in place), computed by the fp32 reference on the CPU."""

    def __init__(self):
        self.prepared = 0
        self.launches = 0

    def prepare_mla_weights(self, ref, d, device):
        self.prepared += 1
        return SimpleNamespace(ref=ref, d=d, device=device)

    def mla_decode(self, x, w, pages, block_table, seq_lens, slots, out, stream, workspace, check_inputs=True):
        assert x.dtype == torch.bfloat16 and out.dtype == torch.bfloat16 and pages.dtype == torch.bfloat16
        assert block_table.dtype == seq_lens.dtype == torch.int32 and slots.dtype == torch.int64
        assert stream is None and workspace is None and check_inputs
        self.launches += 1
        o, new = mla_decode(x.float(), w.ref, PagedLatentCache(pages.float(), block_table, seq_lens), w.d)
        flat, new_flat = pages.view(-1, pages.shape[2]), new.pages.view(-1, pages.shape[2])
        flat[slots] = new_flat[slots].to(torch.bfloat16)  # the decoded rows only
        out.copy_(o)


def test_the_mla_kernel_op_is_pure_writes_the_rows_at_the_slots_and_returns_fp32(gen):
    d = TINY_TP8
    kernels = StandInMlaKernels()
    op = KernelMlaDecode(device="cpu", kernels=kernels)
    w = random_mla_weights(d.mla, gen)
    cache = random_paged_cache(d.mla, [5, 9, 1], page_size=4, gen=gen, spare_pages=2)
    cache = PagedLatentCache(cache.pages.bfloat16().float(), cache.block_table, cache.seq_lens)  # kept in bf16
    before = cache.pages.clone()
    x = torch.randn(3, d.mla.hidden, generator=gen).bfloat16().float()
    out, new = op(x, w, cache, d.mla)
    op(x[:1], w, PagedLatentCache(cache.pages, cache.block_table[:1], cache.seq_lens[:1]), d.mla)
    assert (kernels.prepared, kernels.launches) == (1, 2)
    assert torch.equal(cache.pages, before)
    ref_out, ref_new = mla_decode(x, w, cache, d.mla)
    assert out.dtype == torch.float32 and new.pages.dtype == torch.float32
    assert new.block_table is cache.block_table and new.seq_lens is cache.seq_lens
    assert_close(out, ref_out, 2.0**-7)  # the output crosses in bf16
    assert_close(new.pages, ref_new.pages, 2.0**-8)  # the new rows stored in bf16, every other row as it was


def test_a_layer_composed_with_the_kernel_ops_agrees_with_the_stock_path(gen):
    d = TINY_TP8
    kernels, kda_kernels, mla_kernels = StandInKernels(), StandInKdaKernels(), StandInMlaKernels()
    executor = DecodeExecutor(H200_TP8, ComposedPath(kernel_ops("cpu", kernels, kda_kernels, mla_kernels)),
                              ReferenceLayers())
    assert executor.specialized.name == f"{SPECIALIZED}[cute]"
    w = decisive_routing(random_kda_moe_layer(d.kda, d.moe, gen), gen)
    batch = StepBatch.decode([3, 8])
    state = random_kda_state(d.kda, 2, gen)
    stream = random_residual_stream(2, d.kda.hidden, d.max_blocks, gen)
    delta = torch.randn(2, d.kda.hidden, generator=gen)
    pos = LayerPosition(2, block_size=d.attn_res_block)
    out, _, _ = executor.kda_moe(batch, delta, stream, w, state, pos, d)
    ref, _, _ = ReferenceLayers().kda_moe(delta, stream, w, state, pos, d)
    assert kernels.launches == 1 and kda_kernels.launches == 1
    assert_close(out, ref, 2e-2)

    w = decisive_routing(random_mla_moe_layer(d.mla, d.moe, gen), gen)
    cache = random_paged_cache(d.mla, [4, 9], page_size=4, gen=gen)
    out, _, new = executor.mla_moe(batch, delta, stream, w, cache, pos, d)
    ref, _, ref_new = ReferenceLayers().mla_moe(delta, stream, w, cache, pos, d)
    assert kernels.launches == 2 and mla_kernels.launches == 1
    assert_close(out, ref, 2e-2)
    assert_close(new.pages, ref_new.pages, 2e-2)


def test_kernels_are_taken_only_where_they_run():
    assert kernels_unavailable("cpu") == "cpu is not a CUDA device"


@pytest.mark.gpu
def test_on_the_h200_the_specialized_path_runs_the_kernels_and_agrees_with_stock(gen):
    """Real TP8 per-rank shapes: KDA attention and the latent MoE on the CuTe DSL kernels, against the stock-like
    sequence (cuBLAS + Triton) on the GPU, for one decode step of 4 sequences."""
    d = layer_dims(named_config("kimi_k3"), tp=8)
    from benchmarks.kimi_k3.stock_layers import StockLikeLayers

    executor = build_executor(H200_TP8, device="cuda", stock=StockLikeLayers("cuda"))
    assert executor.specialized.name == f"{SPECIALIZED}[cute]" and executor.stock.name == "stock-like"
    # The MXFP4 experts are made packed (random_moe_weights): packing 2.5e9 fp32 values on the host is too slow.
    w = decisive_routing(
        KdaMoeLayerWeights(random_layer_norms(d.kda.hidden, gen), random_kda_weights(d.kda, gen),
                           random_moe_weights(d.moe, gen)),
        gen,
    )
    state = random_kda_state(d.kda, 4, gen)
    stream = random_residual_stream(4, d.kda.hidden, d.max_blocks, gen)
    delta = torch.randn(4, d.kda.hidden, generator=gen)
    pos = LayerPosition(5, block_size=d.attn_res_block)
    fast = executor.kda_moe(StepBatch.decode([100, 7, 1, 40]), delta, stream, w, state, pos, d)
    prefill_like = StepBatch(query_lens=(1,) * 4, context_lens=(0,) * 4)  # same rows, routed to the stock path
    slow = executor.kda_moe(prefill_like, delta, stream, w, state, pos, d)
    assert set(executor.summary()) == {f"{SPECIALIZED}: decode batch inside the support matrix",
                                       "stock-like: prefill batch"}
    assert_close(slow[0], fast[0], 3e-2)
    assert_close(slow[2].recurrent, fast[2].recurrent, 3e-2)


@pytest.mark.gpu
def test_on_the_h200_the_mla_layer_runs_the_kernels_and_agrees_with_stock(gen):
    """Real TP8 per-rank shapes: MLA attention (kernels/mla.py) and the latent MoE on the CuTe DSL kernels, against
    the stock-like sequence (cuBLAS + Triton) on the GPU, for one decode step of 4 sequences at page edges."""
    d = layer_dims(named_config("kimi_k3"), tp=8)
    from benchmarks.kimi_k3.stock_layers import StockLikeLayers

    executor = build_executor(H200_TP8, device="cuda", stock=StockLikeLayers("cuda"))
    assert executor.specialized.name == f"{SPECIALIZED}[cute]"
    w = decisive_routing(
        MlaMoeLayerWeights(random_layer_norms(d.mla.hidden, gen), random_mla_weights(d.mla, gen),
                           random_moe_weights(d.moe, gen)),
        gen,
    )
    seq_lens = [101, 8, 1, 65]
    cache = random_paged_cache(d.mla, seq_lens, page_size=64, gen=gen, spare_pages=3)
    stream = random_residual_stream(4, d.mla.hidden, d.max_blocks, gen)
    delta = torch.randn(4, d.mla.hidden, generator=gen)
    pos = LayerPosition(3, block_size=d.attn_res_block)
    fast = executor.mla_moe(StepBatch.decode([n - 1 for n in seq_lens[:2]] + [1, 64]), delta, stream, w, cache, pos, d)
    prefill_like = StepBatch(query_lens=(1,) * 4, context_lens=(0,) * 4)  # same rows, routed to the stock path
    slow = executor.mla_moe(prefill_like, delta, stream, w, cache, pos, d)
    assert set(executor.summary()) == {f"{SPECIALIZED}: decode batch inside the support matrix",
                                       "stock-like: prefill batch"}
    assert_close(slow[0], fast[0], 3e-2)
    assert_close(slow[2].pages, fast[2].pages, 1e-2)
