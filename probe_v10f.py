"""v10f experiment: the router's top-k shared by its last tail_ctas CTAs (1 = the single last CTA, as before).
Same run, CUDA graphs (bench_moe.time_graph), 3 weight sets rotated; runs at the commit that adds it."""
import json, os
import torch
from kimi_k3_path.bench import measurement_of
from kimi_k3_path.kernels.bench_moe import L2_ROTATION_SETS, moe_dims, time_graph
from kimi_k3_path.kernels.experts import experts_gemm1_situ, experts_gemm2_combine
from kimi_k3_path.kernels.finalize import finalize
from kimi_k3_path.kernels.moe import MoeWorkspace, front, prepare_weights, random_weights
from kimi_k3_path.reference import rel_err, stock

gen = torch.Generator(device="cuda").manual_seed(3)
rows = []
for tp in (8, 16):
    d, stock_inter = moe_dims(tp)
    refs = [random_weights(d, "cuda", gen) for _ in range(L2_ROTATION_SETS)]
    ws_ = [prepare_weights(r, d.top_k, d.routed_scaling_factor, d.eps, "cuda") for r in refs]
    spaces = [MoeWorkspace(w, "cuda") for w in ws_]
    pad = stock_inter if stock_inter != d.intermediate else None
    stocks = [stock.GpuMoe.from_reference(r, d, "cuda", pad_intermediate=pad) for r in refs]
    k = d.top_k
    for m in (1, 16, 32, 64):
        xs = [torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16) for _ in refs]
        outs = [torch.empty(m, d.hidden, device="cuda", dtype=torch.bfloat16) for _ in refs]

        def steps(x, w, ws, o, tail, m=m):
            return [
                lambda st: front(x, w, ws, m, st, router_tail_ctas=tail),
                lambda st: experts_gemm1_situ(ws.x_lat[:m], w.w13_packed, w.w13_scales, ws.plan, k, ws.a[: m * k],
                                              ws.y_lat[:m], st),
                lambda st: experts_gemm2_combine(ws.a[: m * k], w.w2_packed, w.w2_scales, ws.plan, ws.weights[:m],
                                                 ws.y_lat[:m], ws.gemm2_counter, w.latent_norm, ws.normed[:m], w.eps,
                                                 st),
                lambda st: finalize(ws.normed[:m], w.up, ws.a_sh[:m], w.shared2, o, st),
            ]

        for rep in range(2):
            for tail in (1, 4, 8):
                blocks = [steps(x, w, ws, o, tail) for x, w, ws, o in zip(xs, ws_, spaces, outs)]

                def run(st, blocks=blocks):
                    for b in blocks:
                        for launch in b:
                            launch(st)

                def front_only(st, blocks=blocks):
                    for b in blocks:
                        b[0](st)
                t = measurement_of(time_graph(run, 100, len(refs)))
                err = rel_err(outs[0], stock.latent_moe(xs[0], stocks[0], d).float())
                f = measurement_of(time_graph(front_only, 100, len(refs)))
                row = {"tp": tp, "batch": m, "pass": rep, "router_tail_ctas": tail, "block_us": t["median"],
                       "spread_pct": t["spread_pct"], "front_alone_us": f["median"], "err": err,
                       "sync_zero": not spaces[0].router_sync.any().item()}
                rows.append(row)
                print(json.dumps(row), flush=True)
    del refs, ws_, spaces, stocks
    torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(os.environ["OUT"], "probe_v10f.json"), "w"), indent=1)
