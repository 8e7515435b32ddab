"""v10 experiment (not kept in the repo): GEMM1 staged with 2 blocks of rows per CTA, and GEMM2 launched early, at
small batches. Same run, CUDA graphs (bench_moe.time_graph), 3 weight sets rotated."""
import json, os, statistics, sys
import torch
from kimi_k3_path.bench import measurement_of
from kimi_k3_path.kernels.bench_moe import L2_ROTATION_SETS, moe_dims, time_graph
from kimi_k3_path.kernels.experts import experts_gemm1_situ, experts_gemm2_combine
from kimi_k3_path.kernels.finalize import finalize
from kimi_k3_path.kernels.moe import MoeWorkspace, decode_steps, front, prepare_weights, random_weights
from kimi_k3_path.reference import rel_err, stock

out = os.environ["OUT"]
gen = torch.Generator(device="cuda").manual_seed(0)
rows = []
VARIANTS = {  # name: (gemm1 kwargs, gemm2 kwargs)
    "default": None,
    "g1 staged b1, g2 early": (dict(staged=True, blocks=1, early_gemm2=True), dict(early=True)),
    "g1 staged b2, g2 early": (dict(staged=True, blocks=2, early_gemm2=True), dict(early=True)),
    "g1 staged b2, g2 default": (dict(staged=True, blocks=2, early_gemm2=False), dict(early=False)),
    "g1 staged b4, g2 early": (dict(staged=True, blocks=4, early_gemm2=True), dict(early=True)),
}
for tp in (8, 16):
    d, stock_inter = moe_dims(tp)
    refs = [random_weights(d, "cuda", gen) for _ in range(L2_ROTATION_SETS)]
    ws_ = [prepare_weights(r, d.top_k, d.routed_scaling_factor, d.eps, "cuda") for r in refs]
    spaces = [MoeWorkspace(w, "cuda") for w in ws_]
    pad = stock_inter if stock_inter != d.intermediate else None
    stocks = [stock.GpuMoe.from_reference(r, d, "cuda", pad_intermediate=pad) for r in refs]
    for m in (1, 2, 8):
        xs = [torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16) for _ in refs]
        outs = [torch.empty(m, d.hidden, device="cuda", dtype=torch.bfloat16) for _ in refs]
        k = d.top_k
        def block_steps(x, w, ws, o, v):
            if v is None:
                return [s.launch for s in decode_steps(x, w, ws, o)]
            g1, g2 = v
            return [
                lambda st: front(x, w, ws, m, st),
                lambda st: experts_gemm1_situ(ws.x_lat[:m], w.w13_packed, w.w13_scales, ws.plan, k, ws.a[: m * k],
                                              ws.y_lat[:m], st, **g1),
                lambda st: experts_gemm2_combine(ws.a[: m * k], w.w2_packed, w.w2_scales, ws.plan, ws.weights[:m],
                                                 ws.y_lat[:m], ws.gemm2_counter, w.latent_norm, ws.normed[:m], w.eps,
                                                 st, **g2),
                lambda st: finalize(ws.normed[:m], w.up, ws.a_sh[:m], w.shared2, o, st),
            ]
        for name, v in VARIANTS.items():
            blocks = [block_steps(x, w, ws, o, v) for x, w, ws, o in zip(xs, ws_, spaces, outs)]
            def run(st, blocks=blocks):
                for b in blocks:
                    for launch in b:
                        launch(st)
            t = measurement_of(time_graph(run, 100, len(refs)))
            err = rel_err(outs[0], stock.latent_moe(xs[0], stocks[0], d).float())
            row = {"tp": tp, "batch": m, "variant": name, "block_us": t["median"], "spread_pct": t["spread_pct"], "err": err}
            if m == 1:  # GEMM1 alone (the plan of the last block run)
                def g1(st, blocks=blocks):
                    for b in blocks:
                        b[1](st)
                row["gemm1_alone_us"] = measurement_of(time_graph(g1, 100, len(refs)))["median"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    del refs, ws_, spaces, stocks
    torch.cuda.empty_cache()
json.dump(rows, open(f"{out}/probe_v10.json", "w"), indent=1)
