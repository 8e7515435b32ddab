"""Per-layer decode benchmark of one TP rank: the stock-like path against the specialized path, with the byte
floor, written as `gatekeeper.evidence.PerfEvidence` (the perf-matrix evidence the gatekeeper checks).

    python -m benchmarks.kimi_k3.bench --layer kda_moe,mla_moe --tp 8,16 --batch 1,2,4,8,16,32,64 --out FILE
    python -m benchmarks.kimi_k3.bench --cpu-smoke --out FILE      # the same harness on CPU, tiny dims (CI)

Method (GPU): per (layer, tp) one set of random weights per copy, per batch fresh random inputs and state per
copy; each variant captured in one CUDA graph that cycles through its copies until it holds MIN_STEPS_PER_GRAPH
layer steps, so consecutive steps touch disjoint weights and inputs and the L2 (about 60 MB on the H200) never
serves a step from the previous one, and the graph launch (~9 us between events, more than a small layer) is spread
over the steps as a decode step's graph spreads it over its layers. Replays alternate variants and are timed with
CUDA events; a sample is one replay's time per step, and rows report the samples' median, p10-p90 spread and count.
Before timing, the candidate's MoE, AttnRes, KDA attention and MLA attention are checked against the fp32 reference.
Each (layer, tp) runs in a fresh child process (`--processes per-case`, the GPU default), as a server maps its weights
once in a fresh process: in one process, a case run after another layer's measured slower in both variants, and
running the stock-like kda_moe case once was enough to slow the next, not the memory it mapped
(docs/design/kimi_k3_kernels.md §9).

Variants: `baseline` is `benchmarks.kimi_k3.stock` (vLLM's stock op sequence on Hopper). `candidate` is the
specialized path: the same stock-like layer with its latent MoE replaced by
`kimi_k3_path.kernels.moe.latent_moe_decode`, its KDA attention by `kimi_k3_path.kernels.kda.kda_attention_decode`,
its MLA attention by `kimi_k3_path.kernels.mla.mla_decode` and its two AttnRes sites by
`kimi_k3_path.kernels.attn_res.attn_res_decode` (`--candidate kernels`; `--kernel-ops` picks a subset of these op
families, e.g. for an A/B of one of them), or the stock ops themselves (`--candidate stock`: an A/A measurement).
`auto` takes the kernels when they import.

Byte floor (floors.py): the bytes one step must move (every weight it reads once, only the experts the batch routes
to and at their unpadded size, the KDA state read and written, the MLA cache rows read, the residual stream) over
4.3e12 B/s, the device-to-device copy bandwidth measured on the H200. Each row's note states those terms.

`--layer step` measures a whole decode step of one rank instead of one layer: the model's first layers (by default its
first AttnRes block) in one CUDA graph per batch, stock-like against the same step with the CuTe DSL kernels in every
layer (step.py).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.kimi_k3 import step as step_stack
from benchmarks.kimi_k3.floors import LayerBytes, layer_bytes
from kimi_k3_path.kernels.runtime import floor_us

LAYERS = ("kda_moe", "mla_moe", "moe", "step")
L2_BYTES_DEFAULT = 60 * 2**20
MAX_COPIES = 8
MIN_STEPS_PER_GRAPH = 12  # layer steps per CUDA graph (see time_variants)
MIN_SAMPLES = 20
# A layer position with the most AttnRes sources (8 completed blocks + prefix) for each attention kind.
KDA_LAYER, MLA_LAYER = 90, 91
TINY_KDA_LAYER, TINY_MLA_LAYER = 5, 7  # the tiny config: 8 layers, blocks of 4; MLA at 1-based 4 and 8


class BenchError(RuntimeError):
    """A benchmark that cannot produce trustworthy numbers (bad arguments, failed correctness check)."""


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _choice_list(allowed: Iterable[str], what: str) -> Callable[[str], tuple[str, ...]]:
    """An argparse type: a non-empty comma list of `allowed` names."""
    allowed = tuple(allowed)

    def parse(text: str) -> tuple[str, ...]:
        values = tuple(v.strip() for v in text.split(",") if v.strip())
        bad = [v for v in values if v not in allowed]
        if not values or bad:
            raise argparse.ArgumentTypeError(f"unknown {what} {bad or text!r}; choose from {', '.join(allowed)}")
        return values

    return parse


_layer_list = _choice_list(LAYERS, "layer kind(s)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kimi_k3.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--layer", type=_layer_list, default=("kda_moe", "mla_moe"),
                   help="kda_moe, mla_moe, moe (the MoE block alone), step (a stack of layers, step.py) (comma list)")
    p.add_argument("--step-layers", type=int,
                   help="--layer step: the first N layers of the model (default: its first AttnRes block)")
    p.add_argument("--tp", type=_int_list, default=(8, 16))
    p.add_argument("--batch", type=_int_list, default=(1, 2, 4, 8, 16, 32, 64))
    p.add_argument("--out", type=Path, help="write the PerfEvidence JSON here")
    p.add_argument("--config", default="kimi_k3", help="a shipped config name (kimi_k3, tiny) or a config.json path")
    p.add_argument("--context", type=int, default=4096, help="MLA: tokens already in each sequence's cache")
    p.add_argument("--page", type=int, default=64, help="MLA: latent cache page size (tokens)")
    p.add_argument("--replays", type=int, default=300,
                   help="layer steps timed per variant (in samples of >= MIN_STEPS_PER_GRAPH steps; CPU: one step each)")
    p.add_argument("--candidate", choices=("auto", "kernels", "stock"), default="auto")
    p.add_argument("--kernel-ops", type=_ops_list, default=tuple(KERNEL_OPS),
                   help=f"with kernels: the op families the candidate runs on them (comma list of {', '.join(KERNEL_OPS)}; "
                        "default all), the rest on the stock-like ops")
    p.add_argument("--commit", help="the commit measured (default: git rev-parse HEAD)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--breakdown", nargs="?", const="eager", choices=("eager", "graph"),
                   help="print the baseline's and the candidate's launches per case: each one's share of the step, own "
                        "time and the gap before it (torch profiler; benchmarks/kimi_k3/timeline.py). eager (the "
                        "default): one call, the host between launches; graph: one replay of the step captured in a "
                        "CUDA graph, the launches overlapping as when timed")
    p.add_argument("--cpu-smoke", action="store_true", help="run the harness on CPU with the tiny config (CI)")
    p.add_argument("--processes", choices=("per-case", "one"),
                   help="per-case: each (layer, tp) in a fresh child process (default on the GPU); one: every case in "
                        "this process (default with --cpu-smoke)")
    args = p.parse_args(argv)
    if args.processes is None:
        args.processes = "one" if args.cpu_smoke else "per-case"
    if args.cpu_smoke:
        args.config, args.replays = "tiny", min(args.replays, 3)
        args.context, args.page = min(args.context, 24), min(args.page, 8)
        args.batch = tuple(b for b in args.batch if b <= 4) or (1,)
        args.candidate = "stock"
    if args.replays < 1 or args.context < 1 or args.page < 1:
        p.error("--replays, --context and --page must be positive")
    if args.step_layers is not None and args.step_layers < 1:
        p.error("--step-layers must be positive")
    return args


# ----------------------------------------------------------------------------------------------------------------
# Timing


def measurement_of(samples_us: list[float]) -> dict[str, float | int]:
    """Median, (p90 - p10) / median in percent, and the count, as gatekeeper.evidence.Measurement wants them."""
    if not samples_us:
        raise BenchError("no timing samples")
    ordered = sorted(samples_us)

    def pct(q: float) -> float:
        pos = q * (len(ordered) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    median = statistics.median(ordered)
    return {"median": median, "spread_pct": (pct(0.9) - pct(0.1)) / median * 100.0, "runs": len(ordered)}


def time_variants(variants: dict[str, list[Callable[[], Any]]], replays: int, device: str,
                  steps_per_graph: int = MIN_STEPS_PER_GRAPH) -> dict[str, list[float]]:
    """Per variant, timings in microseconds per step (`replays` steps in all on the GPU, in samples that each
    average `steps_per_graph` or more); each variant has one callable per copy."""
    import torch

    if device == "cpu":
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for r in range(replays):
            for name, fns in variants.items():
                start = time.perf_counter()
                fns[r % len(fns)]()
                samples[name].append((time.perf_counter() - start) * 1e6)
        return {name: per_cycle(times, len(variants[name])) for name, times in samples.items()}

    # One graph per variant: its copies in order, the cycle repeated until the graph holds `steps_per_graph` (for a
    # layer, MIN_STEPS_PER_GRAPH) steps. Consecutive steps still touch different copies (a cycle moves >= 4x the L2), and the ~9 us a graph launch
    # costs between two events (bench_gemv: one tiny kernel per graph 9.2 us, 30 per graph 1.2 us each) is spread
    # over the steps as a decode step's graph spreads it over all its layers. A sample is one replay / its steps.
    graphs: dict[str, torch.cuda.CUDAGraph] = {}
    steps: dict[str, int] = {}
    side = torch.cuda.Stream()
    for name, fns in variants.items():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up compiles the Triton kernels and creates cuBLAS handles
            for fn in fns:
                fn()
                fn()
        torch.cuda.current_stream().wait_stream(side)
        cycles = math.ceil(steps_per_graph / len(fns))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(cycles):
                for fn in fns:
                    fn()
        graphs[name], steps[name] = graph, cycles * len(fns)
    for graph in graphs.values():  # one untimed replay of every graph
        graph.replay()
    samples = max(MIN_SAMPLES, replays // min(steps.values()))  # about `replays` layer steps per variant
    events = {name: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(samples)] for name in graphs}
    for r in range(samples):
        for name, graph in graphs.items():
            start, end = events[name][r]
            start.record()
            graph.replay()
            end.record()
    torch.cuda.synchronize()
    return {name: [s.elapsed_time(e) * 1e3 / steps[name] for s, e in evs] for name, evs in events.items()}


def per_cycle(replay_us: list[float], copies: int) -> list[float]:
    """One sample per pass over the copies (their mean): the copies route differently and so do different work, and a
    sample that always covers all of them keeps that difference out of the spread, which then measures noise only."""
    cycles = [statistics.fmean(replay_us[i : i + copies]) for i in range(0, len(replay_us) - copies + 1, copies)]
    return cycles or ([statistics.fmean(replay_us)] if replay_us else [])  # fewer replays than copies: one sample


# ----------------------------------------------------------------------------------------------------------------
# Workloads


@dataclass
class Case:
    layer: str
    tp: int
    batch: int
    baseline: list[Callable[[], Any]]
    candidate: list[Callable[[], Any]]
    floor_bytes: int
    note: str
    steps_per_graph: int = MIN_STEPS_PER_GRAPH  # a whole decode step is one graph, as in a server


class CandidateMoe:
    """The specialized latent MoE plugged into the candidate layers: the kernel engineer's `latent_moe_decode`."""

    def __init__(self, ref_weights: Any, dims: Any, device: str):
        import torch

        from kimi_k3_path.kernels import moe as kernels_moe

        self._kernels = kernels_moe
        self.weights = kernels_moe.prepare_weights(ref_weights, dims.top_k, dims.routed_scaling_factor, dims.eps, device)
        self.workspace = kernels_moe.MoeWorkspace(self.weights, device)
        self._torch = torch

    def __call__(self, x: Any) -> Any:
        out = self._torch.empty_like(x)
        self._kernels.latent_moe_decode(x, self.weights, self.workspace, out, self._torch.cuda.current_stream())
        return out


