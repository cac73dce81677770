"""Programmatic dependent launch A/B (deepgemm.set_pdl): chains of back-to-back launches captured in one CUDA graph
with PDL off and on, replayed interleaved (L2 flushed before each replay, median of 30); µs per link.

A link is what a decode layer runs per weight: `pair`, the public quantize + FP8 GEMM (two kernels), or `gemm`, the
FP8 GEMM alone on one quantized activation (each link writes its own output). Outputs of both modes are compared
bitwise and against float64. The gap PDL can hide is each launch's start-up behind the previous kernel's tail, so the
ratio is largest where kernels are short.

  python dev/pdl_ab.py [--links 8] [MxNxK ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.helpers, dev.*

DEFAULT_SHAPES = ["1x2112x7168", "64x2112x7168", "64x4096x7168", "64x7168x2048", "64x24576x1536", "128x7168x16384",
                  "512x4096x7168"]


def chain(kind: str, shape: str, links: int) -> tuple[float, float]:
    """(µs per link with PDL off, with PDL on) for `links` links of `kind` at `shape`; exits on a wrong result."""
    import torch

    import deepgemm
    from deepgemm.tuning.timing import bench_gpu_interleaved
    from tests.helpers import reference_fp64

    m, n, k = (int(v) for v in shape.split("x"))
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    weights = [deepgemm.quantize_per_block(torch.randn(n, k, device="cuda").to(torch.bfloat16)) for _ in range(links)]
    a = deepgemm.quantize_per_token_group(x)
    outs = {mode: [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(links)]
            for mode in (False, True)}

    def run(mode: bool) -> None:
        deepgemm.set_pdl(mode)
        try:
            for w, out in zip(weights, outs[mode]):
                deepgemm.fp8_gemm_nt(deepgemm.quantize_per_token_group(x) if kind == "pair" else a, w, out)
        finally:
            deepgemm.set_pdl(False)

    off, on = bench_gpu_interleaved([lambda: run(False), lambda: run(True)])
    torch.cuda.synchronize()
    if not off.graph or not on.graph:
        raise SystemExit(f"{kind} {shape}: not captured in a CUDA graph")
    for w, plain, programmatic in zip(weights, outs[False], outs[True]):
        if not torch.equal(plain, programmatic):
            raise SystemExit(f"{kind} {shape}: PDL changed the output")
        diff = deepgemm.calc_diff(programmatic, reference_fp64(a, w))
        if diff > 1e-4:
            raise SystemExit(f"{kind} {shape}: calc_diff {diff:.1e} against float64")
    return off.median_us / links, on.median_us / links


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shapes", nargs="*", default=DEFAULT_SHAPES)
    parser.add_argument("--links", type=int, default=8, help="links per captured chain")
    args = parser.parse_args()
    print(f"| link | M×N×K | µs per link, PDL off | PDL on | on / off |  ({args.links} links per graph)")
    print("|---|---|---|---|---|")
    for kind in ("pair", "gemm"):
        for shape in args.shapes:
            off, on = chain(kind, shape, args.links)
            print(f"| {kind} | {shape} | {off:.2f} | {on:.2f} | {on / off:.3f} |", flush=True)


if __name__ == "__main__":
    main()
