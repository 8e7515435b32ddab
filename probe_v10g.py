"""v10g: where the 334bdd4 matrix's M=4 rows lost time against a1412f5 (TP8 moe 134.2 -> 142.2 us). Same run, CUDA
graphs, 3 weight sets rotated: GEMM2 early or not, the norm shared by 64 CTAs or done by the last one."""
import json, os
import torch
from kimi_k3_path.bench import measurement_of
from kimi_k3_path.kernels.bench_moe import L2_ROTATION_SETS, moe_dims, time_graph
from kimi_k3_path.kernels.experts import experts_gemm1_situ, experts_gemm2_combine
from kimi_k3_path.kernels.finalize import finalize
from kimi_k3_path.kernels.moe import MoeWorkspace, front, prepare_weights, random_weights

gen = torch.Generator(device="cuda").manual_seed(4)
rows = []
for tp in (8, 16):
    d, _ = moe_dims(tp)
    refs = [random_weights(d, "cuda", gen) for _ in range(L2_ROTATION_SETS)]
    ws_ = [prepare_weights(r, d.top_k, d.routed_scaling_factor, d.eps, "cuda") for r in refs]
    spaces = [MoeWorkspace(w, "cuda") for w in ws_]
    k = d.top_k
    for m in (2, 4, 8):
        xs = [torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16) for _ in refs]
        outs = [torch.empty(m, d.hidden, device="cuda", dtype=torch.bfloat16) for _ in refs]

        def steps(x, w, ws, o, early, tail, m=m):
            return [
                lambda st: front(x, w, ws, m, st),
                lambda st: experts_gemm1_situ(ws.x_lat[:m], w.w13_packed, w.w13_scales, ws.plan, k, ws.a[: m * k],
                                              ws.y_lat[:m], st, early_gemm2=early),
                lambda st: experts_gemm2_combine(ws.a[: m * k], w.w2_packed, w.w2_scales, ws.plan, ws.weights[:m],
                                                 ws.y_lat[:m], ws.gemm2_counter, w.latent_norm, ws.normed[:m], w.eps,
                                                 st, tail_ctas=tail, early=early),
                lambda st: finalize(ws.normed[:m], w.up, ws.a_sh[:m], w.shared2, o, st),
            ]

        for rep in range(2):
            for early, tail in ((True, 64), (False, 64), (True, 1), (False, 1)):
                blocks = [steps(x, w, ws, o, early, tail) for x, w, ws, o in zip(xs, ws_, spaces, outs)]

                def run(st, blocks=blocks):
                    for b in blocks:
                        for launch in b:
                            launch(st)
                t = measurement_of(time_graph(run, 100, len(refs)))
                alone = []
                for i in range(4):
                    def one(st, blocks=blocks, i=i):
                        for b in blocks:
                            b[i](st)
                    alone.append(round(measurement_of(time_graph(one, 50, len(refs)))["median"], 1))
                row = {"tp": tp, "batch": m, "pass": rep, "early": early, "norm_tail_ctas": tail,
                       "block_us": t["median"], "spread_pct": t["spread_pct"], "alone_us": alone,
                       "active": int(spaces[0].plan[0][0])}
                rows.append(row)
                print(json.dumps(row), flush=True)
    del refs, ws_, spaces
    torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(os.environ["OUT"], "probe_v10g.json"), "w"), indent=1)