class CandidateKda:
    """The specialized KDA attention plugged into the candidate layers: `kimi_k3_path.kernels.kda.kda_attention_decode`
    on the stock layer's state copy, whose [M, ...] layout is the kernels' state pool with slot i for sequence i."""

    def __init__(self, ref_weights: Any, dims: Any, device: str):
        import torch

        from kimi_k3_path.kernels import kda as kernels_kda

        self._kernels = kernels_kda
        self.weights = kernels_kda.prepare_attention_weights(ref_weights, dims, device)
        self.slots = torch.arange(64, device=device, dtype=torch.int32)  # allocated once: graph-safe
        self._torch = torch

    def __call__(self, x: Any, state: Any) -> Any:
        out = self._torch.empty_like(x)
        self._kernels.kda_attention_decode(x, self.weights, self.slots[: x.shape[0]], state.conv, state.recurrent, out,
                                           self._torch.cuda.current_stream(), check_slots=False)
        return out


class CandidateMla:
    """The specialized MLA attention plugged into the candidate layers: `kimi_k3_path.kernels.mla.mla_decode` on the
    stock layer's latent cache copy (`stock.GpuLatentCache`: pages, block table, lengths, slots), unchecked (no host
    synchronization: graph-safe), with partials of its own per (batch, table width), split by choose_splits(M, the
    table's width in tokens): the table is as wide as the longest sequence needs, so that is its max seq len rounded
    up to a page (the same split count, without reading the lengths on the host)."""

    def __init__(self, ref_weights: Any, dims: Any, device: str):
        import torch

        from kimi_k3_path.kernels import mla as kernels_mla
        from kimi_k3_path.kernels import mla_attention

        self._kernels, self._attention = kernels_mla, mla_attention
        self.weights = kernels_mla.prepare_mla_weights(ref_weights, dims, device)
        self.heads, self.device = dims.heads, device
        self.workspaces: dict[tuple[int, int], Any] = {}  # allocated at the first (eager) call of a shape: graph-safe
        self._torch = torch

    def workspace(self, cache: Any) -> Any:
        m, width = cache.block_table.shape
        if (m, width) not in self.workspaces:
            splits = self._attention.choose_splits(m, width * cache.pages.shape[1])
            self.workspaces[m, width] = self._attention.mla_workspace(m, self.heads, splits, self.device)
        return self.workspaces[m, width]

    def __call__(self, x: Any, cache: Any) -> Any:
        out = self._torch.empty_like(x)
        self._kernels.mla_decode(x, self.weights, cache.pages, cache.block_table, cache.seq_lens, cache.slots, out,
                                 self._torch.cuda.current_stream(), self.workspace(cache), check_inputs=False)
        return out


