"""The ``deepgemm`` command line: one entry point, one module per subcommand.

Each subcommand lives in ``deepgemm.commands.<name>`` and exposes
``register(subparsers)`` which adds its parser and sets ``func`` to a callable
taking the parsed namespace and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

SUBCOMMANDS: tuple[str, ...] = ("compile", "precompile", "tune", "shapes", "bench", "report")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepgemm", description="Hopper FP8/BF16 GEMM kernels: compile, analyse, benchmark.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"deepgemm.commands.{name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError) as exc:
        print(f"deepgemm {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
