"""The config for a problem: the cost model's choice (dense) or the grouped layouts' rules."""

from __future__ import annotations

from deepgemm.kernels.sm90_fp8_gemm_1d2d.config import GemmConfig
from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import choose_fp8_gemm_config, make_config
from deepgemm.kernels.sm90_fp8_gemm_1d2d.grouped_heuristics import contiguous_tile, masked_config_m, masked_tile
from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind, GemmProblem


def choose_config(problem: GemmProblem) -> GemmConfig:
    """The heuristic config for a problem (a tuned one, where recorded, is the caller's to pass instead)."""
    p = problem
    if p.kind == GemmKind.DENSE:
        return choose_fp8_gemm_config(p.m, p.n, p.k, p.num_sms, p.out_elem_bytes)
    if p.kind == GemmKind.GROUPED_MASKED:
        rows = masked_config_m(p.m, p.max_m)
        block_m, block_n = masked_tile(p.m, p.max_m, p.groups, p.n, p.k, p.num_sms, p.out_elem_bytes)
    else:
        rows = max(p.m, 1)
        block_m, block_n = contiguous_tile(p.m, p.groups, p.n, p.k, p.num_sms, p.out_elem_bytes)
    return make_config(rows, p.n, p.k, block_m, block_n, p.num_sms, p.out_elem_bytes, balanced_grid=False)