class CandidateAttnRes:
    """The specialized AttnRes plugged into the candidate layers in place of `stock.attn_res` (its arguments and
    result): `kimi_k3_path.kernels.attn_res.attn_res_decode` on the current stream."""

    def __init__(self) -> None:
        import torch

        from kimi_k3_path.kernels import attn_res

        self._kernels, self._torch = attn_res, torch

    def __call__(self, prefix: Any, delta: Any, blocks: Any, num_blocks: int, write_block: int, res_norm: Any,
                 res_proj: Any, out_norm: Any, eps: float, out_eps: float) -> Any:
        out = self._torch.empty_like(prefix)
        self._kernels.attn_res_decode(prefix, delta, blocks, num_blocks, write_block, res_norm, res_proj, out_norm, out,
                                      eps, out_eps, self._torch.cuda.current_stream())
        return out


def attn_res_error(mix: Any, norms: Any, ref_norms: Any, x: Any, ref_stream: Any, pos: Any, device: str,
                   where: str) -> float:
    """Both AttnRes sites of a layer by `mix` (stock.attn_res's signature) on input x and its own copy of ref_stream,
    around an attention that returns a fixed random output: the attention's and the MoE's inputs within 2e-2 of the
    fp32 reference (`reference.layers.pre_attention`, `pre_mlp`; the bf16 stream is the stock path's), else
    BenchError. Returns the larger relative error."""
    import torch

    from benchmarks.kimi_k3 import stock
    from kimi_k3_path.reference import rel_err
    from kimi_k3_path.reference.layers import pre_attention, pre_mlp

    stream = stock.GpuStream.from_reference(ref_stream, device)
    attn_out = torch.randn(x.shape, generator=torch.Generator(device=x.device).manual_seed(7), device=x.device).to(x.dtype)
    seen: list[Any] = []
    mlp_in = stock.attention_part(x, stream, norms, pos, lambda h: seen.append(h) or attn_out, mix)
    ref_attn_in, ref_stream_after = pre_attention(x.float(), ref_stream, ref_norms, pos)
    ref_mlp_in, _ = pre_mlp(attn_out.float(), ref_stream_after, ref_norms, pos)
    err = max(rel_err(seen[0], ref_attn_in), rel_err(mlp_in, ref_mlp_in))
    if not err < 2e-2:
        raise BenchError(f"{where}: the candidate AttnRes is {err:.3g} from the fp32 reference (bar 2e-2)")
    return err


def moe_error(candidate: Any, ref_moe: Any, h: Any, dims: Any, where: str) -> float:
    """The candidate MoE's bf16 output on MoE input h against the fp32 reference: within 1e-2 (issue 6's bar), else
    BenchError. Returns the relative error."""
    from kimi_k3_path.reference import latent_moe, rel_err

    err = rel_err(candidate(h), latent_moe(h.float(), ref_moe, dims.moe))
    if not err < 1e-2:
        raise BenchError(f"{where}: the candidate MoE is {err:.3g} from the fp32 reference (bar 1e-2)")
    return err


