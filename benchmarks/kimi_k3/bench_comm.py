"""Per-layer tensor-parallel communication of the decode step: the two all-reduces of M x 7168 bf16 a layer ends
its attention and its MoE with, across the GPUs of one node, for each implementation in the same run (issue 40).

One process per GPU (torchrun). On a multi-GPU kind (NVLink multicast stays off: this script sets
NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 before anything initializes, and
refuses other values):

    torchrun --standalone --nproc-per-node 2 -m benchmarks.kimi_k3.bench_comm --out comm_tp2.json   # nvidia-h200-x2
    torchrun --standalone --nproc-per-node 8 -m benchmarks.kimi_k3.bench_comm --out comm_tp8.json   # nvidia-h200-x8

and the same harness on CPU (gloo, world 2, `all_reduce` only; what CI runs):

    torchrun --standalone --nproc-per-node 2 -m benchmarks.kimi_k3.bench_comm --cpu-smoke --batch 1,2 --out FILE

Implementations (`impl` axis):
- `all_reduce`: torch.distributed.all_reduce, NCCL on the GPU (gloo on CPU): the baseline of every row;
- `symm_mem`: PyTorch's symmetric-memory one-shot all-reduce (torch.ops.symm_mem.one_shot_all_reduce), the
  input copied into its symmetric buffer first (as a layer's output would have to be);
- `oneshot`: ours, kimi_k3_path.comm.kernel over a symmetric buffer whose peers' addresses come from PyTorch's
  symmetric-memory rendezvous (CUDA IPC, peer-to-peer), checked bit for bit against oneshot.reference_sum first.

Method: per batch M, one sample is `--layers` consecutive layer communications (2 all-reduces each) per
implementation, the implementations interleaved within a sample so drift hits all alike, every rank starting after
a barrier; a sample's time per layer is the slowest rank's (CUDA events on the GPU, perf_counter on CPU). Rows (rank
0 writes them, as gatekeeper.evidence.PerfEvidence): axes arch, tp_world, batch, layer="comm", impl; the candidate is
the implementation, the baseline the same run's all_reduce. The step with communication (`layer=step`) is not here
yet: it needs the decode step's own overlap, which no code does yet.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
CALLS_PER_LAYER = 2  # after the attention, after the MoE
BASELINE = "all_reduce"


class CommBenchError(RuntimeError):
    """A run that cannot produce trustworthy numbers."""


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=_int_list, default=(1, 2, 4, 8, 16, 32, 64), help="decode batches M")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--samples", type=int, default=50)
    p.add_argument("--layers", type=int, default=20, help="layer communications per sample")
    p.add_argument("--impl", type=lambda s: tuple(s.split(",")), default=None,
                   help="implementations (default: all_reduce,symm_mem,oneshot on the GPU, all_reduce on CPU)")
    p.add_argument("--cpu-smoke", action="store_true", help="gloo on CPU: the harness, not a measurement")
    p.add_argument("--commit", default=None)
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def no_multicast_env() -> None:
    """Multicast (NVLS) off for NCCL, PyTorch's symmetric memory and NVSHMEM, before any of them initializes."""
    for key, value in NO_MULTICAST.items():
        if os.environ.setdefault(key, value) != value:
            raise CommBenchError(f"{key}={os.environ[key]}: NVLink multicast must stay off ({key}={value})")


def partial(rank: int, m: int, hidden: int, device: str):
    """Rank `rank`'s partial sum [M, hidden] bf16 for batch m: reproducible on every rank (the correctness check
    recomputes the world's)."""
    import torch

    gen = torch.Generator().manual_seed(1000 * m + rank)
    return torch.randn(m, hidden, generator=gen).to(torch.bfloat16).to(device)


def check_oneshot(out, world: int, m: int, hidden: int) -> None:
    import numpy as np
    import torch

    from kimi_k3_path.comm.oneshot import reference_sum

    def bits(t):
        return t.cpu().view(torch.int16).numpy().view(np.uint16)

    expected = reference_sum(np.stack([bits(partial(r, m, hidden, "cpu")) for r in range(world)]))
    if not np.array_equal(bits(out), expected):
        raise CommBenchError(f"oneshot at M={m}: the output differs from the rank-order fp32 sum")


