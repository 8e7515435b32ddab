"""Benchmark of one Block AttnRes site alone (kimi_k3_path.kernels.attn_res.attn_res_decode): its thread block cluster
form (the one the layers run, attn_res.CLUSTER CTAs per token) against one CTA per token, in the same run. AttnRes
reads the replicated hidden stream, so its work does not depend on the TP: each row carries the first --tp.

    python -m benchmarks.kimi_k3.bench_attn_res --batch 1,16,64 --blocks 8 --out FILE

Per M, in one process:
- Inputs: bench_ceiling.rotation(a launch's bytes) random copies of the site (prefix, the previous sublayer's output,
  the completed blocks, the three weight vectors, the output), so each launch reads its stream from DRAM as a site
  deep in the step does (the blocks and the prefix were written a layer of weight traffic ago). The site adds the
  input to the prefix (the common case) and mixes --blocks completed blocks and the prefix (8: layer 90).
- Correctness first, for each form: copy 0's output poisoned with NaN, one eager launch, the output per token within
  TOLERANCE of kimi_k3_path.reference.attn_res.attn_res_mix in fp32 on the CPU and the prefix bit for bit; again
  after the timed replays (the captured launches). A failure exits non-zero.
- Timing: each form over the copies in turn, CUDA-graph replays (bench_moe.time_graph), one after the other.
- Floor: attn_res.attn_res_bytes at runtime.COPY_BANDWIDTH (4.3e12 B/s): ~0.03 us a token, so what the launch costs
  is its latency chain, which the one-CTA form is the yardstick for.
Rows: gatekeeper.evidence.PerfEvidence, layer "attn_res", candidate the cluster form, baseline one CTA per token.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from benchmarks.kimi_k3 import kernel_bench
from benchmarks.kimi_k3.bench_ceiling import rotation, timing
from benchmarks.kimi_k3.kernel_bench import BenchError

HIDDEN = 7168  # Kimi K3's hidden size: the stream's row
EPS = 1e-5
TOLERANCE = 1e-2  # per token, as tests/kimi_k3_path/kernels/test_attn_res_gpu.py's OUT_TOL (reasons there)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from kimi_k3_path.reference import MAX_SOURCES

    p = argparse.ArgumentParser(prog="python -m benchmarks.kimi_k3.bench_attn_res",
                                description=__doc__.split("\n\n")[0])
    kernel_bench.add_arguments(p)
    p.add_argument("--blocks", type=int, default=8, help="completed blocks mixed with the prefix (0..8 in Kimi K3)")
    args = kernel_bench.parse(p, argv)
    if not 0 <= args.blocks < MAX_SOURCES:
        p.error(f"--blocks {args.blocks}: 0..{MAX_SOURCES - 1} completed blocks (the prefix is the last source)")
    return args


@dataclass
class Site:
    """One copy of an AttnRes site's tensors on the GPU."""

    prefix: Any  # [M, H] bf16, updated in place (prefix += delta)
    delta: Any  # [M, H] bf16
    blocks: Any  # [M, B, H] bf16
    res_norm: Any  # [H] bf16
    res_proj: Any
    out_norm: Any
    out: Any  # [M, H] bf16

    def launch(self, stream, cluster: int | None) -> None:
        from kimi_k3_path.kernels.attn_res import attn_res_decode

        attn_res_decode(self.prefix, self.delta, self.blocks, self.blocks.shape[1], -1, self.res_norm, self.res_proj,
                        self.out_norm, self.out, EPS, EPS, stream, cluster=cluster)


def random_site(m: int, blocks: int, gen) -> Site:
    import torch

    def randn(*shape: int, scale: float = 1.0):
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).bfloat16()

    return Site(prefix=randn(m, HIDDEN), delta=randn(m, HIDDEN, scale=0.1), blocks=randn(m, blocks, HIDDEN),
                res_norm=randn(HIDDEN, scale=0.1) + 1, res_proj=randn(HIDDEN, scale=HIDDEN ** -0.5),
                out_norm=randn(HIDDEN, scale=0.1) + 1,
                out=torch.full((m, HIDDEN), float("nan"), device="cuda", dtype=torch.bfloat16))


def expected(site: Site) -> tuple[Any, Any]:
    """(out fp32, new prefix bf16) as the fp32 reference computes them from the site's current bf16 tensors (CPU)."""
    from kimi_k3_path.reference.attn_res import AttnResWeights, attn_res_mix

    prefix = (site.prefix.cpu().float() + site.delta.cpu().float()).bfloat16()
    w = AttnResWeights(res_norm=site.res_norm.cpu().float(), res_proj=site.res_proj.cpu().float(),
                       out_norm=site.out_norm.cpu().float())
    return attn_res_mix(site.blocks.cpu().float(), prefix.float(), w, EPS, EPS), prefix