def kda_error(candidate: Any, ref_kda: Any, x: Any, ref_state: Any, dims: Any, device: str, where: str) -> float:
    """The candidate KDA attention on input x and its own copy of ref_state: its output and updated recurrent state
    within 2e-2 of the fp32 reference step (bf16 GEMMs around the kernel: the stock path's bar), else BenchError.
    Returns the larger relative error."""
    from benchmarks.kimi_k3 import stock
    from kimi_k3_path.reference import kda_decode_step, rel_err

    state = stock.GpuKdaState.from_reference(ref_state, device)
    out = candidate(x, state)
    ref_out, ref_new = kda_decode_step(x.float(), ref_kda, ref_state, dims.kda)
    err = max(rel_err(out, ref_out), rel_err(state.recurrent, ref_new.recurrent))
    if not err < 2e-2:
        raise BenchError(f"{where}: the candidate KDA attention is {err:.3g} from the fp32 reference (bar 2e-2)")
    return err


def mla_error(candidate: Any, ref_mla: Any, x: Any, ref_cache: Any, dims: Any, device: str, where: str) -> float:
    """The candidate MLA attention on input x and its own copy of ref_cache: its output and the decoded rows it
    wrote within 2e-2 of the fp32 reference (bf16 GEMMs and norms around the kernel: the stock path's bar), else
    BenchError. Returns the larger relative error."""
    from benchmarks.kimi_k3 import stock
    from kimi_k3_path.reference import mla_decode, rel_err

    cache = stock.GpuLatentCache.from_reference(ref_cache, device)
    out = candidate(x, cache)
    ref_out, ref_new = mla_decode(x.float(), ref_mla, ref_cache, dims.mla)
    row = dims.mla.cache_row
    written = cache.pages.view(-1, row)[cache.slots]
    err = max(rel_err(out, ref_out), rel_err(written, ref_new.pages.reshape(-1, row).to(written.device)[cache.slots]))
    if not err < 2e-2:
        raise BenchError(f"{where}: the candidate MLA attention is {err:.3g} from the fp32 reference (bar 2e-2)")
    return err


# The op families the candidate can run on the CuTe DSL kernels (--kernel-ops), each with what runs it.
KERNEL_OPS = {
    "moe": "kernels.moe.latent_moe_decode for the MoE",
    "kda": "kernels.kda.kda_attention_decode for KDA attention",
    "mla": "kernels.mla.mla_decode for MLA attention",
    "attn_res": "kernels.attn_res.attn_res_decode for both AttnRes sites",
}


_ops_list = _choice_list(KERNEL_OPS, "kernel op famil(ies)")


def resolve_candidate(choice: str, device: str, ops: tuple[str, ...] = tuple(KERNEL_OPS)) -> tuple[str, str]:
    """('kernels' | 'stock', why); with kernels, the note names the op families `ops` the candidate runs on them."""
    if choice == "stock":
        return "stock", "candidate = the stock-like ops (A/A: no specialized kernels measured in this run)"
    if device == "cpu":
        if choice == "kernels":
            raise BenchError("--candidate kernels needs a GPU")
        return "stock", "candidate = the stock-like ops (CPU smoke)"
    try:
        from kimi_k3_path.kernels import attn_res, kda, mla, moe  # noqa: F401
    except ImportError as exc:
        if choice == "kernels":
            raise BenchError(f"--candidate kernels: the kernels do not import: {exc}") from exc
        return "stock", f"candidate = the stock-like ops (kernels not importable: {exc})"
    return "kernels", ("candidate = stock-like layer with the CuTe DSL kernels: "
                       + ", ".join(KERNEL_OPS[op] for op in KERNEL_OPS if op in ops))


