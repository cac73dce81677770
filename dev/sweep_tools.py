"""Pieces the sweep scripts share: building a set of kernels ahead of a device call, and the M x (N, K) grid arguments."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def build_kernels(specs: Iterable[Any], print_each: bool = False) -> list[Any]:
    """Compile (or fetch from DEEPGEMM_CACHE_DIR) each distinct Fp8GemmSpec, eight at a time, without a GPU; report
    every build that spills or has a stack frame (every build with `print_each`). Returns the distinct specs."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import compile_spec

    distinct = list(dict.fromkeys(specs))
    with ThreadPoolExecutor(8) as pool:
        for spec, built in zip(distinct, pool.map(compile_spec, distinct)):
            res = built.resources
            spilled = res is not None and (res.spill_stores or res.stack_frame)
            if spilled or print_each:
                print(f"{spec.label()}: {'SPILLS ' if spilled else ''}{res}")
    return distinct


def add_shape_grid(parser: argparse.ArgumentParser, default_m: Sequence[int]) -> None:
    """--m (comma-separated M values) and --nk (comma-separated NxK pairs, default the DeepSeek-V3 ones)."""
    from deepgemm.bench.suites import DEEPSEEK_V3_NK

    parser.add_argument("--m", default=",".join(map(str, default_m)))
    parser.add_argument("--nk", default=",".join(f"{n}x{k}" for n, k in DEEPSEEK_V3_NK))


def shape_grid(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    """(M, N, K) for every --nk pair and --m value, N and K outermost."""
    pairs = [tuple(int(v) for v in pair.split("x")) for pair in args.nk.split(",")]
    return [(m, n, k) for n, k in pairs for m in map(int, args.m.split(","))]
