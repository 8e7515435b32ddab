"""Benchmark of the attentions' GEMVs alone (kimi_k3_path.kernels.dense.dense_decode at kda.projection_shapes and
mla.projection_shapes: KDA's in_proj, o_proj, f_b and MLA's qkv_a, whose o_proj is KDA's shape) against cuBLAS (torch.mm) and a launch that only reads the same weight: issue 35's "each GEMV-class kernel within 1.15x
of a launch that only reads the same bytes".

    python -m benchmarks.kimi_k3.bench_dense --tp 8,16 --batch 1,8,64 --projection kda_in_proj,mla_qkv_a --out FILE

Per (tp, projection, M), in one process:
- Inputs: bench_ceiling.rotation(weight bytes) random copies of (x, W, y) (together at least 3x the 50 MiB L2),
  W scaled by 1/sqrt(K) so that y stays O(1).
- Correctness first: copy 0's y poisoned with NaN, one eager launch, every token's row within TOLERANCE of x @ W^T in
  fp64 of the same bf16 inputs; again after the timed replays (the captured launches). A failure exits non-zero.
- Candidate: dense_decode over the copies in turn, CUDA-graph replays (bench_moe.time_graph); cuBLAS: torch.mm into
  the same y, same copies, same harness, right after (a same-run ratio, stated in the note and printed).
- Floor: weight + x + y bytes (dense.dense_bytes) at runtime.COPY_BANDWIDTH (4.3e12 B/s).
- Baseline: the fastest read-only launch over the weight's bytes (bench_ceiling.fastest_read), once per byte count.
Rows: gatekeeper.evidence.PerfEvidence, axes arch/tp/dcp/batch/spec/layer, layer the projection's name; baseline/candidate
reads as "how close to a pure read" (target 1/1.15), candidate/floor as "how close to the byte floor".
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from benchmarks.kimi_k3 import kernel_bench
from benchmarks.kimi_k3.bench_ceiling import fastest_read, rotation, timing
from benchmarks.kimi_k3.kernel_bench import BenchError

PROJECTIONS = ("kda_in_proj", "kda_o_proj", "kda_f_b", "mla_qkv_a")  # <attention>_<projection>
TARGET = 1.15  # the bound on candidate / (reading the same bytes once)
TOLERANCE = 1e-2  # per token row, as tests/kimi_k3_path/kernels/test_dense_gpu.py's OUT_TOL (reasons there)


def shape(tp: int, projection: str) -> tuple[int, int]:
    """(N, K) of one projection (a PROJECTIONS name) at one rank, as kernels.kda and kernels.mla hold the weight
    (KDA's in_proj padded)."""
    from kimi_k3_path.config import named_config
    from kimi_k3_path.kernels import kda, mla
    from kimi_k3_path.reference.dims import layer_dims

    attention, name = projection.split("_", 1)
    dims = layer_dims(named_config("kimi_k3"), tp)
    shapes = kda.projection_shapes(dims.kda) if attention == "kda" else mla.projection_shapes(dims.mla)
    return shapes[name]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchmarks.kimi_k3.bench import _choice_list

    p = argparse.ArgumentParser(prog="python -m benchmarks.kimi_k3.bench_dense", description=__doc__.split("\n\n")[0])
    kernel_bench.add_arguments(p)
    p.add_argument("--projection", type=_choice_list(PROJECTIONS, "projection(s)"), default=PROJECTIONS,
                   help=f"comma list of {', '.join(PROJECTIONS)}")
    return kernel_bench.parse(p, argv)


@dataclass
class Operands:
    """One copy of a projection's inputs and output on the GPU."""

    x: Any  # [M, K] bf16
    w: Any  # [N, K] bf16
    y: Any  # [M, N] bf16

    def dense(self, stream) -> None:
        from kimi_k3_path.kernels.dense import dense_decode

        dense_decode(self.x, self.w, self.y, stream)

    def cublas(self, stream) -> None:
        import torch

        with torch.cuda.stream(stream):
            torch.mm(self.x, self.w.t(), out=self.y)


def random_operands(m: int, n: int, k: int, gen) -> Operands:
    import torch

    return Operands(x=torch.randn(m, k, generator=gen, device="cuda").bfloat16(),
                    w=(torch.randn(n, k, generator=gen, device="cuda") / k**0.5).bfloat16(),
                    y=torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16))


def max_token_error(y, want, where: str) -> float:
    """The largest rel err over token rows of y against want (x @ W^T in fp64): kernel_bench.max_token_error."""
    return kernel_bench.max_token_error(y, want, where, TOLERANCE, "x @ W^T in fp64")


