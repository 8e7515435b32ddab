"""One-token GEMV benchmark on the GPU: the streaming kernel (stream.py) against the register-fed kernels the block
uses at M=1 (gemv.SkinnyGemm, finalize.Finalize), same run, each checked against an fp32 reference first.

    python -m kimi_k3_path.kernels.bench_gemv --replays 200 --out gemv_m1.json

Shapes (TP8 rank; the down-projection and router shapes do not depend on TP): the routed down-projection
[3584, 7168], the finalize [7168, 3584 + 768] (up-projection and shared experts' down-projection in one pass), the
router logits [896, 7168] and the shared gate_up [1536, 7168] as plain GEMVs. Weights rotate over 3 sets (each
set > 50 MB for the large shapes, so consecutive launches never hit L2), CUDA graphs of 12 launches
(bench.MIN_STEPS_PER_GRAPH), medians and p10-p90 spread; effective bandwidth = weight bytes / median. Also the cost per kernel of graphs of 1, 3
and 30 tiny kernels between events: the fixed overhead bench.py's one-block-per-graph samples carry.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from kimi_k3_path.bench import measurement_of
from kimi_k3_path.kernels.bench_moe import copy_bandwidth, time_graph

SETS = 3
SHAPES = {  # name: (N, K0, K1)
    "down_proj": (3584, 7168, 0),
    "finalize_tp8": (7168, 3584, 768),
    "finalize_tp16": (7168, 3584, 384),
    "router_logits": (896, 7168, 0),
    "shared_gate_up_tp8": (1536, 7168, 0),
}
STREAM_VARIANTS = {  # name: (CTAs per SM, rows per stage, ring bytes per CTA)
    "stream 1/SM 1 row 160K": (1, 1, 160 * 1024),
    "stream 1/SM 2 rows 112K": (1, 2, 112 * 1024),
    "stream 1/SM 2 rows 168K": (1, 2, 168 * 1024),
    "stream 1/SM 4 rows 168K": (1, 4, 168 * 1024),
    "stream 2/SM 2 rows 84K": (2, 2, 84 * 1024),
}


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).norm() / want.norm())


def run(args) -> dict:
    from kimi_k3_path.kernels.finalize import finalize
    from kimi_k3_path.kernels.gemv import skinny_gemm
    from kimi_k3_path.kernels.stream import stages_for, stream_gemv

    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    tiny = torch.zeros(1, device="cuda")
    rows = []
    for launches in (1, 3, 30):
        def tiny_kernels(st, launches=launches):
            for _ in range(launches):
                tiny.add_(1.0)

        t = measurement_of(time_graph(tiny_kernels, args.replays, launches, min_steps=launches))
        print(f"graph of {launches:2} tiny kernels between events: {t['median']:.2f} us per kernel", flush=True)
        rows.append({"kernel": f"tiny kernel, {launches} per graph", "median_us": t["median"],
                     "spread_pct": t["spread_pct"]})

    def rand(*shape):
        return (torch.randn(*shape, generator=gen, device="cuda") / shape[-1] ** 0.5).to(torch.bfloat16)

    for shape, (n, k0, k1) in SHAPES.items():
        w0s = [rand(n, k0) for _ in range(SETS)]
        w1s = [rand(n, k1) for _ in range(SETS)] if k1 else [None] * SETS
        x0s = [torch.randn(1, k0, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(SETS)]
        x1s = [torch.randn(1, k1, generator=gen, device="cuda").to(torch.bfloat16) if k1 else None
               for _ in range(SETS)]
        outs = [torch.empty(1, n, device="cuda", dtype=torch.bfloat16) for _ in range(SETS)]
        want = x0s[0].float() @ w0s[0].float().T + (x1s[0].float() @ w1s[0].float().T if k1 else 0)
        nbytes = (k0 + k1) * n * 2

        def baseline(st):
            for x0, w0, x1, w1, o in zip(x0s, w0s, x1s, w1s, outs):
                if k1:
                    finalize(x0, w0, x1, w1, o, st)
                else:
                    skinny_gemm(x0, w0, o, st)

        variants = {"register-fed (the block's kernel at v8)": baseline}
        for name, (per_sm, rows_per_stage, ring) in STREAM_VARIANTS.items():
            def streamed(st, per_sm=per_sm, r=rows_per_stage, stages=stages_for(rows_per_stage * (k0 + k1) * 2, ring)):
                for x0, w0, x1, w1, o in zip(x0s, w0s, x1s, w1s, outs):
                    stream_gemv(x0, w0, o, st, x1, w1, ctas_per_sm=per_sm, rows=r, stages=stages)
            variants[name] = streamed

        for name, launch in variants.items():
            outs[0].fill_(float("nan"))
            launch(torch.cuda.current_stream())
            torch.cuda.synchronize()
            err = rel_err(outs[0], want)
            if not err < 1e-2:
                raise SystemExit(f"bench_gemv: {shape} {name}: relative error {err:.2e} against fp32 (limit 1e-2)")
            t = measurement_of(time_graph(launch, args.replays, SETS))
            tbs = nbytes / (t["median"] * 1e-6) / 1e12
            print(f"{shape:20} {name:36} {t['median']:7.2f} us (spread {t['spread_pct']:4.1f}%) "
                  f"{nbytes / 1e6:6.1f} MB {tbs:5.2f} TB/s floor {nbytes / bandwidth * 1e6:6.2f} us err {err:.1e}",
                  flush=True)
            rows.append({"shape": shape, "n": n, "k0": k0, "k1": k1, "kernel": name, "median_us": t["median"],
                         "spread_pct": t["spread_pct"], "weight_bytes": nbytes, "effective_tb_s": tbs,
                         "floor_us": nbytes / bandwidth * 1e6, "rel_err": err})
        del w0s, w1s, x0s, x1s, outs
        torch.cuda.empty_cache()
    return {"command": "python -m kimi_k3_path.kernels.bench_gemv " + " ".join(sys.argv[1:]),
            "gpu": torch.cuda.get_device_name(0), "copy_bandwidth_tb_s": bandwidth / 1e12, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replays", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gemv: no CUDA GPU here; this benchmark runs on the H200", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(run(args), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
