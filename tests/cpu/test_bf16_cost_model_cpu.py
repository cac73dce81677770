"""The BF16 cost model's L2 term (tiles' operand reads over all SMs, charged on grids that fill every SM), its
short-K share for the 176-, 224- and 240-wide tiles, and its decode tie-break by wave fill."""

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


@pytest.mark.parametrize(("m", "n", "k", "layout", "block_n"), [
    (4096, 32768, 512, "nt", 256),   # was 224: 223.0 against 209.2 us on an H100, 215.3 against 203.4 on an H200
    (4096, 32768, 512, "tt", 256),
    (4096, 24576, 1536, "nt", 208),  # was 240 (three stages): 399.3 against 395.5 us on an H200
    (256, 14336, 1536, "nt", 224),   # was 240: 29.8 against 24.9 us on an H200
    (1024, 13824, 1024, "nt", 144),  # was 176: 45.6 against 43.8 us on an H200
])
def test_short_k_share_moves_measured_picks(m: int, n: int, k: int, layout: str, block_n: int) -> None:
    config = choose_config(bf16_problem(m, n, k, layout, BF16, None, 132))
    assert (config.block_m, config.block_n) == (128, block_n), config


def test_short_k_share_is_dense_and_short_k_only(monkeypatch: pytest.MonkeyPatch) -> None:
    problems = {
        "dense": bf16_problem(4096, 32768, 512, "nt", BF16, None, 132),
        "long_k": bf16_problem(4096, 32768, 4096, "nt", BF16, None, 132),
        "masked": grouped_problem(GemmKind.GROUPED_MASKED, Bf16Geometry(4 * 4096, 4, 4096), 7168, 2048, BF16, None,
                                  256, 132),
    }
    monkeypatch.setattr(cost_model, "SHORT_K_SLOW_WIDTH_SHARE", 1.0)
    without = {name: estimate_seconds(problem, 128, 224) for name, problem in problems.items()}
    monkeypatch.setattr(cost_model, "SHORT_K_SLOW_WIDTH_SHARE", 2.0)
    ratios = {name: estimate_seconds(problem, 128, 224) / without[name] for name, problem in problems.items()}
    assert ratios["dense"] > 1.5 and ratios["long_k"] == 1.0 and ratios["masked"] == 1.0, ratios
    # the masked N = 7168, K = 2048 cases keep 128 x 224 (1.03-1.09x DeepGEMM HEAD on an H100)
    monkeypatch.undo()
    assert choose_config(problems["masked"]).block_n == 224


