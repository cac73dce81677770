"""Minimal 18-shape table (deepgemm vs cuBLAS block-wise), used until `deepgemm bench` is available."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import deepgemm
from tests.helpers import random_operands

NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


def time_us(fn, iters: int = 30) -> float:
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(iters + 3):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times[3:])[iters // 2]


def main() -> None:
    print(f"{'M':>5} {'N':>6} {'K':>6} | {'ours us':>8} {'TFLOPS':>7} {'GB/s':>6} | {'cuBLAS us':>9} {'TFLOPS':>7} | speedup")
    for m in (64, 128, 4096):
        for n, k in NK:
            a, b = random_operands(m, n, k, "cuda", seed=m + n + k)
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            ours = time_us(lambda: deepgemm.fp8_gemm_nt(a, b, out))
            sfa = a[1].t().contiguous().t()
            theirs = time_us(lambda: F.scaled_mm(a[0], b[0].t(), sfa, F.ScalingType.BlockWise1x128, b[1].t(),
                                                 F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16))
            flops = 2 * m * n * k
            nbytes = m * k + n * k + 2 * m * n + 4 * (m * k // 128 + n * k // 16384)
            print(f"{m:>5} {n:>6} {k:>6} | {ours:8.1f} {flops / ours / 1e6:7.0f} {nbytes / ours / 1e3:6.0f} | "
                  f"{theirs:9.1f} {flops / theirs / 1e6:7.0f} | {theirs / ours:5.2f}x")


if __name__ == "__main__":
    main()
