"""What a launch that only reads can reach on this GPU, in the harness the MoE kernels are timed in: the ceiling for
issue 6's one-token criteria (GEMV-class kernels >= 3.9 TB/s from 50 MB, within 1.3x of the byte floor below; the
block within 1.25x of its floor).

    python -m benchmarks.kimi_k3.bench_ceiling \
        --segments tests/benchmarks/kimi_k3/data/moe_kernels_m1.json --out ceiling.json

The byte counts come from a bench_moe `--kernels-out` file (each one-token launch's weight bytes), so the yardstick
reads exactly what the kernels read. For each count: stream.ReadStream (16-byte loads as the kernels issue them,
XOR-folded) over a sweep of CTAs per SM and loads in flight per thread (with `--via`, also through shared memory by
cp.async or bulk copies, which hold no registers: how far staging can go), and torch's own int32 sum as a second
opinion; CUDA graphs of at least 12 launches (bench_moe.time_graph, as every kernel row), buffers rotated well
beyond L2. Then, per TP, the block's four segments (front, GEMM1, GEMM2, finalize) as four read-only launches in
stream order: plainly, launched early (programmatic dependent launch) waiting before the first load, and launched
early holding the first batch of loads across the wait. Every read is checked against the host (XOR of the buffer).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

L2_BYTES = 50 * 2**20
ROTATED_BYTES = 3 * L2_BYTES  # each size is read from at least this many bytes of distinct buffers in turn
CTAS_PER_SM = (1, 2, 3, 4, 6, 8)  # resident at once: 8 up to 4 loads in flight (<= 30 registers), 5 at 8 (46)
IN_FLIGHT = (2, 4, 8)  # at 16, ptxas issues the last load only after folding the other 15
STAGED_IN_FLIGHT = (2, 4, 8, 16)  # staged reads hold no registers for their bytes: 16 (64 KB per CTA) is fine
GEMV_MIN_BYTES = 50_000_000  # issue 6: >= 3.9 TB/s from 50 MB, within 1.3x of the byte floor below
GEMV_TB_S = 3.9
SMALL_FLOOR_RATIO = 1.3
BLOCK_FLOOR_RATIO = 1.25
# The block's four launches at one token, by the start of their bench_moe names (kernel rows of the segments file;
# the names say which launch carries the shared gate_up).
SEGMENTS = ("front", "experts_gemm1", "experts_gemm2", "finalize")
CHAIN_MODES = {  # mode -> (wait, trigger) of every launch after the first; the first never waits
    "serial": ("none", False),
    "early": ("start", True),
    "held": ("held", True),
}


class SegmentsError(ValueError):
    pass


def load_segments(path: Path) -> list[dict]:
    """The kernel rows of a bench_moe --kernels-out file that carry weight bytes; SegmentsError says what is wrong."""
    try:
        rows = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SegmentsError(f"{path}: cannot read kernel rows: {exc}") from exc
    if not isinstance(rows, list):
        raise SegmentsError(f"{path}: expected a JSON list of kernel rows, got {type(rows).__name__}")
    kept = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or "kernel" not in row:
            raise SegmentsError(f"{path}: row {i} is not a kernel row (no 'kernel')")
        if "weight_bytes" not in row:
            continue  # e.g. "block [CUDA cores]" rows
        if not isinstance(row["weight_bytes"], int) or row["weight_bytes"] <= 0:
            raise SegmentsError(f"{path}: row {i} ({row['kernel']}): weight_bytes must be a positive integer")
        kept.append(row)
    if not kept:
        raise SegmentsError(f"{path}: no kernel rows with weight_bytes")
    return kept


def block_chains(rows: list[dict]) -> dict[int, list[int]]:
    """tp -> the one-token block's four segment byte counts, in launch order, for each TP whose rows have all four."""
    chains = {}
    for tp in sorted({r["tp"] for r in rows if r.get("batch") == 1}):
        named = {r["kernel"]: r["weight_bytes"] for r in rows if r["tp"] == tp and r.get("batch") == 1}
        found = [[n for name, n in named.items() if name.startswith(prefix)] for prefix in SEGMENTS]
        if all(len(f) == 1 for f in found):
            chains[tp] = [f[0] for f in found]
    return chains