class Bench:
    def __init__(self, args: argparse.Namespace, device: str):
        from kimi_k3_path.config import load_config, named_config

        self.args = args
        self.device = device
        self.config = named_config(args.config) if args.config in ("kimi_k3", "tiny") else load_config(args.config)
        self.candidate_kind, self.candidate_note = resolve_candidate(args.candidate, device, args.kernel_ops)
        self.ops = set(args.kernel_ops) if self.candidate_kind == "kernels" else set()
        self.candidate_mix = CandidateAttnRes() if "attn_res" in self.ops else None
        self.l2_bytes = L2_BYTES_DEFAULT
        if device == "cuda":
            import torch

            self.l2_bytes = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", L2_BYTES_DEFAULT))

    def generator(self, salt: int) -> Any:
        import torch

        return torch.Generator(device=self.device).manual_seed(self.args.seed * 1_000_003 + salt)

    def copies_for(self, bytes_per_step: int) -> int:
        """Enough copies that one cycle through them moves at least 4x the L2."""
        if self.device == "cpu":
            return 2
        return min(MAX_COPIES, max(2, math.ceil(4 * self.l2_bytes / max(bytes_per_step, 1))))

    def cases(self, layer: str, tp: int) -> Iterator[Case]:
        import torch

        if layer == "step":
            yield from self.step_cases(tp)
            return

        from kimi_k3_path.reference import (
            LayerPosition, random_kda_state, random_kda_weights, random_layer_norms, random_mla_weights,
            random_moe_weights, random_paged_cache, random_residual_stream,
        )
        from benchmarks.kimi_k3 import stock
        from kimi_k3_path.reference.dims import layer_dims

        dims = layer_dims(self.config, tp)
        tiny = self.args.config == "tiny"
        pos = LayerPosition(
            (TINY_KDA_LAYER if tiny else KDA_LAYER) if layer != "mla_moe" else (TINY_MLA_LAYER if tiny else MLA_LAYER),
            dims.attn_res_block,
        )
        expected_kind = {"kda_moe": "kda", "mla_moe": "mla"}.get(layer)
        if expected_kind is not None and self.config.attention_kind(pos.layer) != expected_kind:
            raise BenchError(f"layer {pos.layer} (0-based) of this config is not a {expected_kind} layer")
        sms = torch.cuda.get_device_properties(0).multi_processor_count if self.device == "cuda" else 4

        # Weights: one probe set first to size the copies, then the rest.
        def make_weights(copy: int) -> dict[str, Any]:
            gen = self.generator(10_000 * tp + 100 * LAYERS.index(layer) + copy)
            ref_moe = random_moe_weights(dims.moe, gen)
            ref_norms = random_layer_norms(dims.moe.hidden, gen)
            w = {
                "norms": stock.GpuNorms.from_reference(ref_norms, self.device),
                "ref_norms": ref_norms if copy == 0 else None,  # check_attention()
                "moe": stock.GpuMoe.from_reference(ref_moe, dims.moe, self.device, pad_intermediate=dims.stock_intermediate),
            }
            if layer == "kda_moe":
                ref_kda = random_kda_weights(dims.kda, gen)
                w["kda"] = stock.GpuKda.from_reference(ref_kda, self.device)
                w["candidate_kda"] = CandidateKda(ref_kda, dims.kda, self.device) if "kda" in self.ops else None
                w["ref_kda"] = ref_kda if copy == 0 and w["candidate_kda"] is not None else None  # check_attention()
            if layer == "mla_moe":
                ref_mla = random_mla_weights(dims.mla, gen)
                w["mla"] = stock.GpuMla.from_reference(ref_mla, dims.mla, self.device)
                w["candidate_mla"] = (CandidateMla(ref_mla, dims.mla, self.device) if "mla" in self.ops
                                      else None)
                w["ref_mla"] = ref_mla if copy == 0 and w["candidate_mla"] is not None else None  # check_attention()
            w["candidate_moe"] = CandidateMoe(ref_moe, dims.moe, self.device) if "moe" in self.ops else None
            w["ref_moe"] = ref_moe if copy == 0 and w["candidate_moe"] is not None else None  # for check() only
            return w

        weights = [make_weights(0)]
        for batch in self.args.batch:
            inputs: list[dict[str, Any]] = []
            floor, copies = LayerBytes(), 1
            while len(inputs) < copies:
                c = len(inputs)
                if c >= len(weights):
                    weights.append(make_weights(c))
                gen = self.generator(1_000_000 + 10_000 * tp + 100 * batch + c)
                item: dict[str, Any] = {"x": torch.randn(batch, dims.moe.hidden, generator=gen, device=self.device).to(torch.bfloat16)}
                if layer != "moe":
                    item["stream"] = random_residual_stream(batch, dims.moe.hidden, dims.max_blocks, gen)
                if layer == "kda_moe":
                    item["state"] = random_kda_state(dims.kda, batch, gen)
                if layer == "mla_moe":
                    item["cache"] = random_paged_cache(dims.mla, [self.args.context + 1] * batch, self.args.page, gen)
                inputs.append(item)
                if c == 0:
                    floor = layer_bytes(layer, dims, pos, weights[0], item, item["x"])
                    copies = self.copies_for(floor.total)
            pairs = list(zip(weights, inputs))
            base_fns = [self.layer_fn(layer, dims, pos, w, item, None) for w, item in pairs]
            cand_fns = [self.layer_fn(layer, dims, pos, w, item, w["candidate_moe"],
                                      w.get("candidate_kda", w.get("candidate_mla")), self.candidate_mix)
                        for w, item in pairs]
            err = self.check(layer, dims, pos, weights[0], inputs[0], tp, batch)
            checked = "" if err is None else f"; candidate MoE rel err {err:.2e} vs the fp32 reference"
            checked += self.check_attention(layer, dims, pos, weights[0], inputs[0], tp, batch)
            for fn in (base_fns[0], cand_fns[0]):  # compile and autotune outside the profiler
                fn()
            label = f"{layer} tp={tp} batch={batch}" if self.args.breakdown else None
            base_kernels = self.kernel_count(base_fns[0], label and f"{label} stock-like")
            cand_kernels = self.kernel_count(cand_fns[0], label and f"{label} candidate")
            ctx = f"; MLA context {self.args.context} tokens, page {self.args.page}" if layer == "mla_moe" else ""
            attention = {"kda_moe": "kda", "mla_moe": "mla"}.get(layer, "")
            yield Case(layer, tp, batch, base_fns, cand_fns, floor.total, (
                f"baseline = stock-like ({base_kernels} kernels); {self.candidate_note} ({cand_kernels} kernels); "
                f"layer {pos.layer} (0-based); {copies} copies of weights+inputs rotated; "
                f"floor = {floor.total} B ({floor.describe(attention)}) / 4.3e12 B/s; stock expert intermediate "
                f"{dims.stock_intermediate}{ctx}{checked}"
            ))

    def step_cases(self, tp: int) -> Iterator[Case]:
        """`--layer step`: per batch, the first layers of the model as one decode step (step.py), both variants on
        their own copies of one random state, checked at the first batch (check_step)."""
        import torch

        from kimi_k3_path.config import shard_shapes
        from kimi_k3_path.executor import StepBatch, build_executor
        from kimi_k3_path.reference.dims import layer_dims
        from kimi_k3_path.support import Deployment

        dims = layer_dims(self.config, tp)
        try:
            layers = step_stack.stack_layers(self.config, self.args.step_layers or dims.attn_res_block)
        except ValueError as exc:
            raise BenchError(str(exc)) from exc
        ref_weights = step_stack.random_weights(layers, dims, shard_shapes(self.config, tp).dense_intermediate,
                                                self.generator(10_000 * tp + 100 * LAYERS.index("step")))
        stack = step_stack.DeviceStack(
            layers, ref_weights, dims, self.device,
            moe_kernels=(lambda w: CandidateMoe(w, dims.moe, self.device)) if "moe" in self.ops else None,
            kda_kernels=(lambda w: CandidateKda(w, dims.kda, self.device)) if "kda" in self.ops else None,
            mla_kernels=(lambda w: CandidateMla(w, dims.mla, self.device)) if "mla" in self.ops else None, sms=self.sms(),
            mix=self.candidate_mix)
        arch = "cpu" if self.device == "cpu" else "sm_{}{}".format(*torch.cuda.get_device_capability(0))
        executor = build_executor(
            Deployment(arch=arch, tp=tp, max_batch=max(self.args.batch), max_context=self.args.context))
        for batch in self.args.batch:
            gen = self.generator(2_000_000 + 10_000 * tp + 100 * batch)
            x = torch.randn(batch, dims.moe.hidden, generator=gen, device=self.device).to(torch.bfloat16)
            states = step_stack.random_states(layers, dims, batch, self.args.context, self.args.page, gen)
            checked = ""
            if batch == self.args.batch[0]:
                checked = "; " + self.check_step(stack, ref_weights, x, states, tp, batch)
            floor = stack.floor_bytes(x, states)
            base_fn, cand_fn = (stack.step_fn(x, states, specialized=s) for s in (False, True))
            for fn in (base_fn, cand_fn):  # compile and autotune outside the profiler
                fn()
            decision = executor.decide(StepBatch.decode([self.args.context] * batch))
            yield Case("step", tp, batch, [base_fn], [cand_fn], floor.total, (
                f"baseline = stock-like step ({self.kernel_count(base_fn)} kernels); {self.candidate_note}, in every "
                f"layer ({self.kernel_count(cand_fn)} kernels); {step_stack.describe(layers)}; one step per CUDA "
                f"graph; executor decision for this batch: {decision.path} ({decision.reason}); MLA context "
                f"{self.args.context} tokens, page {self.args.page}; no TP all-reduce (one GPU); floor = {floor.total} "
                f"B ({floor.describe()}) / 4.3e12 B/s{checked}"
            ), steps_per_graph=1)

    def check_step(self, stack: Any, ref_weights: list[Any], x: Any, states: list[Any], tp: int, batch: int) -> str:
        """Before timing, each variant runs the step once on its own copy of `states`: both outputs must be finite, and
        in every layer the specialized ops, on the inputs the step gave them, within the per-layer rows' bars of the
        fp32 reference (`moe_error`, `kda_error`, `mla_error`). How far the two steps' outputs are apart
        is reported, not judged: one near-tie in the top-k selection (bf16 upstream) routes a token differently and
        moves the output of every later layer, so no tolerance separates that from a fault;
        tests/benchmarks/kimi_k3/test_step.py checks the composition with routing margins instead. Returns the note
        text; BenchError on a failure."""
        import torch

        from kimi_k3_path.reference import rel_err

        seen: dict[tuple[int, str], Any] = {}
        outputs = {
            "stock-like": stack.step_fn(x, states, specialized=False)(),
            "specialized": stack.step_fn(x, states, specialized=True,
                                         observe=lambda i, stage, h: seen.__setitem__((i, stage), h.clone()))(),
        }
        for name, out in outputs.items():
            if not torch.isfinite(out).all():
                raise BenchError(f"step tp={tp} batch={batch}: the {name} step's output is not finite")
        errors: dict[str, list[float]] = {"MoE": [], "KDA attention": [], "MLA attention": []}
        for i, part in enumerate(stack.parts):
            where = f"step tp={tp} batch={batch} layer {i}"
            if part.get("kernels") is not None:
                errors["MoE"].append(moe_error(part["kernels"], ref_weights[i].moe, seen[i, "mlp"], stack.dims, where))
            if part.get("kda_kernels") is not None:
                errors["KDA attention"].append(kda_error(part["kda_kernels"], ref_weights[i].kda, seen[i, "attention"],
                                                         states[i], stack.dims, self.device, where))
            if part.get("mla_kernels") is not None:
                errors["MLA attention"].append(mla_error(part["mla_kernels"], ref_weights[i].mla, seen[i, "attention"],
                                                         states[i], stack.dims, self.device, where))
        checked = "".join(f"candidate {what} rel err vs the fp32 reference, worst of {len(errs)} layers {max(errs):.2e}; "
                          for what, errs in errors.items() if errs)
        apart = rel_err(outputs["specialized"], outputs["stock-like"])
        return checked + f"specialized vs stock-like step output rel err {apart:.2e}"

    def attention_fn(self, layer: str, dims: Any, pos: Any, w: dict[str, Any], item: dict[str, Any],
                     attention_op: Any = None, mix: Any = None) -> Callable[[], Any]:
        """A closure computing the MoE input of one decode step on copy `item` (its own copies of the stream, state
        and cache): AttnRes, the stock attention (or `attention_op(h, state)`, the state a `stock.GpuKdaState` or
        `stock.GpuLatentCache`), AttnRes (each site by `mix`, stock.attn_res's signature, where given); or the input
        itself for the bare block."""
        from benchmarks.kimi_k3 import stock

        if layer == "moe":
            x = item["x"]
            return lambda: x
        stream = stock.GpuStream.from_reference(item["stream"], self.device)
        delta = item["x"]
        norms = w["norms"]
        sites = {} if mix is None else {"mix": mix}
        if layer == "kda_moe":
            state = stock.GpuKdaState.from_reference(item["state"], self.device)
            if attention_op is not None:
                return lambda: stock.attention_part(delta, stream, norms, pos, lambda h: attention_op(h, state), **sites)
            return lambda: stock.attention_part(delta, stream, norms, pos,
                                                lambda h: stock.kda_attention(h, w["kda"], state, dims.kda), **sites)
        cache = stock.GpuLatentCache.from_reference(item["cache"], self.device, sms=self.sms())
        if attention_op is not None:
            return lambda: stock.attention_part(delta, stream, norms, pos, lambda h: attention_op(h, cache), **sites)
        return lambda: stock.attention_part(delta, stream, norms, pos,
                                            lambda h: stock.mla_attention(h, w["mla"], cache, dims.mla), **sites)

    def layer_fn(self, layer: str, dims: Any, pos: Any, w: dict[str, Any], item: dict[str, Any], cand_moe: Any,
                 cand_attention: Any = None, cand_mix: Any = None) -> Callable[[], Any]:
        """A closure running one decode step of `layer` on copy `item` (its own stream/state/cache)."""
        from benchmarks.kimi_k3 import stock

        moe = w["moe"]
        moe_fn = cand_moe if cand_moe is not None else (lambda h: stock.latent_moe(h, moe, dims.moe))
        attention = self.attention_fn(layer, dims, pos, w, item, cand_attention, cand_mix)
        return lambda: moe_fn(attention())

    def sms(self) -> int:
        import torch

        return torch.cuda.get_device_properties(0).multi_processor_count if self.device == "cuda" else 4

    def check(self, layer: str, dims: Any, pos: Any, w: dict[str, Any], item: dict[str, Any], tp: int, batch: int) -> float | None:
        """The candidate computes the latent MoE: on this step's MoE input, its bf16 output is within 1e-2 of the fp32
        reference (issue 6's bar). The stock-like baseline has its own GPU tests. Returns the relative error, or None
        with no candidate."""
        if w["candidate_moe"] is None:
            return None
        h = self.attention_fn(layer, dims, pos, w, item)()
        return moe_error(w["candidate_moe"], w["ref_moe"], h, dims, f"{layer} tp={tp} batch={batch}")

    def check_attention(self, layer: str, dims: Any, pos: Any, w: dict[str, Any], item: dict[str, Any], tp: int,
                        batch: int) -> str:
        """The candidate computes the layer's AttnRes sites and attention on the step's input and state
        (attn_res_error; kda_error, mla_error): the row note's text for them, empty with no candidate attention."""
        where = f"{layer} tp={tp} batch={batch}"
        mixed = ""
        if self.candidate_mix is not None and layer != "moe":
            err = attn_res_error(self.candidate_mix, w["norms"], w["ref_norms"], item["x"], item["stream"], pos,
                                 self.device, where)
            mixed = f"; candidate AttnRes rel err {err:.2e} vs the fp32 reference"
        if w.get("candidate_kda") is not None:
            what = "KDA"
            err = kda_error(w["candidate_kda"], w["ref_kda"], item["x"], item["state"], dims, self.device, where)
        elif w.get("candidate_mla") is not None:
            what = "MLA"
            err = mla_error(w["candidate_mla"], w["ref_mla"], item["x"], item["cache"], dims, self.device, where)
        else:
            return mixed
        return f"{mixed}; candidate {what} attention rel err {err:.2e} vs the fp32 reference"

    def kernel_count(self, fn: Callable[[], Any], breakdown_label: str | None = None) -> int | str:
        """Kernels one step launches; with a label, also print each launch's share of the step (timeline.py), from one
        eager call or one graph replay (--breakdown)."""
        if self.device != "cuda":
            return "n/a on CPU"
        from benchmarks.kimi_k3.stock import kernel_spans
        from benchmarks.kimi_k3.timeline import breakdown_lines

        spans = kernel_spans(fn, graph=breakdown_label is not None and self.args.breakdown == "graph")
        if breakdown_label is not None:
            print("\n".join(breakdown_lines(breakdown_label, spans, how=self.args.breakdown)))
        return len(spans)