def measure_projection(m: int, n: int, k: int, replays: int, gen) -> dict:
    """Check dense_decode, then time it and cuBLAS over the same rotated copies."""
    import torch

    from benchmarks.kimi_k3.bench import measurement_of
    from benchmarks.kimi_k3.bench_moe import time_graph

    copies = [random_operands(m, n, k, gen) for _ in range(rotation(n * k * 2))]
    first = copies[0]
    want = first.x.double() @ first.w.double().T
    first.dense(torch.cuda.current_stream())
    torch.cuda.synchronize()
    err = max_token_error(first.y, want, "the checked launch")
    first.y.fill_(float("nan"))
    dense = time_graph(lambda st: [c.dense(st) for c in copies], replays, len(copies))
    err = max(err, max_token_error(first.y, want, "after the CUDA graph replays"))
    cublas = time_graph(lambda st: [c.cublas(st) for c in copies], replays, len(copies))
    return {"dense": measurement_of(dense), "cublas": measurement_of(cublas), "copies": len(copies), "rel_err": err}


def perf_row(arch: str, tp: int, projection: str, m: int, n: int, k: int, got: dict, read: dict, seed: int) -> dict:
    """One PerfEvidence row: candidate dense_decode, baseline the read-only launch, floor the bytes'."""
    from kimi_k3_path.kernels.dense import dense_bytes
    from kimi_k3_path.kernels.runtime import COPY_BANDWIDTH, floor_us
    from kimi_k3_path.support import spec_label

    nbytes = dense_bytes(m, n, k)
    floor = floor_us(sum(nbytes.values()))
    dense, cublas = got["dense"]["median"], got["cublas"]["median"]
    attention, name = projection.split("_", 1)
    note = (f"{attention.upper()} {name} alone, {n} x {k} bf16 at TP{tp}, M={m}: dense_decode {dense:.2f} us, cuBLAS (torch.mm) "
            f"{cublas:.2f} us (spread {got['cublas']['spread_pct']:.1f}%), cuBLAS/dense {cublas / dense:.3f}; floor = "
            f"weight {nbytes['weight']} + x {nbytes['x']} + y {nbytes['y']} B at {COPY_BANDWIDTH:.2g} B/s, "
            f"candidate/floor {dense / floor:.3f}, candidate/baseline {dense / read['median']:.3f} (target {TARGET}x); "
            f"baseline = read-only ReadStream over the weight's bytes, best of {read['swept']} layouts: "
            f"{read['layout']}, {read['ctas']} CTAs x {read['in_flight']} loads in flight; {got['copies']} rotated "
            f"copies; max rel err per token {got['rel_err']:.1e} (tolerance {TOLERANCE:g}); seed {seed}")
    return {
        "axes": {"arch": arch, "tp": tp, "dcp": 1, "batch": m, "spec": spec_label(None, 0), "layer": projection},
        "metric": "latency", "unit": "us", "candidate": timing(got["dense"]), "baseline": timing(read),
        "floor": floor, "note": note,
    }


HEADER = (f"{'tp':>3} {'projection':>10} {'M':>3} {'N x K':>11} {'dense us':>9} {'spr%':>5} {'cuBLAS us':>9} "
          f"{'read us':>8} {'floor us':>8} {'dense/read':>10} {'dense/floor':>11} {'cuBLAS/dense':>12}")


def print_row(row: dict, got: dict, n: int, k: int) -> None:
    a, dense, read = row["axes"], row["candidate"]["median"], row["baseline"]["median"]
    cublas = got["cublas"]["median"]
    print(f"{a['tp']:>3} {a['layer'][4:]:>10} {a['batch']:>3} {f'{n}x{k}':>11} {dense:>9.2f} "
          f"{row['candidate']['spread_pct']:>5.1f} {cublas:>9.2f} {read:>8.2f} {row['floor']:>8.2f} "
          f"{dense / read:>10.3f} {dense / row['floor']:>11.3f} {cublas / dense:>12.3f}", flush=True)


def measure(args: argparse.Namespace, arch: str, gen) -> list:
    """Every configuration of args, checked then timed: the rows, printed as they come."""
    import torch

    print(HEADER, flush=True)
    reads: dict[int, dict] = {}
    rows = []
    for tp in args.tp:
        for projection in args.projection:
            n, k = shape(tp, projection)
            for m in args.batch:
                got = measure_projection(m, n, k, args.replays, gen)
                torch.cuda.empty_cache()
                if n * k * 2 not in reads:
                    reads[n * k * 2] = fastest_read(n * k * 2, args.replays, gen)
                rows.append(perf_row(arch, tp, projection, m, n, k, got, reads[n * k * 2], args.seed))
                print_row(rows[-1], got, n, k)
    return rows


def main(argv: list[str] | None = None) -> int:
    return kernel_bench.main("bench_dense", parse_args(argv), measure)


if __name__ == "__main__":
    sys.exit(main())
