"""The bench harness on CPU: argument checks, the statistics, the byte floor, and one --cpu-smoke run end to end
(tiny config, the stock-like Triton kernels in Triton's CPU interpreter) whose JSON must load as PerfEvidence."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the bench needs the [kernels] extra")
pytest.importorskip("triton", reason="the bench needs Triton (installed with torch on Linux)")

from gatekeeper.evidence import PerfEvidence  # noqa: E402
from benchmarks.kimi_k3 import bench, floors  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


def _validate_against_the_contract(out: Path) -> None:
    """The bench's output against the committed JSON Schema itself, not through the gatekeeper's model."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema comes with the [dev] extra")
    schema = json.loads((REPO / "schemas" / "perf_evidence.v1.json").read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    validator.validate(json.loads(out.read_text()))


def test_measurement_median_spread_runs():
    m = bench.measurement_of([10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0, 19.0, 20.0])
    assert m["median"] == 15.0 and m["runs"] == 11
    assert m["spread_pct"] == pytest.approx((19.0 - 11.0) / 15.0 * 100)
    with pytest.raises(bench.BenchError):
        bench.measurement_of([])


def test_a_sample_is_the_mean_of_one_pass_over_the_copies():
    # Copies that do different work (2 vs 6 us) must not widen the spread: each sample covers both.
    samples = bench.per_cycle([2.0, 6.0, 2.2, 6.2, 1.8, 5.8, 2.0], copies=2)
    assert samples == pytest.approx([4.0, 4.2, 3.8])  # the incomplete last pass is dropped
    assert bench.measurement_of(samples)["spread_pct"] < 10
    assert bench.per_cycle([5.0], copies=2) == [5.0]  # fewer replays than copies: one sample
    assert bench.per_cycle([], copies=2) == []


def test_expert_bytes_counts_mxfp4_payload_and_scales():
    # TP8: w13 768x3584 and w2 3584x384 at 4 bits, plus one byte per 32 elements.
    elements = 768 * 3584 + 3584 * 384
    assert floors.expert_bytes(3584, 384) == elements // 2 + elements // 32


@pytest.mark.parametrize("argv,message", [
    (["--layer", "attention"], "unknown layer"),
    (["--tp", "8,x"], "comma-separated integers"),
    (["--batch", "0"], "positive integers"),
])
def test_bad_arguments_are_rejected_with_a_reason(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_the_breakdown_is_eager_unless_asked_for_a_graph_replay():
    assert bench.parse_args([]).breakdown is None
    assert bench.parse_args(["--breakdown"]).breakdown == "eager"
    assert bench.parse_args(["--breakdown", "graph"]).breakdown == "graph"
    with pytest.raises(SystemExit):
        bench.parse_args(["--breakdown", "replay"])


def test_cpu_smoke_limits_itself_to_tiny_work():
    args = bench.parse_args(["--cpu-smoke", "--batch", "1,2,64"])
    assert (args.config, args.batch, args.candidate) == ("tiny", (1, 2), "stock")
    assert args.replays <= 3


def test_each_case_gets_its_own_process_on_the_gpu_and_not_in_the_cpu_smoke_run():
    assert bench.parse_args([]).processes == "per-case"
    assert bench.parse_args(["--cpu-smoke"]).processes == "one"
    assert bench.parse_args(["--cpu-smoke", "--processes", "per-case"]).processes == "per-case"


@pytest.mark.parametrize("argv", [
    ["--batch", "1,4", "--context", "100", "--page", "16", "--replays", "7", "--candidate", "stock", "--seed", "3",
     "--breakdown", "--config", "tiny"],
    ["--breakdown", "graph", "--batch", "64"],
    ["--cpu-smoke", "--batch", "2,64", "--replays", "9"],
])
def test_a_case_command_line_measures_that_case_with_every_other_setting_kept(argv):
    args = bench.parse_args(["--layer", "kda_moe,mla_moe", "--tp", "8,16", *argv])
    case = bench.parse_args(bench.case_argv(args, "mla_moe", 16, "0123abc"))
    assert (case.layer, case.tp, case.commit, case.processes) == (("mla_moe",), (16,), "0123abc", "one")
    kept = {"layer", "tp", "commit", "processes", "out"}
    assert {k: v for k, v in vars(case).items() if k not in kept} == \
        {k: v for k, v in vars(args).items() if k not in kept}


@pytest.mark.slow
def test_cases_in_their_own_processes_merge_into_one_perf_evidence(tmp_path):
    out = tmp_path / "cases.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.kimi_k3.bench", "--cpu-smoke", "--processes", "per-case", "--layer", "moe",
         "--tp", "8,16", "--batch", "1", "--replays", "1", "--commit", "0123abc", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("baseline us") == 2  # each child printed its own table
    _validate_against_the_contract(out)
    evidence = PerfEvidence.model_validate_json(out.read_text())
    assert [(row.axes["layer"], row.axes["tp"], row.axes["context"]) for row in evidence.rows] == [
        ("moe", 8, 24), ("moe", 16, 24)]
    assert all(row.note.endswith("; measured in a process of its own") for row in evidence.rows)
    assert evidence.commit == "0123abc"
    assert evidence.command.startswith("python -m benchmarks.kimi_k3.bench --cpu-smoke --processes per-case")


def test_a_case_that_fails_in_its_process_is_a_clear_error(monkeypatch):
    # run(), not main(): main() switches this process to Triton's interpreter for --cpu-smoke, which later tests'
    # compiled Triton kernels must not inherit.
    monkeypatch.setattr(bench.sys, "executable", "/bin/false")  # every child process exits 1 and writes nothing
    written = []
    args = bench.parse_args(["--cpu-smoke", "--processes", "per-case", "--layer", "moe", "--tp", "8,16", "--batch", "1",
                             "--commit", "0123abc"])
    with pytest.raises(bench.BenchError, match=r"the moe tp=8 case failed in its own process \(exit 1"):
        bench.run(args, written.append)
    assert written == []


@pytest.mark.slow
def test_cpu_smoke_writes_valid_perf_evidence(tmp_path):
    out = tmp_path / "smoke.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.kimi_k3.bench", "--cpu-smoke", "--layer", "kda_moe", "--tp", "16", "--batch", "1",
         "--replays", "1", "--commit", "0123abc", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "kda_moe" in proc.stdout and "wrote 1 rows" in proc.stdout
    _validate_against_the_contract(out)
    evidence = PerfEvidence.model_validate_json(out.read_text())
    (row,) = evidence.rows
    # --cpu-smoke caps the context at 24 cached tokens; every row says the context it was measured at.
    assert row.axes == {"arch": "cpu", "tp": 16, "dcp": 1, "batch": 1, "spec": "none", "layer": "kda_moe",
                        "context": 24}
    assert row.baseline is not None and row.baseline.runs == 1 and row.candidate.runs == 1
    assert row.floor is not None and row.floor > 0
    # the note states the floor's terms (issue 35): they add up to the floor's bytes, whose time at 4.3 TB/s it is
    total, terms = re.search(r"floor = (\d+) B \((.*?)\) / 4\.3e12 B/s", row.note).groups()
    parts = dict((name, int(n)) for n, name in ((m.group(2), m.group(1)) for m in
                                               re.finditer(r"([A-Za-z][A-Za-z +]*?) (\d+)(?: \(\d+ active\))?(?: \+ |$)",
                                                           terms)))
    assert set(parts) == {"dense weights", "routed experts", "KDA state read + written", "AttnRes streams",
                          "MLP input and output"} and all(parts.values())
    assert sum(parts.values()) == int(total) and row.floor == pytest.approx(int(total) / 4.3e12 * 1e6)
    assert "stock-like" in row.note and evidence.commit == "0123abc"
    assert evidence.command.startswith("python -m benchmarks.kimi_k3.bench --cpu-smoke")


def test_missing_gpu_is_a_clear_error(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert bench.main(["--layer", "moe", "--tp", "8", "--batch", "1"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_the_correctness_gate_compares_the_candidate_moe_with_the_fp32_reference():
    import torch

    from kimi_k3_path.reference import latent_moe, random_moe_weights
    from kimi_k3_path.reference.dims import layer_dims

    b = bench.Bench(bench.parse_args(["--cpu-smoke"]), "cpu")
    dims = layer_dims(b.config, 8)
    gen = b.generator(7)
    ref_moe = random_moe_weights(dims.moe, gen)
    item = {"x": torch.randn(3, dims.moe.hidden, generator=gen)}

    def candidate(scale: float):
        return lambda h: (latent_moe(h.float(), ref_moe, dims.moe) * scale).to(torch.bfloat16)

    exact = {"candidate_moe": candidate(1.0), "ref_moe": ref_moe}
    assert b.check("moe", dims, None, exact, item, 8, 3) < 1e-2
    off = {"candidate_moe": candidate(1.03), "ref_moe": ref_moe}
    with pytest.raises(bench.BenchError, match="from the fp32 reference"):
        b.check("moe", dims, None, off, item, 8, 3)
    assert b.check("moe", dims, None, {"candidate_moe": None}, item, 8, 3) is None


def test_the_mla_check_judges_the_output_and_the_rows_written():
    """mla_error on CPU with stand-ins for the candidate (x, stock latent cache) -> out: the fp32 reference op writing
    its rows passes; one that leaves the cache unwritten, or returns another output, fails loudly."""
    import torch

    from kimi_k3_path.reference import MlaDims, PagedLatentCache, mla_decode, random_mla_weights, random_paged_cache

    d = MlaDims(hidden=64, heads=2, q_lora=32, kv_lora=32, qk_nope=16, qk_rope=8, v_head=16)
    dims = type("Dims", (), {"mla": d})
    gen = torch.Generator().manual_seed(8)
    w = random_mla_weights(d, gen)
    cache = random_paged_cache(d, [3, 9], page_size=4, gen=gen, spare_pages=2)
    x = torch.randn(2, d.hidden, generator=gen).bfloat16()

    def candidate(write: bool = True, scale: float = 1.0):
        def run(h, gpu_cache):
            o, new = mla_decode(h.float(), w, PagedLatentCache(gpu_cache.pages.float(), gpu_cache.block_table,
                                                               gpu_cache.seq_lens), d)
            if write:
                flat = gpu_cache.pages.view(-1, d.cache_row)
                flat[gpu_cache.slots] = new.pages.view(-1, d.cache_row)[gpu_cache.slots].bfloat16()
            return (o * scale).bfloat16()
        return run

    assert bench.mla_error(candidate(), w, x, cache, dims, "cpu", "here") < 1e-2
    with pytest.raises(bench.BenchError, match="here: the candidate MLA attention is .* from the fp32 reference"):
        bench.mla_error(candidate(write=False), w, x, cache, dims, "cpu", "here")
    with pytest.raises(bench.BenchError, match="bar 2e-2"):
        bench.mla_error(candidate(scale=1.1), w, x, cache, dims, "cpu", "here")


def test_the_attn_res_check_judges_both_sites_and_the_stream():
    """attn_res_error on CPU with stand-ins for the mix (stock.attn_res's arguments): the fp32 reference's mix on
    the bf16 stream passes, at a block-writing layer and a mixing one; one that forgets to fold the input into the
    prefix, or returns another output, fails loudly."""
    import torch

    from benchmarks.kimi_k3 import stock
    from kimi_k3_path.reference.attn_res import AttnResWeights, attn_res_mix
    from kimi_k3_path.reference.layers import LayerPosition, random_layer_norms, random_residual_stream

    hidden, gen = 64, torch.Generator().manual_seed(9)
    ref_norms = random_layer_norms(hidden, gen)
    norms = stock.GpuNorms.from_reference(ref_norms, "cpu")
    ref_stream = random_residual_stream(3, hidden, 8, gen)
    x = torch.randn(3, hidden, generator=gen).bfloat16()

    def mix(fold: bool = True, scale: float = 1.0):
        def run(prefix, delta, blocks, num_blocks, write_block, res_norm, res_proj, out_norm, eps, out_eps):
            if delta is not None and fold:
                prefix.copy_((prefix.float() + delta.float()).bfloat16())
            if write_block >= 0:
                blocks[:, write_block] = prefix
            w = AttnResWeights(res_norm.float(), res_proj.float(), out_norm.float())
            return (attn_res_mix(blocks[:, :num_blocks].float(), prefix.float(), w, eps, out_eps) * scale).bfloat16()
        return run

    for layer in (90, 12):
        pos = LayerPosition(layer)
        assert bench.attn_res_error(mix(), norms, ref_norms, x, ref_stream, pos, "cpu", "here") < 1e-2
    with pytest.raises(bench.BenchError, match="here: the candidate AttnRes is .* from the fp32 reference"):
        bench.attn_res_error(mix(fold=False), norms, ref_norms, x, ref_stream, LayerPosition(90), "cpu", "here")
    with pytest.raises(bench.BenchError, match="bar 2e-2"):
        bench.attn_res_error(mix(scale=1.1), norms, ref_norms, x, ref_stream, LayerPosition(90), "cpu", "here")


def test_kernel_ops_pick_the_candidate_families_and_reach_the_per_case_processes():
    args = bench.parse_args(["--kernel-ops", "moe,attn_res", "--cpu-smoke"])
    assert args.kernel_ops == ("moe", "attn_res")
    assert "--kernel-ops" in (argv := bench.case_argv(args, "kda_moe", 8, "abc1234"))
    assert argv[argv.index("--kernel-ops") + 1] == "moe,attn_res"
    assert bench.parse_args(["--cpu-smoke"]).kernel_ops == tuple(bench.KERNEL_OPS)
    with pytest.raises(SystemExit):
        bench.parse_args(["--kernel-ops", "moe,flash"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--kernel-ops", ","])
