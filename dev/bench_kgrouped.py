"""K-grouped FP8 GEMM (expert Wgrad, 1D1D) benchmark: CUDA-graph replay, L2 flushed, median of 30.

Cases: DeepSeek-V3-like expert weight gradients, tokens per expert 0.7-1.3x the expected count rounded
to 128, D = C + A^T B accumulated in place (FP32). Also times one dense-equivalent: the same FLOPs as a
single fp8_gemm_nt is not comparable (1D2D), so only TFLOPS are reported.
"""

from __future__ import annotations

import random

import torch

import deepgemm
from deepgemm.tuning.timing import bench_gpu

CASES = [(4, 8192, 4096, 7168), (8, 4096, 4096, 7168), (4, 8192, 7168, 2048), (8, 4096, 7168, 2048)]


def group_tokens(groups: int, tokens: int, rng: random.Random) -> list[int]:
    """Tokens per expert: 0.7-1.3x `tokens`, rounded to a multiple of 128 (at least 128)."""
    return [128 * max(1, round(tokens * rng.uniform(0.7, 1.3) / 128)) for _ in range(groups)]


def fp8_operands(m: int, n: int, k_total: int) -> tuple:
    """A [M, K_total] and B [N, K_total] quantized per 1 x 128 token group (the Wgrad operands)."""
    a = deepgemm.quantize_per_token_group(torch.randn(m, k_total, device="cuda", dtype=torch.bfloat16))
    b = deepgemm.quantize_per_token_group(torch.randn(n, k_total, device="cuda", dtype=torch.bfloat16))
    return a, b


def main() -> None:
    rng = random.Random(0)
    print("| case (G x ~tokens, M x N) | us | TFLOPS | GB/s |")
    print("|---|---|---|---|")
    for groups, tokens, m, n in CASES:
        ks = group_tokens(groups, tokens, rng)
        k_total = sum(ks)
        a, b = fp8_operands(m, n, k_total)
        out = torch.randn(groups, m, n, device="cuda")
        t = bench_gpu(lambda: deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, out, ks, c=out))
        flops = 2 * m * n * k_total
        moved = (m + n) * k_total + (m + n) * k_total // 128 * 4 + 2 * groups * m * n * 4
        print(f"| {groups} x ~{tokens}, {m} x {n} | {t.median_us:.1f} | {flops / t.median_us / 1e6:.0f} | "
              f"{moved / t.median_us / 1e3:.0f} |")


if __name__ == "__main__":
    main()
