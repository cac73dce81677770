"""How much of a decode GEMM's time is the measurement's L2 flush, and what is the floor of one call? (one device call)

The benchmark flushes L2 before every sample by zeroing a 256 MiB buffer (as DeepGEMM's harness does). That
leaves L2 full of dirty lines, so the GEMM that follows also pays for writing ~50 MB back to HBM while it streams
its weights. This probe times the same CUDA-graph replays with three flushes:
  zero   the benchmark's flush (dirty L2)
  read   a 256 MiB buffer is read instead (L2 holds clean lines: evicting them costs nothing)
  none   no flush (operands may be L2-resident; and with nothing queued before it, a short GEMM's time also
         holds the host's graph launch: the one-element kernel measured 10.9 µs this way, 4.3 µs after a flush)
and prints µs and GB/s (bytes of A, B, D and scales) for deepgemm and cuBLAS block-wise, plus the floor: a
one-tile GEMM and a one-element torch kernel in the same harness.

Usage: flush_probe.py [MxNxK ...]   (default: the M = 64 shapes of issue 3)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = ["64x2112x7168", "64x24576x1536", "64x32768x512", "64x7168x16384", "64x4096x7168", "64x7168x2048"]
FLOOR_SHAPE = "64x256x128"  # one tile, one K block: the kernel's own floor


def time_graph(fn: Callable[[], Any], flush: Callable[[], Any] | None) -> float:
    """Median µs of a CUDA-graph replay of `fn` (the benchmark's harness), `flush` run before each sample."""
    from deepgemm.bench.timing import bench_gpu

    return bench_gpu(fn, iters=30, warmup=3, flush_l2=flush is not None, flush=flush).median_us


def main() -> None:
    import torch
    import torch.nn.functional as F

    import deepgemm
    from deepgemm.bench.peers import fp8_blockwise_bytes
    from deepgemm.bench.timing import FLUSH_BYTES
    from tests.helpers import random_operands

    shapes = sys.argv[1:] or SHAPES
    buffer = torch.ones(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    flushes: dict[str, Callable[[], Any] | None] = {
        "zero": buffer.zero_,
        "read": lambda: buffer.sum(),
        "none": None,
    }
    tiny = torch.zeros(1, device="cuda")
    print("floor (one-element torch kernel): " + ", ".join(
        f"{name} {time_graph(lambda: tiny.add_(1), flush):.1f} µs" for name, flush in flushes.items()))
    print("| shape | impl | " + " | ".join(f"{name} µs (GB/s)" for name in flushes) + " |")
    print("|---|---|" + "---|" * len(flushes))
    for shape in [FLOOR_SHAPE, *shapes]:
        m, n, k = (int(v) for v in shape.split("x"))
        a, b = random_operands(m, n, k, "cuda", seed=1)
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        nbytes = fp8_blockwise_bytes(m, n, k)
        impls: list[tuple[str, Callable[[], Any]]] = [("deepgemm", lambda: deepgemm.fp8_gemm_nt(a, b, out))]
        if shape != FLOOR_SHAPE:  # (cuBLAS block-wise rejects the one-tile floor shape's scale layout)
            sfa = a[1].t().contiguous().t()
            sfb_t, bt = b[1].t(), b[0].t()
            impls.append(("cublas-blockwise", lambda: F.scaled_mm(
                a[0], bt, sfa, F.ScalingType.BlockWise1x128, sfb_t, F.ScalingType.BlockWise128x128,
                output_dtype=torch.bfloat16)))
        for name, fn in impls:
            cells = []
            for flush in flushes.values():
                us = time_graph(fn, flush)
                cells.append(f"{us:.1f} ({nbytes / us / 1e3:.0f})")
            print(f"| {shape} | {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