def implementations(names: tuple[str, ...], rank: int, world: int, max_m: int, hidden: int, device: str) -> dict:
    """name -> make(x) -> one all-reduce callable of x (in place or into its own output), buffers set up once."""
    import torch
    import torch.distributed as dist

    made: dict[str, Callable] = {}
    for name in names:
        if name == "all_reduce":
            made[name] = lambda x: (lambda: dist.all_reduce(x))
        elif name in ("symm_mem", "oneshot"):
            if device == "cpu":
                raise CommBenchError(f"{name} needs the GPU (peer-to-peer memory)")
            import torch.distributed._symmetric_memory as symm_mem

            group = dist.group.WORLD.group_name
            if name == "symm_mem":
                buf = symm_mem.empty(max_m * hidden, dtype=torch.bfloat16, device=device)
                symm_mem.rendezvous(buf, group)

                def make_symm(x, buf=buf, group=group):
                    view = buf[:x.numel()].view_as(x)

                    def call():
                        view.copy_(x)
                        return torch.ops.symm_mem.one_shot_all_reduce(view, "sum", group)
                    return call
                made[name] = make_symm
            else:
                from kimi_k3_path.comm.kernel import oneshot_all_reduce
                from kimi_k3_path.comm.oneshot import Layout

                layout = Layout(world, max_m, hidden)
                buf = symm_mem.empty(layout.nbytes, dtype=torch.uint8, device=device)
                buf.zero_()
                handle = symm_mem.rendezvous(buf, group)
                ptrs = torch.tensor([list(handle.buffer_ptrs)], dtype=torch.int64, device=device)
                torch.cuda.synchronize()
                dist.barrier()  # every buffer zeroed before any rank's first flag lands in it

                def make_ours(x, layout=layout, ptrs=ptrs):
                    out = torch.empty_like(x)
                    stream = torch.cuda.current_stream()

                    def call():
                        oneshot_all_reduce(layout, ptrs, x.view(1, *x.shape), out.view(1, *x.shape), rank, stream)
                        return out
                    return call
                made[name] = make_ours
        else:
            raise CommBenchError(f"unknown implementation {name!r} (all_reduce, symm_mem, oneshot)")
    return made


def time_samples(calls: dict[str, Callable], samples: int, layers: int, device: str) -> dict[str, list[float]]:
    """Per implementation, `samples` times in microseconds per layer communication on this rank."""
    import torch
    import torch.distributed as dist

    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(samples):
        for name, call in calls.items():
            if device == "cuda":
                torch.cuda.synchronize()
            dist.barrier()
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(layers * CALLS_PER_LAYER):
                    call()
                end.record()
                end.synchronize()
                elapsed_us = start.elapsed_time(end) * 1e3
            else:
                t0 = time.perf_counter()
                for _ in range(layers * CALLS_PER_LAYER):
                    call()
                elapsed_us = (time.perf_counter() - t0) * 1e6
            times[name].append(elapsed_us / layers)
    return times


def slowest_rank(times: dict[str, list[float]], device: str) -> dict[str, list[float]]:
    """Each sample's time on the slowest rank (an all-reduce is done when its last rank is)."""
    import torch
    import torch.distributed as dist

    out = {}
    for name, values in times.items():
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out[name] = t.cpu().tolist()
    return out


def rows_for(arch: str | None, world: int, m: int, times: dict[str, list[float]]) -> list[dict[str, Any]]:
    from benchmarks.kimi_k3.bench import measurement_of

    base = measurement_of(times[BASELINE])
    return [{"axes": {"arch": arch, "tp_world": world, "batch": m, "layer": "comm", "impl": name},
             "candidate": measurement_of(values), "baseline": base, "unit": "us",
             "note": f"{CALLS_PER_LAYER} all-reduces of M x hidden bf16 per layer; baseline: torch all_reduce"}
            for name, values in times.items()]


def run(args: argparse.Namespace) -> Any:
    no_multicast_env()
    import torch
    import torch.distributed as dist

    device = "cpu" if args.cpu_smoke else "cuda"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise CommBenchError("no CUDA GPU here; use --cpu-smoke to exercise the harness on CPU")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="gloo" if device == "cpu" else "nccl")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        names = args.impl or ((BASELINE,) if device == "cpu" else (BASELINE, "symm_mem", "oneshot"))
        if names[0] != BASELINE:
            raise CommBenchError(f"--impl must start with the baseline {BASELINE}")
        made = implementations(names, rank, world, max(args.batch), args.hidden, device)
        rows = []
        for m in args.batch:
            x = partial(rank, m, args.hidden, device)
            calls = {name: make(x.clone()) for name, make in made.items()}
            if "oneshot" in calls:
                check_oneshot(calls["oneshot"](), world, m, args.hidden)
            times = slowest_rank(time_samples(calls, args.samples, args.layers, device), device)
            rows += rows_for(None if device == "cpu" else _arch(), world, m, times)
            if rank == 0:
                done = rows[-len(calls):]
                print(" ".join(f"M={m:<3} {r['axes']['impl']}={r['candidate']['median']:.1f}us" for r in done), flush=True)
        if rank == 0:
            evidence = _evidence(args, device, rows)
            args.out.write_text(evidence.model_dump_json(indent=2))
            return evidence
        return None
    finally:
        dist.destroy_process_group()


def _arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _evidence(args: argparse.Namespace, device: str, rows: list[dict[str, Any]]) -> Any:
    from benchmarks.kimi_k3.bench import current_commit, hardware, software
    from gatekeeper.evidence import PerfEvidence

    command = "torchrun -m benchmarks.kimi_k3.bench_comm " + " ".join(sys.argv[1:])
    return PerfEvidence(commit=current_commit(args.commit), command=command, created=datetime.now(timezone.utc),
                        hardware=hardware(device), software={**software(), **NO_MULTICAST}, rows=tuple(rows))


def main(argv: list[str] | None = None) -> int:
    try:
        run(parse_args(argv))
    except CommBenchError as e:
        print(f"bench_comm: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
