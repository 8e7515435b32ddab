"""`gatekeeper collect`: run the tests under coverage and the guard probes, and write the evidence JSON.

Exit 0 once the evidence is written, whatever the tests did: judging them is `gatekeeper check`'s job.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from gatekeeper.collect import collect
from gatekeeper.errors import InputError
from gatekeeper.policy import load_policy


def register(subparsers) -> None:
    parser = subparsers.add_parser("collect", help="run tests under coverage and the guard probes; write evidence JSON",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--policy", required=True, help="policy YAML (read it from the base branch)")
    parser.add_argument("--base", required=True, help="the base ref or SHA of the pull request")
    parser.add_argument("--repo", default=".", help="the repository checked out at the PR head (default: .)")
    parser.add_argument("--out", required=True, help="where to write the evidence JSON")
    parser.add_argument("--perf", action="append", default=[], metavar="FILE",
                        help="perf evidence produced by this CI (e.g. a GPU job's artifact); repeatable")
    parser.set_defaults(func=_run)


def _run(args) -> int:
    console = Console(stderr=True)
    repo = Path(args.repo)
    if not (repo / ".git").exists():
        raise InputError(str(repo), "not a git repository (the collector runs in a checkout of the PR head)")
    evidence = collect(load_policy(args.policy), repo, args.base, tuple(Path(p) for p in args.perf), console)
    out = Path(args.out)
    try:
        out.write_text(evidence.model_dump_json(indent=1), encoding="utf-8")
    except OSError as exc:
        raise InputError(str(out), f"cannot write evidence: {exc.strerror or exc}") from None
    console.print(f"wrote {out}")
    return 0
