"""`gatekeeper` command line. Each subcommand lives in gatekeeper/commands/<name>.py and exposes
`register(subparsers)`, which adds its parser and sets `func(args) -> int` as the handler.

Exit codes: 0 pass, 1 fail, 2 usage or input error (always printed as `file:line: reason`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from gatekeeper.errors import InputError

COMMAND_MODULES = ("check", "policy", "collect", "gpu_report", "serve", "audit")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gatekeeper",
        description="Enforce a bounded-review policy on agent-assisted pull requests.",
        epilog="Exit codes: 0 pass, 1 fail, 2 usage or input error.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"gatekeeper.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except InputError as exc:
        print(f"gatekeeper: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
