"""What the benches of one kernel alone (bench_mla, bench_dense) share: their common arguments, the error a failed
correctness check raises, and the run around their measurements (commit, hardware, seed, the PerfEvidence file,
the exit status)."""

from __future__ import annotations

import argparse
import secrets
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable


class BenchError(RuntimeError):
    """A run that cannot give trustworthy numbers (a failed correctness check)."""


def max_token_error(got, want, where: str, tolerance: float, reference: str) -> float:
    """The largest rel err over the token rows of got (a poisoned-then-written output) against want; BenchError at
    the first row that holds a NaN or Inf (not written) or lies further than tolerance from `reference`."""
    import torch

    from kimi_k3_path.reference import rel_err

    worst = 0.0
    for t in range(got.shape[0]):
        row = got[t].double()
        if not torch.isfinite(row).all():
            raise BenchError(f"{where}: token {t} holds NaN or Inf (the output was poisoned with NaN: a row was not "
                             "written)")
        err = rel_err(row, want[t].double())
        if err > tolerance:
            raise BenchError(f"{where}: token {t}: rel err {err:.2e} > {tolerance:g} against {reference}")
        worst = max(worst, err)
    return worst


def add_arguments(p: argparse.ArgumentParser) -> None:
    """--tp, --batch, --replays, --out, --commit, --seed."""
    from benchmarks.kimi_k3.bench import _int_list

    p.add_argument("--tp", type=_int_list, default=(8, 16), help="comma list; the support matrix's TPs")
    p.add_argument("--batch", type=_int_list, default=(1, 8, 64), help="decode batches M (comma list)")
    p.add_argument("--replays", type=int, default=100, help="timed CUDA graph replays per variant")
    p.add_argument("--out", type=Path, required=True, help="write the PerfEvidence JSON here")
    p.add_argument("--commit", help="the commit measured (default: git rev-parse HEAD)")
    p.add_argument("--seed", type=int, help="random inputs' seed (default: a fresh one, printed and noted)")


def parse(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """p's arguments, the common ones checked against the support matrix (argparse errors), a fresh seed unless given
    and the command line that reruns it (args.command)."""
    from kimi_k3_path.support import SUPPORT_MATRIX

    args = p.parse_args(argv)
    if bad := [tp for tp in args.tp if tp not in SUPPORT_MATRIX.tp]:
        p.error(f"--tp {bad}: the support matrix admits {', '.join(map(str, SUPPORT_MATRIX.tp))}")
    if bad := [m for m in args.batch if not 1 <= m <= SUPPORT_MATRIX.max_batch]:
        p.error(f"--batch {bad}: the decode path takes 1..{SUPPORT_MATRIX.max_batch} sequences")
    if args.replays < 1:
        p.error(f"--replays {args.replays} must be at least 1")
    if args.seed is None:
        args.seed = secrets.randbits(31)
    args.command = " ".join([f"python -m {p.prog.removeprefix('python -m ')}",
                             *(sys.argv[1:] if argv is None else argv)])
    return args


# measure(args, arch, gen) -> the PerfEvidence rows, printing its table as it goes
Measure = Callable[[argparse.Namespace, str, Any], list]


def main(prog: str, args: argparse.Namespace, measure: Measure) -> int:
    """Exit status: 0 with the evidence written to args.out, 1 when a check or the harness failed, 2 without a GPU."""
    import torch

    from benchmarks.kimi_k3.bench import BenchError as HarnessError  # e.g. no git to name the commit

    if not torch.cuda.is_available():
        print(f"{prog}: no CUDA GPU here; this benchmark runs on the H200", file=sys.stderr)
        return 2
    try:
        evidence = run(args, measure)
    except (BenchError, HarnessError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(evidence.model_dump_json(indent=2) + "\n")
    print(f"wrote {len(evidence.rows)} rows to {args.out}")
    return 0


def run(args: argparse.Namespace, measure: Measure) -> Any:
    """The PerfEvidence of one run: measure's rows with the commit (args.commit or HEAD), hardware and software,
    from inputs drawn with args.seed."""
    import cutlass
    import torch

    from benchmarks.kimi_k3.bench import current_commit, hardware, software
    from gatekeeper.evidence import PerfEvidence

    hw = hardware("cuda")
    commit, created = current_commit(args.commit), datetime.now(timezone.utc)
    print(f"seed {args.seed} (replay with --seed {args.seed})", flush=True)
    rows = measure(args, hw["arch"], torch.Generator(device="cuda").manual_seed(args.seed))
    return PerfEvidence(commit=commit, command=args.command, created=created, hardware=hw,
                        software={**software(), "nvidia-cutlass-dsl": cutlass.__version__}, rows=tuple(rows))
