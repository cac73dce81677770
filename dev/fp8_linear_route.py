"""Where Fp8Linear (quantize + FP8 GEMM) beats a BF16 matmul of the same weight: the data behind
deepgemm.api.backend.FP8_LINEAR_MIN_WEIGHT_ELEMENTS. Prints one Markdown row per (M, N, K)."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

import deepgemm
from deepgemm.nn import Fp8Linear
from deepgemm.tuning.timing import bench_gpu_interleaved

SHAPES = [(n, k) for n in (256, 1024, 2048, 4096) for k in (256, 1024, 2048, 4096)] + [(8192, 8192)]
TOKENS = (1, 64, 4096)


def main() -> None:
    torch.manual_seed(0)
    with ThreadPoolExecutor(max_workers=16) as pool:  # compiles run out of process, in parallel
        list(pool.map(lambda shape: deepgemm.precompile_fp8_gemm_nt(*shape),
                      [(m, n, k) for m in TOKENS for n, k in SHAPES]))
    print("| M | N | K | Fp8Linear µs | of which quantize µs | BF16 nn.Linear µs | BF16 / FP8 |")
    print("|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        for n, k in SHAPES:
            linear = nn.Linear(k, n, bias=False, dtype=torch.bfloat16, device="cuda")
            fp8 = Fp8Linear.from_linear(linear)
            fp8.route = "fp8"  # time the kernel path even where the rule routes it away
            for m in TOKENS:
                x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
                t_fp8, t_quant, t_bf16 = bench_gpu_interleaved(
                    [lambda: fp8(x), lambda: deepgemm.quantize_per_token_group(x), lambda: linear(x)], iters=30)
                print(f"| {m} | {n} | {k} | {t_fp8.median_us:.1f} | {t_quant.median_us:.1f} | "
                      f"{t_bf16.median_us:.1f} | {t_bf16.median_us / t_fp8.median_us:.2f} |")
                sys.stdout.flush()

if __name__ == "__main__":
    main()