def hardware(device: str) -> dict[str, Any]:
    if device == "cpu":
        return {"gpu": f"none (CPU smoke run on {platform.machine()})", "count": 1, "driver": "none", "arch": None}
    import torch

    name = torch.cuda.get_device_name(0)
    driver = "unknown"
    count = torch.cuda.device_count()
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip().splitlines()
        name, driver = (part.strip() for part in smi[0].split(",", 1))
        count = len(smi)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        print(f"warning: nvidia-smi unavailable ({exc}); hardware from torch", file=sys.stderr)
    major, minor = torch.cuda.get_device_capability(0)
    return {"gpu": name, "count": count, "driver": driver, "arch": f"sm_{major}{minor}"}


def software() -> dict[str, str]:
    import torch
    import triton

    info = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__}
    if torch.version.cuda:
        info["cuda"] = torch.version.cuda
    return info


def current_commit(explicit: str | None) -> str:
    if explicit:
        return explicit
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise BenchError(f"cannot read the commit with git ({exc}); pass --commit") from exc


def case_argv(args: argparse.Namespace, layer: str, tp: int, commit: str) -> list[str]:
    """The arguments that measure only (layer, tp) of `args`, in the process they start."""
    argv = ["--layer", layer, "--tp", str(tp), "--batch", ",".join(map(str, args.batch)), "--config", args.config,
            "--context", str(args.context), "--page", str(args.page), "--replays", str(args.replays),
            *(["--step-layers", str(args.step_layers)] if args.step_layers else []),
            "--candidate", args.candidate, "--kernel-ops", ",".join(args.kernel_ops), "--commit", commit,
            "--seed", str(args.seed), "--processes", "one"]
    return argv + (["--breakdown", args.breakdown] if args.breakdown else []) + ["--cpu-smoke"] * args.cpu_smoke