@pytest.mark.parametrize(("m", "n", "k", "layout", "tile", "before"), [
    # measured on an H100 against the larger-tile pick (`before`), interleaved: 0.95-0.98 of its time
    (128, 10240, 8192, "nt", (64, 160), (128, 144)),
    (16, 10240, 8192, "nt", (64, 80), (64, 240)),
    (128, 12288, 4096, "nt", (64, 192), (128, 176)),
    (128, 18944, 3584, "nt", (128, 144), (128, 256)),   # 264 tiles: two full waves
    (64, 12288, 4096, "nt", (64, 96), (64, 256)),
    (128, 14336, 4096, "tt", (64, 224), (128, 208)),
    (64, 6144, 4096, "nt", (64, 48), (64, 128)),        # 128 tiles of 48 columns
    # kept: sparser grids lost: 107 tiles of 64 x 48 4.5%, NN's 80 tiles of 64 x 128 3.4%, 112 tiles of 64 x 64 1% at
    # K = 16384
    (64, 5120, 27648, "nt", (64, 80), (64, 80)),
    (64, 10240, 8192, "nn", (64, 192), (64, 192)),
    (64, 7168, 16384, "nt", (64, 144), (64, 144)),
])
def test_decode_ties_take_the_fullest_grid(m: int, n: int, k: int, layout: str, tile: tuple[int, int],
                                           before: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    problem = bf16_problem(m, n, k, layout, BF16, None, 132)
    config = choose_config(problem)
    assert (config.block_m, config.block_n) == tile and not config.split_k, config
    assert estimate_seconds(problem, *tile) == estimate_seconds(problem, *before)  # a tie, not a new estimate
    monkeypatch.setattr(cost_model, "DECODE_FULL_FILL", 2.0)  # no grid qualifies: the larger tile, as before
    config = choose_config(problem)
    assert (config.block_m, config.block_n) == before, config


@pytest.mark.parametrize(("m", "n", "k", "layout"), [(64, 2112, 7168, "nt"), (64, 4096, 7168, "nt"), (8, 4096, 7168, "tt"),
                                                     (16, 4096, 14336, "tt")])
def test_decode_split_choice_is_unchanged_by_the_tie_break(m: int, n: int, k: int, layout: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # decode_split was measured on the larger-tile pick: the tie-break never moves a split or its width (except that
    # a K-major A's plain pick on a full grid drops the split: test_full_grid_plain_picks_drop_the_split)
    problem = bf16_problem(m, n, k, layout, BF16, None, 132)
    with_fill = [config for _, config in cost_model.ranked_configs(problem)[:3]]
    monkeypatch.setattr(cost_model, "DECODE_FULL_FILL", 2.0)
    without = [config for _, config in cost_model.ranked_configs(problem)[:3]]
    assert [c for c in with_fill if c.split_k] == [c for c in without if c.split_k]
    assert with_fill[0].split_k == without[0].split_k
    if without[0].split_k:
        assert with_fill[0] == without[0]


def test_decode_tie_break_leaves_large_m_alone() -> None:
    problem = bf16_problem(4096, 10240, 8192, "nt", BF16, None, 132)
    ranked = cost_model.ranked_configs(problem)
    best = ranked[0][0]
    tied = [config for seconds, config in ranked if seconds == best]
    assert tied[0].block_m * tied[0].block_n == max(c.block_m * c.block_n for c in tied)


@pytest.mark.parametrize(("m", "n", "k"), [(1, 4096, 14336), (16, 4096, 14336), (64, 4096, 14336), (32, 4096, 7168),
                                           (1, 4096, 7168), (16, 4096, 4096)])
def test_full_grid_plain_picks_drop_the_split(m: int, n: int, k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # NT, K-major A (its last M-block loaded in a box of M's rows): 64 x 32 on 128 tiles ran ahead of the widened
    # 64 x 64 split (H100: 1 / 16 x 4096 x 14336 53.4 / 53.9 against 54.9 us, 32 x 4096 x 7168 32.9 against 34.4;
    # H200: 64 x 4096 x 14336 42.2 against 43.1)
    config = choose_config(bf16_problem(m, n, k, "nt", BF16, None, 132))
    assert (config.block_m, config.block_n, config.split_k) == (64, 32, False), config
    assert cost_model.wave_fill(bf16_problem(m, n, k, "nt", BF16, None, 132), 64, 32) >= cost_model.DECODE_FULL_FILL
    monkeypatch.setattr(cost_model, "DECODE_FULL_FILL", 2.0)  # no full grid: the split of before
    config = choose_config(bf16_problem(m, n, k, "nt", BF16, None, 132))
    assert (config.block_m, config.block_n, config.split_k) == (64, 64, True), config


@pytest.mark.parametrize(("m", "n", "k", "layout"), [(16, 4096, 14336, "tt"), (8, 4096, 7168, "tt"),
                                                     (64, 2112, 7168, "nt"), (16, 1536, 7168, "nt")])
def test_other_decode_splits_stay(m: int, n: int, k: int, layout: str) -> None:
    # an MN-major A keeps its whole-atom box (and the split); sparse plain grids (N = 2112: 66 tiles of 64 x 32) split
    config = choose_config(bf16_problem(m, n, k, layout, BF16, None, 132))
    assert config.split_k, config
