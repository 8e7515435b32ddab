"""Benchmark of the MLA decode's split-KV attention alone (kimi_k3_path.kernels.mla_attention.mla_attention_decode)
for the issue's target: at contexts 4096 and 32768 (M = 1, 8, 64), within 1.2x of reading its KV cache once.

    python -m benchmarks.kimi_k3.bench_mla --tp 8,16 --batch 1,8,64 --context 4096,32768 --replays 100 --out FILE

Per (tp, M, context), in one process:
- Inputs: bench_ceiling.rotation(cache bytes) random copies (together at least 3x the 50 MiB L2, and at least 3),
  each sequence context + 1 tokens long (this step's row already written), its pages in random order across the
  copy's pool; the rows past seq_len in each last page and the pool's spare page hold NaN (nothing may read them).
  Heads per rank and the softmax scale from reference.dims.layer_dims (TP8: 12 heads, TP16: 6).
- Correctness first: copy 0's output poisoned with NaN, one eager checked launch (check_inputs=True), every output
  row (sequence, head) of up to CHECKED_SEQUENCES sequences within TOLERANCE of reference.mla_attend in fp32; the
  same rows again after the timed graph replays (the unchecked, captured launches). Any failure exits non-zero.
- Candidate: the kernel over the copies in turn, CUDA-graph replays (bench_moe.time_graph), check_inputs=False, one
  workspace per copy (mla_workspace, choose_splits' count); median and p10-p90 spread per launch.
- Floor: the cache bytes (mla_attention_bytes' "cache": M x (context + 1) rows x 1152 B; q, out and metadata are
  left out, < 0.5% here) at runtime.COPY_BANDWIDTH (4.3e12 B/s).
- Baseline: a launch that only reads the same bytes (stream.ReadStream through bench_ceiling.single_launch_rows:
  the same rotation, each layout's reads checked, best of its sweep of grid shapes and loads in flight), measured
  once per byte count: the TPs' rows of one (M, context) share it, as they share the bytes.
Rows: gatekeeper.evidence.PerfEvidence, axes arch/tp/dcp/batch/spec/layer plus `context`, layer "mla_attention";
baseline/candidate then reads as "how close to a pure read", candidate/floor as "how close to the byte floor".
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from benchmarks.kimi_k3 import kernel_bench
from benchmarks.kimi_k3.bench_ceiling import fastest_read, rotation, timing
from benchmarks.kimi_k3.kernel_bench import BenchError

LAYER = "mla_attention"
TARGET = 1.2  # the bound on candidate / (reading the cache once)
TOLERANCE = 1e-2  # per output row, as tests/kimi_k3_path/kernels/test_mla_attention_gpu.py's OUT_TOL (reasons there)
CHECKED_SEQUENCES = 8  # the fp32 oracle reads every row of a checked sequence on the host: bound its cost
SPARE_PAGES = 1  # a NaN page in each pool that no sequence uses
MAX_DEVICE_BYTES = 40e9  # per configuration, of the H200's 139 GiB


# --- shapes and bytes (host only) --------------------------------------------------------------------------------

def mla_dims(tp: int):
    from kimi_k3_path.config import named_config
    from kimi_k3_path.reference.dims import layer_dims

    return layer_dims(named_config("kimi_k3"), tp).mla


def pages_per_sequence(context: int) -> int:
    from kimi_k3_path.kernels.mla_attention import PAGE

    return -(-(context + 1) // PAGE)


def cache_bytes(m: int, context: int) -> int:
    """The cache rows the launch reads: m sequences of context + 1 rows (any head count: every rank reads them all)."""
    from kimi_k3_path.kernels.mla_attention import mla_attention_bytes

    return mla_attention_bytes(m, context + 1, heads=1)["cache"]


def pool_bytes(m: int, context: int) -> int:
    """One copy's page pool: every sequence's pages plus the spare ones."""
    from kimi_k3_path.kernels.mla_attention import PAGE, ROW_BYTES

    return (m * pages_per_sequence(context) + SPARE_PAGES) * PAGE * ROW_BYTES


def peak_device_bytes(m: int, context: int) -> int:
    """About the most a configuration holds at once: its copies (pools, then the yardstick's buffers of the same
    size, never both) plus one more pool-sized transient (bench_ceiling.xor_reduce's halves when checking a read)."""
    return (rotation(cache_bytes(m, context)) + 1) * pool_bytes(m, context)


def checked_sequences(m: int, limit: int = CHECKED_SEQUENCES) -> list[int]:
    """The sequences compared with the oracle: all of them up to `limit`, else `limit` spread from first to last."""
    if m <= limit:
        return list(range(m))
    return sorted({round(i * (m - 1) / (limit - 1)) for i in range(limit)})


# --- arguments ---------------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchmarks.kimi_k3.bench import _int_list

    p = argparse.ArgumentParser(prog="python -m benchmarks.kimi_k3.bench_mla", description=__doc__.split("\n\n")[0])
    kernel_bench.add_arguments(p)
    p.add_argument("--context", type=_int_list, default=(4096, 32768),
                   help="tokens in each sequence's cache before this step (comma list)")
    args = kernel_bench.parse(p, argv)
    for m in args.batch:
        for context in args.context:
            need = peak_device_bytes(m, context)
            if need > MAX_DEVICE_BYTES:
                p.error(f"--batch {m} --context {context} needs about {need / 1e9:.1f} GB of GPU memory "
                        f"({rotation(cache_bytes(m, context))} copies), over the {MAX_DEVICE_BYTES / 1e9:.0f} "
                        "GB this bench allows itself")
    return args


# --- inputs and the correctness check ----------------------------------------------------------------------------

@dataclass
class CacheCopy:
    """One copy of a batch's inputs on the GPU, with its own output and workspace (CUDA-graph safe)."""

    q: Any  # [M, heads, 576] bf16
    pages: Any  # [P, 64, 576] bf16
    table: Any  # [M, W] int32
    seq_lens: Any  # [M] int32
    out: Any  # [M, heads, 512] bf16
    workspace: Any  # MlaWorkspace

    def launch(self, stream, scale: float, check_inputs: bool = False) -> None:
        from kimi_k3_path.kernels.mla_attention import mla_attention_decode

        mla_attention_decode(self.q, self.pages, self.table, self.seq_lens, self.out, stream, scale, self.workspace,
                             check_inputs=check_inputs)

    def poison(self) -> None:
        for t in (self.out, self.workspace.part_o, self.workspace.part_ml):
            t.fill_(float("nan"))


def random_copy(m: int, context: int, heads: int, gen, device: str = "cuda") -> CacheCopy:
    """Random rows, pages in random order across the pool, NaN where no sequence may read (spare page, the rows past
    seq_len in each last page). gen: a generator on `device` (the host only in the CPU tests)."""
    import torch

    from kimi_k3_path.kernels.mla_attention import KV_LORA, PAGE, ROW, choose_splits, mla_workspace

    n, per = context + 1, pages_per_sequence(context)
    total = m * per + SPARE_PAGES
    order = torch.randperm(total, generator=gen, device=device)
    pages = torch.randn(total, PAGE, ROW, generator=gen, device=device, dtype=torch.bfloat16)
    pages[order[m * per:]] = float("nan")
    table = order[: m * per].view(m, per).to(torch.int32)
    pages[table[:, -1].long(), n - (per - 1) * PAGE:] = float("nan")
    return CacheCopy(
        q=torch.randn(m, heads, ROW, generator=gen, device=device, dtype=torch.bfloat16), pages=pages, table=table,
        seq_lens=torch.full((m,), n, dtype=torch.int32, device=device),
        out=torch.full((m, heads, KV_LORA), float("nan"), dtype=torch.bfloat16, device=device),
        workspace=mla_workspace(m, heads, choose_splits(m, n), device))


def reference(c: CacheCopy, rows: list[int], d) -> Any:
    """mla_attend (fp32, on the host) for sequences `rows` of copy c: [len(rows), heads, 512]."""
    import torch

    from kimi_k3_path.reference import PagedLatentCache, mla_attend

    idx = torch.tensor(rows, device=c.table.device)
    used = c.table[idx].long()  # only these sequences' pages travel to the host
    k, per = used.shape
    cache = PagedLatentCache(pages=c.pages[used.flatten()].cpu().float(),
                             block_table=torch.arange(k * per, dtype=torch.int32).view(k, per),
                             seq_lens=c.seq_lens[idx].cpu())
    return mla_attend(c.q[idx].cpu().float(), cache, d.kv_lora, d.scale)


def max_row_error(out, ref, rows: list[int], where: str) -> float:
    """The largest rel err over output rows (sequence rows[j], head h) of out against ref[j, h]; BenchError at the
    first row that is not finite or over TOLERANCE."""
    import torch

    from kimi_k3_path.reference import rel_err

    worst = 0.0
    for j, i in enumerate(rows):
        for h in range(out.shape[1]):
            got = out[i, h].float()
            if not torch.isfinite(got).all():
                raise BenchError(f"{where}: sequence {i}, head {h} holds NaN or Inf (the output was poisoned with NaN: "
                                 "the kernel did not write it, or it read a row it must not)")
            err = rel_err(got, ref[j, h])
            if err > TOLERANCE:
                raise BenchError(f"{where}: sequence {i}, head {h}: rel err {err:.2e} > {TOLERANCE:g} against "
                                 "reference.mla_attend")
            worst = max(worst, err)
    return worst


# --- measurements ------------------------------------------------------------------------------------------------

def measure_kernel(m: int, context: int, d, replays: int, gen) -> dict:
    """Check, then time the kernel over its rotated copies; returns the measurement and what the note states."""
    import torch

    from benchmarks.kimi_k3.bench import measurement_of
    from benchmarks.kimi_k3.bench_moe import time_graph

    copies = [random_copy(m, context, d.heads, gen) for _ in range(rotation(cache_bytes(m, context)))]
    first, rows = copies[0], checked_sequences(m)
    ref = reference(first, rows, d)
    first.poison()
    first.launch(torch.cuda.current_stream(), d.scale, check_inputs=True)
    torch.cuda.synchronize()
    err = max_row_error(first.out.cpu(), ref, rows, "the checked launch")
    first.out.fill_(float("nan"))
    samples = time_graph(lambda st: [c.launch(st, d.scale) for c in copies], replays, len(copies))
    err = max(err, max_row_error(first.out.cpu(), ref, rows, "after the CUDA graph replays"))
    return {"time": measurement_of(samples), "copies": len(copies), "splits": first.workspace.splits,
            "rel_err": err, "checked": len(rows)}


def perf_row(arch: str, tp: int, m: int, context: int, heads: int, kernel: dict, read: dict, seed: int) -> dict:
    """One PerfEvidence row: candidate the kernel, baseline the read-only launch, floor the cache bytes'."""
    from kimi_k3_path.kernels.mla_attention import mla_attention_bytes
    from kimi_k3_path.kernels.runtime import COPY_BANDWIDTH, floor_us
    from kimi_k3_path.support import spec_label

    nbytes = mla_attention_bytes(m, context + 1, heads)
    floor = floor_us(nbytes["cache"])
    other = nbytes["query"] + nbytes["output"] + nbytes["metadata"]
    note = (f"MLA split-KV attention alone, {heads} heads per rank, seq_len {context + 1}; floor = cache bytes "
            f"{nbytes['cache']} (M x (context + 1) rows x 1152 B; q, out and metadata add {other} B, not counted) at "
            f"{COPY_BANDWIDTH:.2g} B/s; candidate/floor {kernel['time']['median'] / floor:.3f}, candidate/baseline "
            f"{kernel['time']['median'] / read['median']:.3f} (target {TARGET}x); {kernel['copies']} rotated copies "
            f"({kernel['copies'] * nbytes['cache'] / 2**20:.0f} MiB of cache); {kernel['splits']} splits per "
            f"sequence; max rel err per output row {kernel['rel_err']:.1e} over {kernel['checked']} of {m} "
            f"sequences (tolerance {TOLERANCE:g}); baseline = read-only ReadStream over the same bytes and copies, "
            f"best of {read['swept']} layouts: {read['layout']}, {read['ctas']} CTAs x {read['in_flight']} 16-byte "
            f"loads in flight; seed {seed}")
    return {
        "axes": {"arch": arch, "tp": tp, "dcp": 1, "batch": m, "spec": spec_label(None, 0), "layer": LAYER,
                 "context": context},
        "metric": "latency", "unit": "us", "candidate": timing(kernel["time"]), "baseline": timing(read),
        "floor": floor, "note": note,
    }


HEADER = (f"{'tp':>3} {'M':>3} {'context':>7} {'copies':>6} {'splits':>6} {'ours us':>9} {'spr%':>5} {'read us':>8} "
          f"{'spr%':>5} {'floor us':>8} {'ours/floor':>10} {'ours/read':>9} {'rel err':>8}")


def print_row(row: dict, kernel: dict) -> None:
    a, cand, base = row["axes"], row["candidate"]["median"], row["baseline"]["median"]
    print(f"{a['tp']:>3} {a['batch']:>3} {a['context']:>7} {kernel['copies']:>6} {kernel['splits']:>6} {cand:>9.1f} "
          f"{row['candidate']['spread_pct']:>5.1f} {base:>8.1f} {row['baseline']['spread_pct']:>5.1f} "
          f"{row['floor']:>8.1f} {cand / row['floor']:>10.3f} {cand / base:>9.3f} {kernel['rel_err']:>8.1e}",
          flush=True)


def measure(args: argparse.Namespace, arch: str, gen) -> list:
    """Every configuration of args, checked then timed: the rows, printed as they come."""
    import torch

    print(HEADER, flush=True)
    reads: dict[int, dict] = {}  # the yardstick depends on the bytes only, which every TP shares
    rows = []
    for tp in args.tp:
        d = mla_dims(tp)
        for m in args.batch:
            for context in args.context:
                kernel = measure_kernel(m, context, d, args.replays, gen)
                torch.cuda.empty_cache()  # the copies are gone: the yardstick's buffers take their place
                nbytes = cache_bytes(m, context)
                if nbytes not in reads:
                    reads[nbytes] = fastest_read(nbytes, args.replays, gen)
                rows.append(perf_row(arch, tp, m, context, d.heads, kernel, reads[nbytes], args.seed))
                print_row(rows[-1], kernel)
    return rows


def main(argv: list[str] | None = None) -> int:
    return kernel_bench.main("bench_mla", parse_args(argv), measure)


if __name__ == "__main__":
    sys.exit(main())
