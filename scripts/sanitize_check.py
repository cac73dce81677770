"""Run a few FP8 GEMM and quantization shapes; meant to be run under `compute-sanitizer --tool memcheck`."""

from __future__ import annotations

import torch

import deepgemm
from tests.helpers import random_operands, reference_fp64

SHAPES = [(1, 8, 128), (7, 136, 144), (65, 2056, 7296), (129, 7168, 128), (300, 24, 7168)]


def main() -> None:
    for m, n, k in SHAPES:
        a, b = random_operands(m, n, k, "cuda", seed=m * 7 + n)
        for dtype in (torch.bfloat16, torch.float32):
            out = deepgemm.fp8_gemm_nt(a, b, out_dtype=dtype)
            torch.cuda.synchronize()
            diff = deepgemm.calc_diff(out.double(), reference_fp64(a, b))
            print(f"sanitize m={m} n={n} k={k} {dtype}: calc_diff={diff:.2e}")
            assert diff < 1e-3


if __name__ == "__main__":
    main()