def child_env() -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH, for a child that imports kimi_k3_path
    (benchmarks.kimi_k3.bench here, bench_moe) however this one was started."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")) if p)}


def run_per_case(args: argparse.Namespace, commit: str, command: str, created: datetime,
                 on_rows: Callable[[Any], None] | None = None) -> Any:
    """run() with each (layer, tp) in a fresh child process of this module, the rows merged in order into one
    PerfEvidence (every child must report the same hardware and software); `on_rows` as for run()."""
    from gatekeeper.evidence import PerfEvidence

    env = child_env()
    parts: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="kimi-bench-") as tmp:
        for layer in args.layer:
            for tp in args.tp:
                out = Path(tmp) / f"{layer}-tp{tp}.json"
                child = [sys.executable, "-m", "benchmarks.kimi_k3.bench", *case_argv(args, layer, tp, commit),
                         "--out", str(out)]
                rc = subprocess.run(child, env=env).returncode
                if rc != 0 or not out.is_file():
                    raise BenchError(f"the {layer} tp={tp} case failed in its own process (exit {rc}; its output is "
                                     "above)")
                part = PerfEvidence.model_validate_json(out.read_text())
                if parts and (part.hardware, part.software) != (parts[0].hardware, parts[0].software):
                    raise BenchError(f"the {layer} tp={tp} case ran on {part.hardware} / {part.software}, the first "
                                     f"on {parts[0].hardware} / {parts[0].software}: not one machine")
                parts.append(part.model_copy(update={"rows": tuple(
                    row.model_copy(update={"note": f"{row.note}; measured in a process of its own"})
                    for row in part.rows)}))
                merged = parts[0].model_copy(update={
                    "command": command, "created": created, "rows": tuple(row for p in parts for row in p.rows)})
                if on_rows is not None:
                    on_rows(merged)
    return merged


