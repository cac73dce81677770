"""The ``deepgemm`` command line: one entry point, one module per subcommand.

Each subcommand lives in ``deepgemm.commands.<name>`` and exposes
``register(subparsers)`` which adds its parser and sets ``func`` to a callable
taking the parsed namespace and returning an exit code.

A reader that closes the output early (``deepgemm bench | head``) ends the command quietly with exit code 141
(128 + SIGPIPE, what a shell reports for a command killed by a closed pipe), never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from importlib import metadata

import deepgemm

SUBCOMMANDS: tuple[str, ...] = ("compile", "precompile", "tune", "shapes", "bench", "report")
BROKEN_PIPE_EXIT = 141  # 128 + SIGPIPE


def version() -> str:
    """The installed distribution's version, else the package's ``__version__`` (a source tree on sys.path)."""
    try:
        return metadata.version("deepgemm")
    except metadata.PackageNotFoundError:
        return str(getattr(deepgemm, "__version__", "unknown"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepgemm", description="Hopper FP8/BF16 GEMM kernels: compile, analyse, benchmark.")
    parser.add_argument("--version", action="version", version=f"deepgemm {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"deepgemm.commands.{name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _run(argv)
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE_EXIT


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit:  # --help, --version, a usage error: what argparse printed must reach the reader here
        sys.stdout.flush()
        raise
    try:
        status = int(args.func(args) or 0)
    except (ValueError, TypeError) as exc:
        print(f"deepgemm {args.command}: error: {exc}", file=sys.stderr)
        status = 2
    sys.stdout.flush()  # a closed pipe shows here rather than at interpreter exit
    return status


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit cannot fail on the closed pipe again (the
    recipe of Python's signal module documentation)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    raise SystemExit(main())
