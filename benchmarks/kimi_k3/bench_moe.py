"""Benchmark of the latent-MoE block on the GPU: `latent_moe_decode` against the stock-like block
(benchmarks.kimi_k3.stock.latent_moe) in the same run, CUDA-graph replays, medians with spread, weight sets
rotated beyond L2, byte floors from the measured copy bandwidth, launch counts from the torch profiler.

    python -m benchmarks.kimi_k3.bench_moe --tp 8,16 --batch 1,2,4,8,16,32,64 --out moe_bench.json

Writes `gatekeeper.evidence.PerfEvidence` (one row per TP and batch, axes as the support matrix names them plus
layer=latent_moe) and, with --kernels-out, the per-kernel M=1 timings with their bytes and effective bandwidth.
Each TP runs in a fresh child process by default (`--processes per-tp`), as benchmarks.kimi_k3.bench runs each case: in one
process a TP measured after another ran slower (docs/design/kimi_k3_kernels.md §9).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path

import torch

# The same median and p10-p90 spread, and the same amortization of the graph launch, as the per-layer bench.
from benchmarks.kimi_k3.bench import MIN_STEPS_PER_GRAPH, child_env, measurement_of

L2_ROTATION_SETS = 3  # each weight set is > 100 MB, so three in a row never hit the 50 MB L2
H200_SMS = 132


def time_graph(launch_all, replays: int, per_replay: int, min_steps: int = MIN_STEPS_PER_GRAPH) -> list[float]:
    """Capture launch_all(stream) (per_replay steps: blocks or kernels) in a CUDA graph, repeated until the graph holds
    min_steps steps (the graph launch is then amortized as in benchmarks.kimi_k3.bench); time `replays` replays with
    events; microseconds per step."""
    cycles = -(-min_steps // per_replay)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch_all(side)  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(cycles):
            launch_all(torch.cuda.current_stream())
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / (per_replay * cycles))
    del graph
    return samples


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus written (the ceiling we quote)."""
    n = 1 << 29  # 2 GiB of fp32 each way: far beyond L2
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    # A copy kernel (an elementwise op), not a memcpy node: in a graph torch's copy_ becomes a DMA memcpy that
    # measured only 2.7 TB/s here, below what SM loads and stores reach.
    samples = time_graph(lambda st: torch.mul(src, 1.0, out=dst), 30, 1, min_steps=1)
    return 2 * n * 4 / (statistics.median(samples) * 1e-6)


def moe_dims(tp: int):
    from kimi_k3_path.config import named_config, shard_shapes
    from kimi_k3_path.reference import MoeDims

    cfg = named_config("kimi_k3")
    t, shards = cfg.text_config, shard_shapes(cfg, tp)
    dims = MoeDims(
        hidden=t.hidden_size, latent=t.routed_expert_hidden_size, experts=t.num_experts,
        top_k=t.num_experts_per_token, intermediate=shards.expert_intermediate,
        shared_intermediate=shards.shared_intermediate, routed_scaling_factor=t.routed_scaling_factor,
        eps=t.rms_norm_eps,
    )
    return dims, shards.expert_intermediate_stock


def rotated_weight_sets(d, gen) -> tuple[list, list, list]:
    """L2_ROTATION_SETS fresh weight sets for dims d: the fp32 references, the kernels' prepared weights and a
    workspace for each."""
    from kimi_k3_path.kernels.moe import MoeWorkspace, prepare_weights
    from kimi_k3_path.reference import random_moe_weights

    refs = [random_moe_weights(d, gen) for _ in range(L2_ROTATION_SETS)]
    ours = [prepare_weights(r, d.top_k, d.routed_scaling_factor, d.eps, "cuda") for r in refs]
    return refs, ours, [MoeWorkspace(w, "cuda") for w in ours]


