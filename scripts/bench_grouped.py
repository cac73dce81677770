"""Grouped FP8 GEMM benchmark on the issue-5 cases (CUDA-graph replay, L2 flushed, median of 30).

Token counts per expert are drawn uniformly in 0.7-1.3x the expected value; FLOPs count valid rows
only; GB/s counts A and D on valid rows plus the weights of every expert that has rows.
"""

from __future__ import annotations

import random
import sys

import torch

import deepgemm
from deepgemm.bench.timing import bench_gpu
from tests.helpers import random_activations, random_grouped_weights

CONTIGUOUS = [(4, 8192, 4096, 7168, 1340), (4, 8192, 7168, 2048, 1190), (8, 4096, 4096, 7168, 1320), (8, 4096, 7168, 2048, 1190)]
MASKED = [(1, 1024, 4096, 4096, 7168, "1050 TFLOPS"), (2, 512, 4096, 4096, 7168, "652 TFLOPS"),
          (4, 256, 4096, 4096, 7168, "669 TFLOPS"), (1, 1024, 4096, 7168, 2048, "574 TFLOPS"),
          (2, 512, 4096, 7168, 2048, "786 TFLOPS"), (4, 256, 4096, 7168, 2048, "620 TFLOPS"),
          (32, 16, 128, 4096, 7168, "3620 GB/s"), (256, 8, 128, 2048, 7168, "3920 GB/s"),
          (64, 32, 128, 7168, 2048, "3650 GB/s"), (8, 64, 128, 4096, 7168, "2520 GB/s")]


def counts_for(groups: int, expected: int, rng: random.Random, cap: int | None = None) -> list[int]:
    return [min(cap or 1 << 30, max(1, round(expected * rng.uniform(0.7, 1.3)))) for _ in range(groups)]


def contiguous_row(label: str, groups: int, counts: list[int], n: int, k: int, theirs: int) -> str:
    indices = sum(([g] * c + [-1] * (-(-c // 128) * 128 - c) for g, c in enumerate(counts)), [])
    m_indices = torch.tensor(indices, dtype=torch.int32, device="cuda")
    a = random_activations(len(indices), k, "cuda", 1)
    b = random_grouped_weights(groups, n, k, "cuda", 2)
    out = torch.empty(len(indices), n, dtype=torch.bfloat16, device="cuda")
    t = bench_gpu(lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices))
    valid = sum(counts)
    flops = 2 * valid * n * k
    nbytes = valid * k + groups * n * k + valid * n * 2
    return (f"| {label} | {t.median_us:.1f} | {flops / t.median_us / 1e6:.0f} | "
            f"{nbytes / t.median_us / 1e3:.0f} | {theirs} TFLOPS |")


def masked_row(label: str, groups: int, expected: int, max_m: int, counts: list[int], n: int, k: int, theirs: str) -> str:
    a2d = random_activations(groups * max_m, k, "cuda", 3)
    a = (a2d[0].view(groups, max_m, k), a2d[1].reshape(groups, max_m, -1))
    b = random_grouped_weights(groups, n, k, "cuda", 4)
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    out = torch.empty(groups, max_m, n, dtype=torch.bfloat16, device="cuda")
    t = bench_gpu(lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected))
    valid = sum(counts)
    flops = 2 * valid * n * k
    nbytes = valid * k + groups * n * k + valid * n * 2
    return (f"| {label} | {t.median_us:.1f} | {flops / t.median_us / 1e6:.0f} | {nbytes / t.median_us / 1e3:.0f} | "
            f"{theirs} |")


def main() -> None:
    # Optional argument: run only the cases whose label contains it (token counts are drawn for every case,
    # so a case measures the same counts with or without the filter).
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    rng = random.Random(0)
    print("| case | us | TFLOPS | GB/s | DeepGEMM |")
    print("|---|---|---|---|---|")
    # Each case's tensors are freed and torch's cached segments returned before the next case, so every case
    # runs on freshly mapped memory, as it would alone: carved out of the previous case's freed segments, the
    # masked 64 x ~32 case measured 270 us instead of 250 with the zeroing L2 flush (249 alone, 244 with a
    # reading flush in both placements; docs/perf-notes.md, session 13).
    for groups, expected, n, k, theirs in CONTIGUOUS:
        counts = counts_for(groups, expected, rng)
        label = f"contiguous {groups}x~{expected} N={n} K={k}"
        if only in label:
            print(contiguous_row(label, groups, counts, n, k, theirs), flush=True)
            torch.cuda.empty_cache()
    for groups, expected, max_m, n, k, theirs in MASKED:
        counts = counts_for(groups, expected, rng, cap=max_m)
        label = f"masked {groups}x~{expected} (max_m {max_m}) N={n} K={k}"
        if only in label:
            print(masked_row(label, groups, expected, max_m, counts, n, k, theirs), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
