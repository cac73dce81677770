"""The timing harness's floor: what `deepgemm bench` measures for work that is (almost) nothing, so the decode rows'
fixed part can be told from the part any kernel can shorten.

Times, with the bench's method (CUDA-graph replay between events, L2 flushed by zeroing 256 MiB before each sample,
median of 30; deepgemm/tuning/timing.py): an empty kernel of one CTA and of 132 CTAs, with three scalar parameters
and with ten 128-byte structs (the size of a GEMM's parameter block of TMA descriptors), a one-element torch add,
device copies of 1 / 16 / 64 MiB, and the public fp8_gemm_nt at decode shapes; each also without the flush. A
decode GEMM's time minus the empty kernel's is what its kernel can still win or lose.

  python dev/harness_floor.py [MxNxK ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.helpers, dev.*

DEFAULT_SHAPES = ["1x256x7168", "64x2112x7168", "64x7168x2048", "64x4096x7168"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shapes", nargs="*", default=DEFAULT_SHAPES)
    args = parser.parse_args()

    import torch

    import deepgemm
    import ctypes

    from deepgemm.jit.args import U32, U64, PackedArgs
    from deepgemm.jit.compiler import KernelSource
    from deepgemm.jit.runtime import current_raw_stream, launch_on_device
    from deepgemm.kernels.common.loader import load_kernel
    from deepgemm.tuning.timing import bench_gpu
    from dev.host_overhead import EMPTY_KERNELS
    from tests.helpers import random_operands

    empty = load_kernel(KernelSource(EMPTY_KERNELS, "small_params", "host probe small_params"), 0, 0)
    empty_args = PackedArgs([U64(0), U32(0), ctypes.c_float(0.0)])
    # ten 128-byte structs: a GEMM's parameter block of TMA descriptors (does its size cost GPU time per launch?)
    large = load_kernel(KernelSource(EMPTY_KERNELS, "large_params", "host probe large_params"), 0, 0)
    large_args = PackedArgs([bytes(128)] * 10 + [U64(0), U32(0)])

    def launch_empty(ctas: int, kernel=empty, args=empty_args):  # noqa: ANN001, ANN202
        def run() -> None:
            stream = current_raw_stream(0)
            launch_on_device(kernel, 0, stream, kernel.launch_config(0, stream, ctas, 128), args.address)
        return run

    cases: list[tuple[str, object, int]] = [("empty kernel, 1 CTA", launch_empty(1), 0),
                                            ("empty kernel, 132 CTAs", launch_empty(132), 0)]
    for ctas in (1, 132):
        cases.append((f"empty kernel, {large_args.nbytes} B of parameters, {ctas} CTAs",
                      launch_empty(ctas, large, large_args), 0))
    one = torch.ones(1, device="cuda")
    cases.append(("torch add_, one element", lambda: one.add_(1), 0))
    for mib in (1, 16, 64):
        src = torch.ones(mib << 18, device="cuda")
        dst = torch.empty_like(src)
        cases.append((f"copy {mib} MiB", lambda s=src, d=dst: d.copy_(s), 2 * (mib << 20)))
    for shape in args.shapes:
        m, n, k = (int(v) for v in shape.split("x"))
        a, b = random_operands(m, n, k, "cuda", seed=1)
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        cases.append((f"fp8_gemm_nt {shape}", lambda a=a, b=b, out=out: deepgemm.fp8_gemm_nt(a, b, out),
                      m * k + n * k + 2 * m * n))
    print("| work | µs, L2 flushed | µs, not flushed | GB/s (flushed) |")
    print("|---|---|---|---|")
    for name, fn, nbytes in cases:
        flushed = bench_gpu(fn).median_us
        warm = bench_gpu(fn, flush_l2=False).median_us
        rate = f"{nbytes / flushed / 1e3:.0f}" if nbytes else ""
        print(f"| {name} | {flushed:.2f} | {warm:.2f} | {rate} |", flush=True)


if __name__ == "__main__":
    main()