def check(site: Site, cluster: int | None, where: str) -> float:
    """One eager launch of copy `site` (output poisoned first) against the reference (compare)."""
    import torch

    want, want_prefix = expected(site)
    site.out.fill_(float("nan"))
    site.launch(torch.cuda.current_stream(), cluster)
    torch.cuda.synchronize()
    return compare(site.out.cpu(), want, site.prefix.cpu(), want_prefix, where)


def compare(out, want, prefix, want_prefix, where: str) -> float:
    """The largest rel err over tokens of out against want; BenchError at a non-finite or too distant token, or a
    prefix that is not want_prefix bit for bit."""
    import torch

    if not torch.equal(prefix, want_prefix):
        raise BenchError(f"{where}: the prefix is not prefix + input rounded to bf16")
    return kernel_bench.max_token_error(out, want, where, TOLERANCE, "the fp32 reference")


def measure_batch(m: int, blocks: int, replays: int, gen) -> dict:
    """Check both forms on copy 0, time each over the rotated copies, check again after the replays."""
    from benchmarks.kimi_k3.bench import measurement_of
    from benchmarks.kimi_k3.bench_moe import time_graph
    from kimi_k3_path.kernels.attn_res import CLUSTER, Prefix, attn_res_bytes

    nbytes = attn_res_bytes(m, HIDDEN, blocks, Prefix.ADD, False)
    copies = [random_site(m, blocks, gen) for _ in range(rotation(sum(nbytes.values())))]
    got: dict = {"copies": len(copies), "bytes": nbytes, "cluster_ctas": CLUSTER, "rel_err": 0.0}
    for form, cluster in (("cluster", CLUSTER), ("one_cta", 1)):
        err = check(copies[0], cluster, f"{form} form, the checked launch")
        samples = time_graph(lambda st, c=cluster: [s.launch(st, c) for s in copies], replays, len(copies))
        err = max(err, check(copies[0], cluster, f"{form} form, after the CUDA graph replays"))
        got[form], got["rel_err"] = measurement_of(samples), max(got["rel_err"], err)
    return got


def perf_row(arch: str, tp: int, m: int, blocks: int, got: dict, seed: int) -> dict:
    """One PerfEvidence row: candidate the cluster form, baseline one CTA per token."""
    from kimi_k3_path.kernels.runtime import COPY_BANDWIDTH, floor_us
    from kimi_k3_path.support import spec_label

    nbytes = got["bytes"]
    floor = floor_us(sum(nbytes.values()))
    cluster, one = got["cluster"]["median"], got["one_cta"]["median"]
    note = (f"Block AttnRes site alone, M={m}, {blocks} completed blocks + the prefix (prefix += input), hidden "
            f"{HIDDEN}: clusters of {got['cluster_ctas']} CTAs per token {cluster:.2f} us, one CTA per token {one:.2f} "
            f"us (one/cluster {one / cluster:.3f}); floor = {sum(nbytes.values())} B "
            f"({', '.join(f'{k} {v}' for k, v in nbytes.items())}) at {COPY_BANDWIDTH:.2g} B/s; TP-independent (the "
            f"replicated stream); {got['copies']} rotated copies; max rel err per token {got['rel_err']:.1e} "
            f"(tolerance {TOLERANCE:g}), prefix bit for bit; seed {seed}")
    return {
        "axes": {"arch": arch, "tp": tp, "dcp": 1, "batch": m, "spec": spec_label(None, 0), "layer": "attn_res"},
        "metric": "latency", "unit": "us", "candidate": timing(got["cluster"]), "baseline": timing(got["one_cta"]),
        "floor": floor, "note": note,
    }


HEADER = (f"{'M':>3} {'blocks':>6} {'cluster us':>10} {'spr%':>5} {'one CTA us':>10} {'spr%':>5} {'floor us':>8} "
          f"{'one/cluster':>11}")


def print_row(row: dict, blocks: int) -> None:
    c, b = row["candidate"], row["baseline"]
    print(f"{row['axes']['batch']:>3} {blocks:>6} {c['median']:>10.2f} {c['spread_pct']:>5.1f} {b['median']:>10.2f} "
          f"{b['spread_pct']:>5.1f} {row['floor']:>8.3f} {b['median'] / c['median']:>11.3f}", flush=True)


def measure(args: argparse.Namespace, arch: str, gen) -> list:
    """Every batch of args, checked then timed: the rows, printed as they come."""
    import torch

    print(HEADER, flush=True)
    rows = []
    for m in args.batch:
        got = measure_batch(m, args.blocks, args.replays, gen)
        torch.cuda.empty_cache()
        rows.append(perf_row(arch, args.tp[0], m, args.blocks, got, args.seed))
        print_row(rows[-1], args.blocks)
    return rows


def main(argv: list[str] | None = None) -> int:
    return kernel_bench.main("bench_attn_res", parse_args(argv), measure)


if __name__ == "__main__":
    sys.exit(main())