def run(args: argparse.Namespace, on_rows: Callable[[Any], None] | None = None) -> Any:
    """Measure every case (each (layer, tp) in its own process with --processes per-case); `on_rows` gets the
    PerfEvidence so far after each row (a long run killed part-way still leaves valid evidence for the rows it
    finished)."""
    from gatekeeper.evidence import PerfEvidence
    from kimi_k3_path.support import SUPPORT_MATRIX, spec_label

    import torch

    device = "cpu" if args.cpu_smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchError("no CUDA GPU here; use --cpu-smoke to exercise the harness on CPU")
    command = "python -m benchmarks.kimi_k3.bench " + " ".join(sys.argv[1:]) if sys.argv[0].endswith("bench.py") else " ".join(sys.argv)
    commit, created = current_commit(args.commit), datetime.now(timezone.utc)
    if args.processes == "per-case" and len(args.layer) * len(args.tp) > 1:
        return run_per_case(args, commit, command, created, on_rows)
    hw, sw = hardware(device), software()
    bench = Bench(args, device)
    rows: list[dict[str, Any]] = []

    def evidence(rows_so_far: list[dict[str, Any]]) -> Any:
        return PerfEvidence(commit=commit, command=command, created=created, hardware=hw, software=sw, rows=tuple(rows_so_far))

    print(f"{'layer':8} {'tp':>3} {'batch':>5} {'baseline us':>12} {'spread%':>8} {'candidate us':>13} {'spread%':>8} {'floor us':>9} {'base/floor':>10}")
    for layer in args.layer:
        for tp in args.tp:
            for case in bench.cases(layer, tp):
                samples = time_variants({"baseline": case.baseline, "candidate": case.candidate}, args.replays, device,
                                        case.steps_per_graph)
                base, cand = measurement_of(samples["baseline"]), measurement_of(samples["candidate"])
                floor = floor_us(case.floor_bytes)
                print(f"{layer:8} {tp:>3} {case.batch:>5} {base['median']:>12.1f} {base['spread_pct']:>8.1f} "
                      f"{cand['median']:>13.1f} {cand['spread_pct']:>8.1f} {floor:>9.1f} {base['median'] / floor:>10.2f}", flush=True)
                note = case.note
                if layer == "step":
                    note += (f"; tokens/s per rank: {case.batch / cand['median'] * 1e6:.0f} specialized, "
                             f"{case.batch / base['median'] * 1e6:.0f} stock-like")
                rows.append({
                    "axes": {
                        "arch": hw["arch"] or "cpu", "tp": tp, "dcp": 1, "batch": case.batch,
                        "spec": spec_label(None, 0), "layer": layer,
                        # The MLA decode's cost grows with the cached tokens: the support matrix's `context` axis.
                        "context": args.context,
                    },
                    "metric": "latency", "unit": "us", "candidate": cand, "baseline": base,
                    "floor": floor, "note": note,
                })
                del case
                if device == "cuda":
                    torch.cuda.empty_cache()
                if on_rows is not None:
                    on_rows(evidence(rows))
    if device == "cuda" and hw["arch"] not in SUPPORT_MATRIX.arch:
        print(f"warning: measured on {hw['arch']}, which the support matrix does not admit", file=sys.stderr)
    return evidence(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu_smoke:
        # The stock path's Triton kernels run in Triton's CPU interpreter; it is read when they are defined.
        os.environ["TRITON_INTERPRET"] = "1"

    def write(evidence: Any) -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(evidence.model_dump_json(indent=2) + "\n")
        tmp.replace(args.out)

    try:
        evidence = run(args, write if args.out else None)
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        write(evidence)
        print(f"wrote {len(evidence.rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
