"""The BF16 cost model's L2 term: tiles' operand reads over all SMs, charged on grids that fill every SM."""

from __future__ import annotations

import pytest
import torch

from deepgemm.kernels.common.kind import GemmKind
from deepgemm.kernels.sm90_bf16_gemm import cost_model
from deepgemm.kernels.sm90_bf16_gemm.cost_model import choose_config, estimate_seconds
from deepgemm.kernels.sm90_bf16_gemm.plan import Bf16Geometry, bf16_problem, grouped_problem

BF16, FP32 = torch.bfloat16, torch.float32


@pytest.mark.parametrize("problem", [
    bf16_problem(34154, 4096, 7168, "nt", BF16, None, 132),
    bf16_problem(32768, 4096, 7168, "tn", BF16, None, 132),
    grouped_problem(GemmKind.GROUPED_CONTIGUOUS, Bf16Geometry(34304, 4), 4096, 7168, BF16, None, 0, 132),
    grouped_problem(GemmKind.K_GROUPED, Bf16Geometry(4096, 8), 4096, 0, FP32, FP32, 0, 132),
], ids=["dense-nt", "dense-tn", "contiguous", "k-grouped"])
def test_large_grids_take_wide_tiles(problem: cost_model.Bf16Problem) -> None:
    # 128 x 128 ran 0.63-0.80 of 128 x 256 at these sizes on an H100 (it re-reads 1.33x the operand bytes from L2).
    config = choose_config(problem)
    assert config.block_m == 128 and config.block_n >= 192, config


def test_l2_term_binds_only_full_grids(monkeypatch: pytest.MonkeyPatch) -> None:
    # A grid of fewer tiles than SMs (256 x 4096 x 7168 on 64 x 128: 128 tiles) is costed without the L2 term; a
    # full grid (128 x 32: 256 tiles) is costed with it.
    sub_wave = bf16_problem(256, 4096, 7168, "nt", BF16, None, 132)
    before_sub, before_full = estimate_seconds(sub_wave, 64, 128), estimate_seconds(sub_wave, 128, 32)
    monkeypatch.setattr(cost_model, "L2_BYTES_PER_S", 1e9)
    assert estimate_seconds(sub_wave, 64, 128) == before_sub
    assert estimate_seconds(sub_wave, 128, 32) > 10 * before_full


def test_sub_wave_pick_is_unchanged() -> None:
    # 128 x 80 (what an L2 term on every grid picked) ran 7% slower than 64 x 128 here on an H100.
    config = choose_config(bf16_problem(256, 4096, 7168, "nt", BF16, None, 132))
    assert (config.block_m, config.block_n) == (64, 128)
