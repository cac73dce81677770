"""`deepgemm compile --shape M,N,K`: build the kernel a shape would use and show its config and resources."""

from __future__ import annotations

import argparse
import dataclasses
import textwrap
from typing import Any

from deepgemm.analysis.gpus import DEFAULT_GPU
from deepgemm.api.gemm import precompile_fp8_gemm_nt
from deepgemm.bench.console import TABLE_WIDTH, usage_error
from deepgemm.commands.arguments import positive_int
from deepgemm.commands.precompile import HOPPER_GPUS, planning_target


def parse_shape(text: str) -> tuple[int, int, int]:
    parts = text.replace("x", ",").split(",")
    try:
        m, n, k = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape must be M,N,K with three positive integers, got {text!r}") from None
    if min(m, n, k) <= 0:
        raise argparse.ArgumentTypeError(f"--shape must be M,N,K with three positive integers, got {text!r}")
    return m, n, k


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("compile", help="compile the kernel a GEMM shape would use (no GPU needed)")
    parser.add_argument("--shape", type=parse_shape, action="append", required=True, metavar="M,N,K",
                        help="GEMM shape; repeat for several")
    parser.add_argument("--dtype", choices=["fp8"], default="fp8", help="operand type (fp8: e4m3 with 1x128/128x128 scales)")
    parser.add_argument("--out-dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--gpu", help=f"GPU to plan for, its SM count and tuned table ({', '.join(HOPPER_GPUS)}); "
                                      f"default: the local GPU, else {DEFAULT_GPU}")
    parser.add_argument("--num-sms", type=positive_int, default=None, metavar="N",
                        help="SMs to plan for, 1 to the GPU's count (default: the GPU's)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    try:
        target = planning_target(args.gpu, args.num_sms)
    except ValueError as exc:
        return usage_error("compile", str(exc))
    out_dtype = torch.float32 if args.out_dtype == "fp32" else torch.bfloat16
    print(f"planning for {target.gpu_name or 'the cost model'} ({target.num_sms} SMs)")
    for m, n, k in args.shape:
        info = precompile_fp8_gemm_nt(m, n, k, out_dtype=out_dtype, num_sms=target.num_sms, gpu=target.gpu_name)
        config = dataclasses.asdict(info.config)
        print(f"shape M={m} N={n} K={k}: {info.label}")
        print("\n".join(textwrap.wrap(", ".join(f"{key}={value}" for key, value in config.items()), TABLE_WIDTH,
                                     initial_indent="  config: ", subsequent_indent=" " * 10)))
        r = info.resources
        if r is None:
            print("  ptxas: resource report unavailable")
        else:
            print(f"  ptxas: {r.registers} registers, {r.spill_stores} spill stores, {r.spill_loads} spill loads, "
                  f"{r.stack_frame} bytes stack frame; dynamic smem {info.config.smem_bytes} bytes")
        if info.cached:
            print(f"  from cache ({info.compile_seconds:.2f} s) -> {info.cubin_path}")
        else:
            print(f"  compiled in {info.compile_seconds:.2f} s -> {info.cubin_path}")
    return 0
