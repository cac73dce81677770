"""`deepgemm tune --shape M,N,K`: measure candidate tile choices on this GPU and record the fastest."""

from __future__ import annotations

import argparse
from typing import Any

from deepgemm.api.backend import supported
from deepgemm.commands.compile import parse_shape
from deepgemm.tuning.tuner import tune_fp8_gemm_nt


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("tune", help="autotune FP8 GEMM shapes on this GPU (results persist in the cache dir)")
    parser.add_argument("--shape", type=parse_shape, action="append", required=True, metavar="M,N,K",
                        help="GEMM shape; repeat for several")
    parser.add_argument("--out-dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--top", type=int, default=6, help="cost-model candidates to measure (each also with a 2-CTA cluster)")
    parser.add_argument("--iters", type=int, default=20, help="timed samples per candidate")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    import torch

    if not supported():
        print("deepgemm tune: needs an sm_90 (Hopper) GPU; without one the cost model chooses configs "
              "(see `deepgemm compile`)", file=sys.stderr)
        return 1
    out_dtype = torch.float32 if args.out_dtype == "fp32" else torch.bfloat16
    for m, n, k in args.shape:
        result = tune_fp8_gemm_nt(m, n, k, out_dtype=out_dtype, top=args.top, iters=args.iters)
        print(f"shape M={m} N={n} K={k}:")
        for config, us in result.timings_us:
            marker = "*" if config == result.best else " "
            print(f" {marker} {config.label():48s} {us:9.1f} us {2 * m * n * k / us / 1e6:8.0f} TFLOPS")
        print(f"  recorded {result.best.label()} in {result.db_path}")
    return 0
