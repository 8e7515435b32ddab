"""Placeholder until its issue lands: the subcommand exists and says so, it never pretends to work."""

import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser("collect", help="(not implemented yet)")
    parser.set_defaults(func=_run)


def _run(args) -> int:
    print("gatekeeper collect: not implemented yet", file=sys.stderr)
    return 2
