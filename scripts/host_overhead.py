"""Host (CPU) time per warm eager call: deepgemm.fp8_gemm_nt vs torch's block-wise scaled_mm.

A tiny shape keeps the GPU ahead of the CPU, so the loop measures launch-path cost, not kernel time.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import deepgemm
from tests.helpers import random_operands


def per_call_us(fn, calls: int = 3000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def main() -> None:
    m, n, k = 16, 512, 512
    a, b = random_operands(m, n, k, "cuda", seed=1)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    ours = per_call_us(lambda: deepgemm.fp8_gemm_nt(a, b, out))
    ours_alloc = per_call_us(lambda: deepgemm.fp8_gemm_nt(a, b))
    sfa_cublas = a[1].t().contiguous().t()
    sfb_t = b[1].t()
    bt = b[0].t()
    cublas = per_call_us(lambda: F.scaled_mm(a[0], bt, sfa_cublas, F.ScalingType.BlockWise1x128, sfb_t,
                                             F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16))
    print(f"host_us fp8_gemm_nt(out=) {ours:.2f} | fp8_gemm_nt(alloc) {ours_alloc:.2f} | torch scaled_mm blockwise {cublas:.2f}")


if __name__ == "__main__":
    main()
