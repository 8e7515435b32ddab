import torch
from kimi_k3_path.config import named_config
from kimi_k3_path.reference import latent_moe, random_moe_weights, rel_err
from kimi_k3_path.reference.dims import layer_dims
from kimi_k3_path.bench import CandidateMoe
cfg = named_config("kimi_k3")
dims = layer_dims(cfg, 8)
gen = torch.Generator(device="cuda").manual_seed(1)
w = random_moe_weights(dims.moe, gen)
cand = CandidateMoe(w, dims.moe, "cuda")
gaps_bad, gaps_all = [], []
for rep in range(12):
    x = torch.randn(32, dims.moe.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    out = cand(x); ref = latent_moe(x.float(), w, dims.moe)
    keys = torch.sigmoid(x.float() @ w.router.float().T) + w.router_bias.float()
    top = keys.sort(dim=1, descending=True).values
    gap = (top[:, 15] - top[:, 16]) / top[:, 15].abs()
    for i in range(32):
        e = rel_err(out[i:i+1], ref[i:i+1])
        gaps_all.append(float(gap[i]))
        if e > 1e-2:
            gaps_bad.append(float(gap[i]))
            print(f"bad token rep={rep} i={i} err={e:.3f} rel gap 16th-17th={float(gap[i]):.3e} key16={float(top[i,15]):.6f}", flush=True)
g = torch.tensor(gaps_all)
print("tokens", len(gaps_all), "bad", len(gaps_bad), "median rel gap", float(g.median()), "min", float(g.min()), "frac gap<1e-5", float((g < 1e-5).float().mean()))