def launch_weight_bytes(step, w, active: int) -> int:
    """Weight bytes one launch of the block reads (kimi_k3_path.kernels.moe.Step), the routed experts' for the
    `active` experts this step's routing chose (the plan's n_active): the bytes of its floor."""
    e, h, lat, i, s = w.experts, w.hidden, w.latent, w.intermediate, w.shared_intermediate
    shared_gate_up = 2 * s * h * 2
    in_front = "shared_gate_up" in step.name if step.kind == "front" else False
    return {
        "front": e * h * 2 + e * 4 + lat * h * 2 + (shared_gate_up if in_front else 0),
        "gemm1": active * (2 * i * lat // 2 + 2 * i * lat // 32),
        "gemm2": active * (lat * i // 2 + lat * i // 32) + lat * 4 + (shared_gate_up if "shared_gate_up" in step.name
                                                                       else 0),
        "finalize": h * lat * 2 + h * s * 2,
    }[step.kind]


def block_weight_bytes(steps, w, ws) -> int:
    return sum(launch_weight_bytes(step, w, int(ws.plan[0][0])) for step in steps)


def profile_once() -> None:
    """One eager pass of the TP8 M=1 block, for `ncu` (registers, occupancy, DRAM)."""
    from kimi_k3_path.kernels.moe import MoeWorkspace, decode_steps, prepare_weights
    from kimi_k3_path.reference import random_moe_weights

    d, _ = moe_dims(8)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ref = random_moe_weights(d, gen)
    w = prepare_weights(ref, d.top_k, d.routed_scaling_factor, d.eps, "cuda")
    ws = MoeWorkspace(w, "cuda")
    x = torch.randn(1, d.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    out = torch.empty(1, d.hidden, device="cuda", dtype=torch.bfloat16)
    st = torch.cuda.current_stream()
    for step in decode_steps(x, w, ws, out):
        step.launch(st)
    torch.cuda.synchronize()


def trace_one_token_block(tp: int, replays: int, seed: int) -> dict:
    """Per-CTA timelines (kernels/trace.py) of the M=1 block in its steady state: a CUDA graph of 12 blocks over the
    rotated weight sets whose last block records; each replay's records summarized, then the median of each figure
    over the replays. Checks the traced block's output against the fp32 reference first."""
    from kimi_k3_path.kernels.moe import decode_steps
    from kimi_k3_path.kernels.trace import CtaTrace, summarize, tracing
    from kimi_k3_path.reference import latent_moe, rel_err

    d, _ = moe_dims(tp)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    refs, ours, spaces = rotated_weight_sets(d, gen)
    xs = [torch.randn(1, d.hidden, generator=gen, device="cuda").to(torch.bfloat16) for _ in refs]
    outs = [torch.full((1, d.hidden), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in refs]
    steps = [decode_steps(x, w, ws, o) for x, w, ws, o in zip(xs, ours, spaces, outs)]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    trace = CtaTrace(block_ctas(d, sms), "cuda")
    cycles = -(-MIN_STEPS_PER_GRAPH // len(steps))

    def launch_all(st):
        for cycle in range(cycles):
            for i, block in enumerate(steps):
                last = cycle == cycles - 1 and i == len(steps) - 1
                with tracing(trace) if last else nullcontext():
                    for step in block:
                        step.launch(st)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch_all(side)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    err = max(rel_err(o, latent_moe(x, r, d)) for o, x, r in zip(outs, xs, refs))
    if err >= 1e-2:
        raise RuntimeError(f"trace_one_token_block: the traced block's output is off by {err:.2e}")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch_all(torch.cuda.current_stream())
    for _ in range(3):
        graph.replay()
    summaries = []
    for _ in range(replays):
        trace.reset()
        graph.replay()
        torch.cuda.synchronize()
        summaries.append(summarize(trace.records(), sms))
    return {"tp": tp, "replays": replays, "rel_err": err, "launches": median_summary(summaries)}


def block_ctas(d, sms: int = H200_SMS) -> dict[str, int]:
    """CTAs of each launch of the one-token block on a GPU with `sms` SMs, for the trace's buffers (kernels/trace.py
    checks each launch's grid against them)."""
    from kimi_k3_path.kernels.finalize_streamed import streamed_ctas
    from kimi_k3_path.kernels.front import FrontKernel
    from kimi_k3_path.kernels.gemm1_held import held_gemm1_ctas
    from kimi_k3_path.kernels.gemm2_one_token import ExpertsGemm2OneToken
    from kimi_k3_path.kernels.gemv import token_tile

    front = FrontKernel(d.experts, d.hidden, d.latent, d.shared_intermediate, d.top_k, d.routed_scaling_factor, 1,
                        token_tile(1, tensor_cores=False), shared=False)
    return {
        "front": front.ctas(),
        "gemm1": held_gemm1_ctas(1, d.top_k, d.experts, d.intermediate),
        "gemm2": ExpertsGemm2OneToken(d.experts, d.latent, d.intermediate, d.top_k, d.shared_intermediate,
                                      d.hidden).ctas(),
        "finalize": streamed_ctas(sms),
    }


def median_summary(summaries: list[dict]) -> dict:
    """The median over replays of every number in kernels/trace.summarize's output (same keys)."""
    def merge(values):
        if isinstance(values[0], dict):
            return {k: merge([v[k] for v in values]) for k in values[0]}
        known = [v for v in values if v is not None]  # sm_mhz is None where no CTA lived a timer tick
        return statistics.median(known) if known else None

    return merge(summaries)


def driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout.split()
        return out[0] if out else "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "0000000"


def tp_argv(args, tp: int) -> list[str]:
    """The arguments that measure only `tp` of `args`, in one process."""
    def csv(values):
        return ",".join(map(str, values))

    return ["--tp", str(tp), "--batch", csv(args.batch), "--replays", str(args.replays), "--seed", str(args.seed),
            "--steps-at", csv(args.steps_at), "--processes", "one"]


def merge_tp_runs(parts: list[tuple[dict, list[dict]]], commit: str, command: str) -> tuple[dict, list[dict]]:
    """One evidence record and one list of kernel rows from the per-TP runs `parts` (in TP order): the rows in order,
    each noting its own process, and each run's measured copy bandwidth (every row's floor uses its own run's)."""
    first = parts[0][0]
    for evidence, _ in parts[1:]:
        if evidence["hardware"] != first["hardware"]:
            raise SystemExit(f"bench_moe: the TP runs report different hardware ({evidence['hardware']} and "
                             f"{first['hardware']}): not one machine")
    bandwidths = ", ".join(f"tp{e['rows'][0]['axes']['tp']} {e['software']['copy_bandwidth_tb_s']}" for e, _ in parts)
    return ({**first, "commit": commit, "command": command,
             "software": {**first["software"], "copy_bandwidth_tb_s": bandwidths},
             "rows": [{**row, "note": row["note"] + "; measured in a process of its own"}
                      for evidence, _ in parts for row in evidence["rows"]]},
            [row for _, kernel_rows in parts for row in kernel_rows])


def run_per_tp(args) -> tuple[dict, list[dict]]:
    """run() with each TP in a fresh child process of this module."""
    env = child_env()
    commit = args.commit or git_commit()
    parts = []
    with tempfile.TemporaryDirectory(prefix="kimi-bench-moe-") as tmp:
        for tp in args.tp:
            out, kernels_out = Path(tmp) / f"tp{tp}.json", Path(tmp) / f"tp{tp}-kernels.json"
            child = [sys.executable, "-m", "benchmarks.kimi_k3.bench_moe", *tp_argv(args, tp),
                     "--commit", commit, "--out", str(out), "--kernels-out", str(kernels_out)]
            rc = subprocess.run(child, env=env).returncode
            if rc != 0 or not out.is_file() or not kernels_out.is_file():
                raise SystemExit(f"bench_moe: the tp={tp} run failed in its own process (exit {rc}; its output is "
                                 "above)")
            parts.append((json.loads(out.read_text()), json.loads(kernels_out.read_text())))
    return merge_tp_runs(parts, commit, "python -m benchmarks.kimi_k3.bench_moe " + " ".join(sys.argv[1:]))


def run(args) -> tuple[dict, list[dict]]:
    from benchmarks.kimi_k3 import stock
    from kimi_k3_path.kernels.moe import decode_steps
    from kimi_k3_path.reference import rel_err

    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    rows, kernel_rows = [], []
    print(f"{'tp':>3} {'M':>3} {'stock us':>9} {'spr%':>5} {'ours us':>8} {'spr%':>5} {'speedup':>7} {'floor us':>8} "
          f"{'ours/floor':>10} {'launches':>9} {'err':>8}", flush=True)
    for tp in args.tp:
        d, stock_inter = moe_dims(tp)
        refs, ours, spaces = rotated_weight_sets(d, gen)
        pad = stock_inter if stock_inter != d.intermediate else None
        stocks = [stock.GpuMoe.from_reference(r, d, "cuda", pad_intermediate=pad) for r in refs]
        for m in args.batch:
            xs = [torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16) for _ in refs]
            outs = [torch.empty(m, d.hidden, device="cuda", dtype=torch.bfloat16) for _ in refs]
            steps = [decode_steps(x, w, ws, o) for x, w, ws, o in zip(xs, ours, spaces, outs)]

            def candidate(st, steps=steps):
                for block in steps:
                    for step in block:
                        step.launch(st)

            def baseline(st, xs=xs, stocks=stocks, d=d):
                for x, g in zip(xs, stocks):
                    stock.latent_moe(x, g, d)

            cand = measurement_of(time_graph(candidate, args.replays, len(refs)))
            base = measurement_of(time_graph(baseline, args.replays, len(refs)))
            err = rel_err(outs[0], stock.latent_moe(xs[0], stocks[0], d).float())
            weight_bytes = block_weight_bytes(steps[0], ours[0], spaces[0])
            floor_us = weight_bytes / bandwidth * 1e6
            launches = stock.count_kernels(lambda: [s.launch(torch.cuda.current_stream()) for s in steps[0]])
            stock_launches = stock.count_kernels(lambda: stock.latent_moe(xs[0], stocks[0], d))
            speedup = base["median"] / cand["median"]
            print(f"{tp:>3} {m:>3} {base['median']:>9.1f} {base['spread_pct']:>5.1f} {cand['median']:>8.1f} "
                  f"{cand['spread_pct']:>5.1f} {speedup:>7.2f} {floor_us:>8.1f} {cand['median'] / floor_us:>10.2f} "
                  f"{launches:>4}/{stock_launches:<4} {err:>8.1e}", flush=True)
            rows.append({
                "axes": {"arch": "sm_90", "tp": tp, "dcp": 1, "batch": m, "spec": "none", "layer": "latent_moe"},
                "metric": "latency", "unit": "us", "candidate": cand, "baseline": base, "floor": floor_us,
                "note": (f"latent MoE block per rank; weight bytes read {weight_bytes} "
                         f"({int(spaces[0].plan[0][0])} active experts); launches {launches} vs stock-like "
                         f"{stock_launches}; rel err vs stock-like {err:.1e}"),
            })
            for i, step in enumerate(steps[0]) if m in args.steps_at else ():
                def one(st, i=i, steps=steps):
                    for block in steps:
                        block[i].launch(st)

                t = measurement_of(time_graph(one, args.replays, len(refs)))
                nbytes = launch_weight_bytes(step, ours[0], int(spaces[0].plan[0][0]))
                kernel_rows.append({
                    "tp": tp, "batch": m, "kernel": step.name, "median_us": t["median"],
                    "spread_pct": t["spread_pct"], "weight_bytes": nbytes,
                    "effective_tb_s": nbytes / (t["median"] * 1e-6) / 1e12,
                    "floor_us": nbytes / bandwidth * 1e6,
                })
                print(f"    {step.name:44} {t['median']:7.1f} us {nbytes / 1e6:7.1f} MB "
                      f"{nbytes / (t['median'] * 1e-6) / 1e12:5.2f} TB/s  floor {nbytes / bandwidth * 1e6:6.1f} us",
                      flush=True)
            del steps, xs, outs
        del refs, ours, spaces, stocks
        torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    import cutlass

    evidence = {
        "schema_version": 1, "kind": "perf_matrix", "commit": args.commit or git_commit(),
        "command": "python -m benchmarks.kimi_k3.bench_moe " + " ".join(sys.argv[1:]),
        "created": datetime.now(timezone.utc).isoformat(),
        "hardware": {"gpu": props.name, "count": 1, "driver": driver_version(), "arch": "sm_90"},
        "software": {"torch": torch.__version__, "nvidia-cutlass-dsl": cutlass.__version__,
                     "copy_bandwidth_tb_s": f"{bandwidth / 1e12:.3f}"},
        "rows": rows,
    }
    return evidence, kernel_rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=lambda s: [int(v) for v in s.split(",")], default=[8, 16])
    p.add_argument("--batch", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--commit", default=None)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--kernels-out", type=Path, default=None)
    p.add_argument("--steps-at", type=lambda s: [int(v) for v in s.split(",")], default=[1],
                   help="batches at which each launch of the block is also timed alone (default: 1)")
    p.add_argument("--processes", choices=("per-tp", "one"), default="per-tp",
                   help="per-tp: each TP in a fresh child process (default); one: every TP in this process")
    p.add_argument("--profile-once", action="store_true", help="one eager pass for ncu, then exit")
    p.add_argument("--trace-out", type=Path, default=None,
                   help="instead of timing: per-CTA timelines of the M=1 block at each --tp (kernels/trace.py), JSON")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_moe: no CUDA GPU here; this benchmark runs on the H200", file=sys.stderr)
        return 2
    if args.profile_once:
        profile_once()
        return 0
    if args.trace_out:
        traces = [trace_one_token_block(tp, args.replays, args.seed) for tp in args.tp]
        record = {"commit": args.commit or git_commit(), "device": torch.cuda.get_device_name(), "traces": traces}
        args.trace_out.write_text(json.dumps(record, indent=1) + "\n")
        for t in traces:
            for name, launch in t["launches"].items():
                print(f"TP{t['tp']:<2} {name:9} ctas {launch['ctas']:5}  start {launch['start_us']}  end "
                      f"{launch['end_us']}  life {launch['cta_life_us']} us  SM clock {launch['sm_mhz']} MHz  "
                      f"max/SM {launch['max_resident_per_sm']}")
        return 0
    if args.out is None:
        p.error("--out is required unless --profile-once")
    evidence, kernel_rows = run_per_tp(args) if args.processes == "per-tp" and len(args.tp) > 1 else run(args)
    from gatekeeper.evidence import PerfEvidence

    PerfEvidence.model_validate(evidence)  # what the gatekeeper will read
    args.out.write_text(json.dumps(evidence, indent=1) + "\n")
    if args.kernels_out:
        args.kernels_out.write_text(json.dumps(kernel_rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