def criterion(nbytes: int, median_us: float, bandwidth: float) -> dict:
    """Issue 6's one-token criterion for a launch reading nbytes in median_us, and whether that time meets it."""
    floor_us = nbytes / bandwidth * 1e6
    tb_s = nbytes / (median_us * 1e-6) / 1e12
    if nbytes >= GEMV_MIN_BYTES:
        return {"rule": f">= {GEMV_TB_S} TB/s", "floor_us": floor_us, "tb_s": tb_s, "met": tb_s >= GEMV_TB_S}
    return {"rule": f"<= {SMALL_FLOOR_RATIO}x floor", "floor_us": floor_us, "tb_s": tb_s,
            "floor_ratio": median_us / floor_us, "met": median_us <= SMALL_FLOOR_RATIO * floor_us}


def rotation(nbytes: int) -> int:
    """How many distinct buffers of nbytes are read in turn so that none is still in L2 when read again."""
    return max(3, math.ceil(ROTATED_BYTES / nbytes))


def words_of(nbytes: int) -> int:
    """int32 words covering nbytes, rounded up to whole 16-byte vectors."""
    return -(-nbytes // 16) * 4


def xor_reduce(t):
    """XOR of all int32 words of t, on the device (torch has no XOR reduction): halve until one word is left."""
    import torch

    t = t.flatten()
    while t.numel() > 1:
        if t.numel() % 2:
            t = torch.cat([t, torch.zeros(1, dtype=t.dtype, device=t.device)])
        half = t.numel() // 2
        t = torch.bitwise_xor(t[:half], t[half:])
    return int(t.item())


def checked(bufs, outs, ctas: int, in_flight: int, wait: str, trigger: bool, via: str = "registers") -> None:
    """One eager launch per buffer; the CTAs' words must XOR to the buffer's (raises AssertionError otherwise)."""
    import torch

    from benchmarks.kimi_k3.stream import read_stream

    for buf, out in zip(bufs, outs):
        out.fill_(0x5A5A5A5A)  # poison: a CTA that wrote nothing leaves a wrong fold
        read_stream(buf, out, ctas, in_flight, torch.cuda.current_stream(), wait, trigger, via)
        torch.cuda.synchronize()
        got, want = xor_reduce(out[:ctas]), xor_reduce(buf)
        if got != want:
            raise AssertionError(f"read_stream(ctas={ctas}, in_flight={in_flight}, wait={wait}, via={via}) read "
                                 f"{got:#x}, buffer XOR is {want:#x}")


def random_words(n: int, count: int, gen) -> list:
    import torch

    return [torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, device="cuda", generator=gen)
            for _ in range(count)]


