"""FP8 GEMM with 1x128 (A) and 128x128 (B) scales: dense, contiguous/psum and masked grouped (impls/sm90_fp8_gemm_1d2d.cuh).

config (frozen GemmConfig) <- heuristics (choose_config over a frozen GemmProblem: cost_model, grouped_heuristics,
with the host mirrors smem and schedule) -> spec (template arguments, source, compile) -> plan (kernel, grid, packed
arguments, caches).
"""
