import torch
from kimi_k3_path.config import named_config
from kimi_k3_path.reference import latent_moe, random_moe_weights, rel_err
from kimi_k3_path.reference.dims import layer_dims
from kimi_k3_path.bench import CandidateMoe
cfg = named_config("kimi_k3")
for tp in (16, 8):
    dims = layer_dims(cfg, tp)
    gen = torch.Generator(device="cuda").manual_seed(1)
    w = random_moe_weights(dims.moe, gen)
    cand = CandidateMoe(w, dims.moe, "cuda")
    for M in (1, 7, 8, 9, 15, 16, 17, 24, 32, 33, 64):
        for rep in range(2):
            x = torch.randn(M, dims.moe.hidden, generator=gen, device="cuda").to(torch.bfloat16)
            out = cand(x); ref = latent_moe(x.float(), w, dims.moe)
            per = [rel_err(out[i:i+1], ref[i:i+1]) for i in range(M)]
            bad = [i for i, e in enumerate(per) if e > 1e-2]
            print(f"tp={tp} M={M} rep={rep} err={rel_err(out, ref):.3e} max_token={max(per):.3e} bad_tokens={bad}", flush=True)
    del cand, w; torch.cuda.empty_cache()
