"""v10d experiment: at one token, GEMM2 (direct loads) launched early from GEMM1, its plan reads before the wait.
Same run, CUDA graphs (bench_moe.time_graph), 3 weight sets rotated; runs at the commit that adds it."""
import json, os
import torch
from kimi_k3_path.bench import measurement_of
from kimi_k3_path.kernels.bench_moe import L2_ROTATION_SETS, moe_dims, time_graph
from kimi_k3_path.kernels.experts import experts_gemm1_situ, experts_gemm2_combine
from kimi_k3_path.kernels.finalize import finalize
from kimi_k3_path.kernels.moe import MoeWorkspace, decode_steps, front, prepare_weights, random_weights
from kimi_k3_path.reference import rel_err, stock

gen = torch.Generator(device="cuda").manual_seed(1)
rows = []
for tp in (8, 16):
    d, stock_inter = moe_dims(tp)
    refs = [random_weights(d, "cuda", gen) for _ in range(L2_ROTATION_SETS)]
    ws_ = [prepare_weights(r, d.top_k, d.routed_scaling_factor, d.eps, "cuda") for r in refs]
    spaces = [MoeWorkspace(w, "cuda") for w in ws_]
    pad = stock_inter if stock_inter != d.intermediate else None
    stocks = [stock.GpuMoe.from_reference(r, d, "cuda", pad_intermediate=pad) for r in refs]
    m, k = 1, d.top_k
    xs = [torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16) for _ in refs]
    outs = [torch.empty(m, d.hidden, device="cuda", dtype=torch.bfloat16) for _ in refs]

    def steps(x, w, ws, o, early):
        if early is None:
            return [s.launch for s in decode_steps(x, w, ws, o)]
        return [
            lambda st: front(x, w, ws, m, st),
            lambda st: experts_gemm1_situ(ws.x_lat[:m], w.w13_packed, w.w13_scales, ws.plan, k, ws.a[: m * k],
                                          ws.y_lat[:m], st, early_gemm2=early),
            lambda st: experts_gemm2_combine(ws.a[: m * k], w.w2_packed, w.w2_scales, ws.plan, ws.weights[:m],
                                             ws.y_lat[:m], ws.gemm2_counter, w.latent_norm, ws.normed[:m], w.eps, st,
                                             early=early),
            lambda st: finalize(ws.normed[:m], w.up, ws.a_sh[:m], w.shared2, o, st),
        ]

    for rep in range(2):  # two passes, alternating, so drift shows
        for name, early in (("default", None), ("gemm2 direct early", True)):
            blocks = [steps(x, w, ws, o, early) for x, w, ws, o in zip(xs, ws_, spaces, outs)]

            def run(st, blocks=blocks):
                for b in blocks:
                    for launch in b:
                        launch(st)
            t = measurement_of(time_graph(run, 100, len(refs)))
            err = rel_err(outs[0], stock.latent_moe(xs[0], stocks[0], d).float())
            row = {"tp": tp, "batch": m, "pass": rep, "variant": name, "block_us": t["median"],
                   "spread_pct": t["spread_pct"], "err": err}
            rows.append(row)
            print(json.dumps(row), flush=True)
    del refs, ws_, spaces, stocks
    torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(os.environ["OUT"], "probe_v10d.json"), "w"), indent=1)
