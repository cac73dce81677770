"""Run a few FP8 GEMM and quantization shapes; meant to be run under `compute-sanitizer --tool memcheck`."""

from __future__ import annotations

import torch

import deepgemm
from tests.helpers import random_operands, reference_fp64

SHAPES = [(1, 8, 128), (7, 136, 144), (65, 2056, 7296), (129, 7168, 128), (300, 24, 7168)]
# Forced tiles the shapes above do not reach: (m, n, k, block_m, block_n, sms, split_tail); the split cases
# have a small last wave on `sms` CTAs, so their tails go through the FP32 workspace.
TILES = [(700, 1000, 2048, 192, 128, 30, True), (300, 2112, 7296, 256, 128, 30, True), (4097, 136, 256, 192, 64, 132, False)]


def main() -> None:
    for m, n, k in SHAPES:
        a, b = random_operands(m, n, k, "cuda", seed=m * 7 + n)
        for dtype in (torch.bfloat16, torch.float32):
            out = deepgemm.fp8_gemm_nt(a, b, out_dtype=dtype)
            torch.cuda.synchronize()
            diff = deepgemm.calc_diff(out.double(), reference_fp64(a, b))
            print(f"sanitize m={m} n={n} k={k} {dtype}: calc_diff={diff:.2e}")
            assert diff < 1e-3
    from deepgemm.configs.heuristics import make_config
    from deepgemm.kernels.fp8_gemm import get_plan

    for m, n, k, block_m, block_n, sms, split in TILES:
        a, b = random_operands(m, n, k, "cuda", seed=m + n + k)
        plan = get_plan(0, m, n, k, torch.bfloat16, make_config(m, n, k, block_m, block_n, sms, split_tail=split))
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        plan.launch(a[0], a[1], b[0], b[1], out)
        torch.cuda.synchronize()
        diff = deepgemm.calc_diff(out.double(), reference_fp64(a, b))
        print(f"sanitize m={m} n={n} k={k} {plan.spec.label()} splits={plan.split_count()}: calc_diff={diff:.2e}")
        assert diff < 1e-3 and (plan.split_count() > 1) == split


if __name__ == "__main__":
    main()
