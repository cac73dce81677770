"""`deepgemm tune --shape M,N,K [--dtype bf16 --layout L]`: measure candidate tile choices on this GPU and record the
fastest."""

from __future__ import annotations

import argparse
from typing import Any

from deepgemm.api.backend import supported
from deepgemm.commands.compile import parse_shape
from deepgemm.tuning.bf16_tuner import tune_bf16_gemm
from deepgemm.tuning.tuner import tune_fp8_gemm_nt


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("tune", help="autotune GEMM shapes on this GPU (results persist in the cache dir)")
    parser.add_argument("--shape", type=parse_shape, action="append", required=True, metavar="M,N,K",
                        help="GEMM shape; repeat for several")
    parser.add_argument("--out-dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--dtype", choices=["fp8", "bf16"], default="fp8",
                        help="fp8: fp8_gemm_nt (default); bf16: bf16_gemm_<layout>")
    parser.add_argument("--layout", choices=["nt", "nn", "tn", "tt"], default="nt", help="with --dtype bf16")
    parser.add_argument("--top", type=int, default=None,
                        help="cost-model candidates to measure (default 6 for FP8, each also with a 2-CTA cluster and "
                             "tail variants; 8 for BF16)")
    parser.add_argument("--iters", type=int, default=20, help="timed samples per candidate")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    import torch

    if args.dtype == "fp8" and args.layout != "nt":
        print("deepgemm tune: --layout is for --dtype bf16 (the FP8 GEMM is NT)", file=sys.stderr)
        return 2
    if not supported():
        print("deepgemm tune: needs an sm_90 (Hopper) GPU; without one the cost model chooses configs "
              "(see `deepgemm compile`)", file=sys.stderr)
        return 1
    out_dtype = torch.float32 if args.out_dtype == "fp32" else torch.bfloat16
    for m, n, k in args.shape:
        if args.dtype == "bf16":
            bf16 = tune_bf16_gemm(args.layout, m, n, k, out_dtype=out_dtype, top=args.top or 8, iters=args.iters)
            _report(m, n, k, [(c.label(), us, c == bf16.best) for c, us in bf16.timings_us], bf16.best.label(),
                    bf16.db_path, [(c.label(), diff) for c, diff in bf16.rejected])
        else:
            fp8 = tune_fp8_gemm_nt(m, n, k, out_dtype=out_dtype, top=args.top or 6, iters=args.iters)
            _report(m, n, k, [(c.label(), us, c == fp8.best) for c, us in fp8.timings_us], fp8.best.label(),
                    fp8.db_path, [(c.label(), diff) for c, diff in fp8.rejected])
    return 0


def _report(m: int, n: int, k: int, rows: list[tuple[str, float, bool]], best: str, db_path: str,
            rejected: list[tuple[str, float]]) -> None:
    print(f"shape M={m} N={n} K={k}:")
    for label, us, is_best in rows:
        print(f" {'*' if is_best else ' '} {label:48s} {us:9.1f} us {2 * m * n * k / us / 1e6:8.0f} TFLOPS")
    for label, diff in rejected:
        print(f"   {label:48s} left out: wrong output (calc_diff {diff:.2e} against the float32 product)")
    print(f"  recorded {best} in {db_path}")