def layouts(nbytes: int, sms: int, threads: int, via: str = "registers") -> list[tuple[str, int, int]]:
    """(layout, CTAs, 16-byte loads in flight per thread) to sweep for nbytes with CTAs of `threads`: grid-stride
    loops at CTAS_PER_SM CTAs per SM, and one batch per CTA (the expert launches' shape: many CTAs that each load
    once)."""
    in_flights = IN_FLIGHT if via == "registers" else STAGED_IN_FLIGHT
    configs = [("grid-stride", sms * per_sm, in_flight) for per_sm in CTAS_PER_SM for in_flight in in_flights]
    vectors = words_of(nbytes) // 4
    configs += [("one batch per CTA", -(-vectors // (threads * in_flight)), in_flight) for in_flight in in_flights]
    return configs


def single_launch_rows(nbytes: int, sms: int, bandwidth: float, replays: int, gen,
                       vias: tuple[str, ...] = ("registers",)) -> list[dict]:
    """Every layout of the read-only stream (each way in of `vias`, one after another per layout: same-run ratios),
    and torch's fp32 sum, reading nbytes per launch."""
    import torch

    from benchmarks.kimi_k3.bench import measurement_of
    from benchmarks.kimi_k3.bench_moe import time_graph
    from benchmarks.kimi_k3.stream import THREADS, read_stream

    configs = sorted({(c, via) for via in vias for c in layouts(nbytes, sms, THREADS, via)},
                     key=lambda cv: (cv[0], vias.index(cv[1])))
    bufs = random_words(words_of(nbytes), rotation(nbytes), gen)
    outs = [torch.empty(max(ctas for (_, ctas, _), _ in configs), dtype=torch.int32, device="cuda") for _ in bufs]
    rows = []
    for (layout, ctas, in_flight), via in configs:
        checked(bufs, outs, ctas, in_flight, "none", False, via)

        def launch(st, ctas=ctas, in_flight=in_flight, via=via):
            for buf, out in zip(bufs, outs):
                read_stream(buf, out, ctas, in_flight, st, via=via)

        t = measurement_of(time_graph(launch, replays, len(bufs)))
        rows.append({"bytes": nbytes, "kernel": "read_stream", "via": via, "layout": layout, "ctas": ctas,
                     "ctas_per_sm": round(ctas / sms, 2), "in_flight": in_flight, **t,
                     **criterion(nbytes, t["median"], bandwidth)})
    sums = [torch.empty((), dtype=torch.float32, device="cuda") for _ in bufs]

    def torch_sum(st):  # torch's tuned reduction (the words' values as floats do not matter to its speed)
        for buf, s in zip(bufs, sums):
            torch.sum(buf.view(torch.float32), dim=0, out=s)

    t = measurement_of(time_graph(torch_sum, replays, len(bufs)))
    rows.append({"bytes": nbytes, "kernel": "torch.sum(fp32)", **t, **criterion(nbytes, t["median"], bandwidth)})
    del bufs, outs, sums
    torch.cuda.empty_cache()
    return rows


def best(rows: list[dict], nbytes: int, via: str = "registers") -> dict:
    return min((r for r in rows if r["bytes"] == nbytes and r["kernel"] == "read_stream" and r["via"] == via),
               key=lambda r: r["median"])


def fastest_read(nbytes: int, replays: int, gen) -> dict:
    """The fastest read-only launch over nbytes (the sweep of ReadStream layouts, each read checked): the yardstick a
    kernel that streams nbytes once is held to (bench_mla, bench_dense)."""
    import torch

    from kimi_k3_path.kernels.runtime import COPY_BANDWIDTH

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = single_launch_rows(nbytes, sms, COPY_BANDWIDTH, replays, gen)
    return {**best(rows, nbytes), "swept": sum(r["kernel"] == "read_stream" for r in rows)}


def timing(t: dict) -> dict:
    """The gatekeeper.evidence.Measurement fields of a timing row."""
    return {k: t[k] for k in ("median", "spread_pct", "runs")}


def chain_rows(tp: int, segments: list[int], configs: dict[int, dict], bandwidth: float, replays: int, gen) -> list:
    """The four segments as read-only launches in stream order, in each CHAIN_MODES mode (each segment with its best
    single-launch configuration)."""
    import torch

    from benchmarks.kimi_k3.bench import measurement_of
    from benchmarks.kimi_k3.bench_moe import time_graph
    from benchmarks.kimi_k3.stream import read_stream

    sets = max(3, math.ceil(ROTATED_BYTES / sum(segments)))
    bufs = [random_words(words_of(n), sets, gen) for n in segments]  # bufs[segment][set]
    outs = [[torch.empty(configs[n]["ctas"], dtype=torch.int32, device="cuda") for _ in range(sets)] for n in segments]
    floor_us = sum(segments) / bandwidth * 1e6
    rows = []
    for mode, (wait, trigger) in CHAIN_MODES.items():
        plan = []  # (segment, ctas, in_flight, wait, trigger) in launch order
        for i, n in enumerate(segments):
            c = configs[n]
            plan.append((i, c["ctas"], c["in_flight"], "none" if i == 0 else wait,
                         trigger and i < len(segments) - 1))
        for i, ctas, in_flight, w, trig in plan:
            checked(bufs[i], outs[i], ctas, in_flight, w, trig)

        def launch(st, plan=plan):
            for s in range(sets):
                for i, ctas, in_flight, w, trig in plan:
                    read_stream(bufs[i][s], outs[i][s], ctas, in_flight, st, w, trig)

        t = measurement_of(time_graph(launch, replays, sets))
        rows.append({"tp": tp, "mode": mode, "segment_bytes": segments, **t, "floor_us": floor_us,
                     "floor_ratio": t["median"] / floor_us, "met": t["median"] <= BLOCK_FLOOR_RATIO * floor_us})
    del bufs, outs
    torch.cuda.empty_cache()
    return rows


def run(args) -> dict:
    import torch

    from benchmarks.kimi_k3.bench_moe import copy_bandwidth, driver_version, git_commit

    segment_rows = load_segments(args.segments)
    bandwidth = copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write), {sms} SMs", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    sizes = sorted({r["weight_bytes"] for r in segment_rows})
    single, configs = [], {}
    for nbytes in sizes:
        rows = single_launch_rows(nbytes, sms, bandwidth, args.replays, gen, args.via)
        single += rows
        configs[nbytes] = best(rows, nbytes)  # the chains below read through registers, as the kernels do
        kernels = ", ".join(sorted({r["kernel"] for r in segment_rows if r["weight_bytes"] == nbytes}))
        torch_row = next(r for r in rows if r["kernel"] != "read_stream")
        for via in args.via:
            top = best(rows, nbytes, via)
            one = min((r for r in rows if r.get("layout") == "one batch per CTA" and r["via"] == via),
                      key=lambda r: r["median"])
            print(f"{nbytes / 1e6:8.1f} MB  {via:>9}: best read {top['median']:7.2f} us ({top['spread_pct']:.1f}%) "
                  f"{top['tb_s']:5.2f} TB/s ({top['layout']}, {top['ctas']} CTAs x {top['in_flight']} loads); "
                  f"one batch per CTA {one['median']:6.2f} us ({one['in_flight']} per thread); torch.sum "
                  f"{torch_row['median']:7.2f} us; floor {top['floor_us']:6.2f} us; "
                  f"{top['rule']}: {'met' if top['met'] else 'NOT met'}  [{kernels}]", flush=True)
    chains = []
    for tp, segments in ({} if args.no_chains else block_chains(segment_rows)).items():
        for row in chain_rows(tp, segments, configs, bandwidth, args.replays, gen):
            chains.append(row)
            print(f"TP{tp} block as 4 read-only launches, {row['mode']:>6}: {row['median']:6.1f} us "
                  f"({row['spread_pct']:.1f}%), floor {row['floor_us']:.1f} us, {row['floor_ratio']:.2f}x", flush=True)
    props = torch.cuda.get_device_properties(0)
    import cutlass

    return {
        "kind": "read_ceiling", "commit": args.commit or git_commit(),
        "command": "python -m benchmarks.kimi_k3.bench_ceiling " + " ".join(sys.argv[1:]),
        "created": datetime.now(timezone.utc).isoformat(),
        "hardware": {"gpu": props.name, "sms": sms, "driver": driver_version()},
        "software": {"torch": torch.__version__, "nvidia-cutlass-dsl": cutlass.__version__},
        "copy_bandwidth_tb_s": bandwidth / 1e12, "segments_file": str(args.segments),
        "single": single, "chains": chains,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--segments", type=Path, required=True, help="a bench_moe --kernels-out file (weight bytes)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--commit", default=None)
    p.add_argument("--via", default="registers",
                   help="ways in to sweep, comma-separated: registers, cp.async, bulk (stream.VIAS)")
    p.add_argument("--no-chains", action="store_true", help="single launches only")
    args = p.parse_args(argv)
    args.via = tuple(v.strip() for v in args.via.split(","))
    try:
        load_segments(args.segments)
    except SegmentsError as exc:
        print(f"bench_ceiling: {exc}", file=sys.stderr)
        return 2
    try:
        import torch

        from benchmarks.kimi_k3.stream import VIAS
    except ImportError:
        print("bench_ceiling: needs torch and nvidia-cutlass-dsl (pip install -e '.[kernels]')", file=sys.stderr)
        return 2
    if any(v not in VIAS for v in args.via) or "registers" not in args.via:
        print(f"bench_ceiling: --via {','.join(args.via)}: each must be one of {', '.join(VIAS)}, registers among "
              f"them (the block chains read through registers, as the kernels do)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_ceiling: no CUDA GPU here; this benchmark runs on the H200", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(run(args), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
