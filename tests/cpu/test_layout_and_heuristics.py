"""Scale layouts (to_mn_major_tma_aligned, tma_row_stride) and the FP8 GEMM config heuristic."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

import deepgemm
from deepgemm.kernels.common.hopper import SMEM_CAPACITY
from deepgemm.kernels.common.layout import dense_last_box_rows, mn_major_row_stride, tma_row_stride
from deepgemm.kernels.sm90_fp8_gemm_1d2d.config import GemmConfig
from deepgemm.kernels.sm90_fp8_gemm_1d2d import cost_model
from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import (DENSE_RULES, RankingRules, choose_fp8_gemm_config,
                                                            clusters_allowed, dense_tall_tile_share,
                                                            dense_wide_tile_share, make_config, prefers_two_warpgroups,
                                                            ranked_candidates)
from deepgemm.kernels.sm90_fp8_gemm_1d2d.grouped_heuristics import GROUPED_RULES, contiguous_tile, masked_tile
from deepgemm.kernels.sm90_fp8_gemm_1d2d.schedule import split_tail_applies
from deepgemm.kernels.sm90_fp8_gemm_1d2d.smem import fp8_gemm_smem_bytes

# ---------------------------------------------------------------- layouts


def aligned_rows(m: int) -> int:
    return -(-m // 4) * 4


def m_major(values: torch.Tensor, pad_value: float = float("nan")) -> torch.Tensor:
    """values [M, G] as an M-major view with strides (1, align(M, 4)); padding poisoned."""
    m, g = values.shape
    storage = torch.full((g, aligned_rows(m)), pad_value)
    storage[:, :m] = values.t()
    return storage[:, :m].t()


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 64, 129])
@pytest.mark.parametrize("g", [2, 3, 57])
def test_row_major_input_is_copied_to_m_major(m: int, g: int) -> None:
    sf = torch.rand(m, g)
    out = deepgemm.to_mn_major_tma_aligned(sf)
    assert out.shape == (m, g)
    assert out.dtype == torch.float32
    assert out.stride() == (1, aligned_rows(m))
    assert out.data_ptr() % 16 == 0
    assert out.data_ptr() != sf.data_ptr()
    assert torch.equal(out, sf)
    assert mn_major_row_stride(out) == aligned_rows(m)
    # The source is left alone.
    assert sf.is_contiguous()


@pytest.mark.parametrize("m", [1, 2, 3, 5, 64, 129])
@pytest.mark.parametrize("g", [1, 2, 57])
def test_already_aligned_is_returned_without_copy(m: int, g: int) -> None:
    values = torch.rand(m, g)
    sf = m_major(values)
    out = deepgemm.to_mn_major_tma_aligned(sf)
    assert out.data_ptr() == sf.data_ptr()
    assert out.stride() == sf.stride() == (1, aligned_rows(m))
    assert torch.equal(out, values)


def test_m_major_with_unaligned_column_stride_is_copied() -> None:
    m, g = 5, 3
    values = torch.rand(m, g)
    sf = torch.rand(g, m).t()  # strides (1, 5): columns are not 16-byte aligned
    sf.copy_(values)
    assert sf.stride() == (1, 5)
    out = deepgemm.to_mn_major_tma_aligned(sf)
    assert out.data_ptr() != sf.data_ptr()
    assert out.stride() == (1, 8)
    assert torch.equal(out, values)


def test_misaligned_base_pointer_is_copied() -> None:
    m, g = 8, 3
    big = torch.rand(g, m + 1)
    sf = big[:, 1:].t()  # strides (1, 9), base offset 4 bytes
    assert sf.data_ptr() % 16 != 0
    out = deepgemm.to_mn_major_tma_aligned(sf)
    assert out.data_ptr() % 16 == 0 and out.stride() == (1, 8)
    assert torch.equal(out, sf)
    # Aligned stride but misaligned base.
    storage = torch.rand(4 * g * 8 + 1)
    sf2 = storage[1:1 + g * 8].view(g, 8).t()
    assert sf2.stride() == (1, 8) and sf2.data_ptr() % 16 != 0
    out2 = deepgemm.to_mn_major_tma_aligned(sf2)
    assert out2.data_ptr() % 16 == 0 and out2.stride() == (1, 8)
    assert torch.equal(out2, sf2)


def test_single_group_column() -> None:
    """G=1: the column stride is meaningless; values must survive and rows must be unit-stride."""
    for m in (1, 3, 4, 129):
        sf = torch.rand(m, 1)
        out = deepgemm.to_mn_major_tma_aligned(sf)
        assert torch.equal(out, sf)
        assert m == 1 or out.stride(0) == 1
        assert out.data_ptr() % 16 == 0
        assert mn_major_row_stride(out) == aligned_rows(m)
    # A G=1 column cut from a row-major matrix (row stride 3) must be copied.
    wide = torch.rand(6, 3)
    col = wide[:, :1]
    assert col.stride() == (3, 1)
    out = deepgemm.to_mn_major_tma_aligned(col)
    assert out.stride(0) == 1 and torch.equal(out, col)


def test_single_row() -> None:
    """M=1: the row stride is meaningless, the column stride must be 4 floats (16 bytes)."""
    sf = torch.rand(1, 9)
    out = deepgemm.to_mn_major_tma_aligned(sf)
    assert out.shape == (1, 9)
    assert out.stride(1) == 4
    assert torch.equal(out, sf)
    assert mn_major_row_stride(out) == 4


def test_gemm_accepts_any_sfa_layout_with_the_same_result() -> None:
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    m, n, k = 13, 136, 304
    a = (torch.randn(m, k, generator=gen) * 30).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, generator=gen) * 30).to(torch.float8_e4m3fn)
    sfa = torch.rand(m, 3, generator=gen) + 0.1
    sfb = torch.rand(2, 3, generator=gen) + 0.1
    outs = [
        deepgemm.fp8_gemm_nt((a, layout), (b, sfb), out_dtype=torch.float32)
        for layout in (sfa, m_major(sfa), deepgemm.to_mn_major_tma_aligned(sfa), sfa.t().contiguous().t())
    ]
    for out in outs[1:]:
        assert torch.equal(out, outs[0])


@pytest.mark.parametrize(
    "shape,dtype,expected",
    [
        ((1, 7), torch.float8_e4m3fn, 16),
        ((1, 16), torch.float8_e4m3fn, 16),
        ((1, 17), torch.float8_e4m3fn, 32),
        ((1, 0), torch.float8_e4m3fn, 16),
        ((1, 3), torch.bfloat16, 8),
        ((1, 200), torch.bfloat16, 200),
        ((1, 201), torch.bfloat16, 208),
        ((1, 5), torch.float32, 8),
        ((1, 1), torch.float32, 4),
    ],
)
def test_tma_row_stride_single_row(shape, dtype, expected: int) -> None:
    t = torch.zeros(shape, dtype=dtype)
    stride = tma_row_stride(t)
    assert stride == expected
    assert stride * t.element_size() % 16 == 0 and stride >= shape[1]


def test_tma_row_stride_uses_the_real_stride_for_several_rows() -> None:
    t = torch.zeros(5, 208, dtype=torch.bfloat16)
    assert tma_row_stride(t) == 208
    assert tma_row_stride(t[:, :200]) == 208
    assert tma_row_stride(torch.zeros(3, 300, dtype=torch.float8_e4m3fn)) == 300


# ---------------------------------------------------------------- heuristics

MS = [1, 7, 64, 65, 128, 129, 1000, 4096, 4097]
NKS = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048), (8, 128), (136, 144),
       (2056, 7296)]
SMS = [132, 114, 78]


def check_config(c: GemmConfig, m: int, n: int, k: int, num_sms: int, out_bytes: int) -> None:
    where = f"m={m} n={n} k={k} sms={num_sms} out={out_bytes}: {c}"
    assert c.num_sms == num_sms, where
    assert c.block_k == 128, where
    assert c.block_m in (64, 128, 192, 256), where
    if c.block_m in (192, 256):
        assert m >= 512 and c.block_n == 128 and not c.pipelined, where
    if c.block_m == 192:
        assert c.cluster_m == 1, where
    assert c.block_n % 8 == 0 and 8 <= c.block_n <= 192, where
    assert 128 - math.gcd(c.block_n, 128) + c.block_n <= 256, where
    assert c.num_stages >= 2, where
    assert c.smem_bytes <= SMEM_CAPACITY, where
    assert c.smem_bytes == fp8_gemm_smem_bytes(c.block_m, c.block_n, c.num_stages, k, out_bytes), where
    # Pipeline depth: the most stages that fit (32 is the cap).
    assert c.num_stages == 32 or fp8_gemm_smem_bytes(c.block_m, c.block_n, c.num_stages + 1, k, out_bytes) > SMEM_CAPACITY, where
    # Independent lower bound: the stages' A, B and sfa tiles plus the output staging tile (block_m
    # 256: one 64-row chunk of at most 128 bytes per row and warpgroup).
    staging = c.block_m * c.block_n * out_bytes if c.block_m < 256 else 2 * 64 * min(c.block_n * out_bytes, 128)
    lower = c.num_stages * (c.block_m * 128 + c.block_n * 128 + c.block_m * 4) + staging
    assert c.smem_bytes >= lower, where
    assert c.cluster_m in (1, 2), where
    if c.cluster_m == 2:
        assert c.block_n % 16 == 0 and num_sms % 2 == 0, where
    if c.pipelined:
        assert c.block_n <= 128, where
    if m <= 64:
        assert c.block_m == 64, where
    # No tile wider than the (8-aligned) problem needs.
    assert c.block_n <= max(-(-n // 8) * 8, 16), where
    assert c.num_threads == 128 * (1 + {64: 1, 128: 2, 192: 3, 256: 2}[c.block_m])


@pytest.mark.parametrize("num_sms", SMS)
@pytest.mark.parametrize("out_bytes", [2, 4])
def test_config_grid(num_sms: int, out_bytes: int) -> None:
    """Every invariant on the whole grid, for the model's picks and for their 2-CTA-cluster variants (a config the
    tuner times) where the tile allows clusters."""
    for m, (n, k) in itertools.product(MS, NKS):
        c = choose_fp8_gemm_config(m, n, k, num_sms, out_bytes)
        check_config(c, m, n, k, num_sms, out_bytes)
        if clusters_allowed(m, c.block_m, c.block_n, num_sms):
            clustered = make_config(m, n, k, c.block_m, c.block_n, num_sms, out_bytes, cluster_m=2)
            check_config(clustered, m, n, k, num_sms, out_bytes)
            assert clustered.cluster_m == 2


def test_config_odd_sm_count_never_clusters() -> None:
    for m, (n, k) in itertools.product(MS, NKS):
        c = choose_fp8_gemm_config(m, n, k, 133)
        check_config(c, m, n, k, 133, 2)
        assert c.cluster_m == 1 and not clusters_allowed(m, c.block_m, c.block_n, 133)


def test_config_small_m_uses_block_m_64() -> None:
    for m, (n, k), sms in itertools.product([1, 7, 33, 64], NKS, SMS):
        assert choose_fp8_gemm_config(m, n, k, sms).block_m == 64


def test_config_large_compute_bound_shape_uses_block_m_256() -> None:
    c = choose_fp8_gemm_config(4096, 7168, 16384, 132)
    assert (c.block_m, c.block_n) == (256, 128)  # fewest operand bytes per FLOP (measured fastest)
    # Grouped GEMMs with short expert segments never get block_m 256 (an M-block must not span two experts): a
    # wide 128-row tile instead.
    grouped = choose_fp8_gemm_config(4096, 7168, 16384, 132, allow_block_m_256=False, allow_block_m_192=False)
    assert grouped.block_m == 128 and grouped.block_n >= 128


# Mid-size M (H200, benchmarks/h200-mid-m-tune.md and h200-model-ab.md): the fitted prefill model's picks, each
# the fastest or within 1% of the fastest measured tile, where the decode constants had picked tiles 7-40% slower.
@pytest.mark.parametrize("m,n,k,tile", [
    (384, 7168, 16384, (128, 192)),  # 114 tiles, one wave: 79.8 us against 111.6 for 64 x 128
    (3072, 7168, 16384, (128, 192)),  # 545.6 against 624.9 for 128 x 128 (11 waves) and 702.0 for 256 x 128
    (1536, 2112, 7168, (128, 192)),  # 132 tiles: 39.3 against 48.2 for 256 x 128
    (768, 4096, 7168, (128, 192)),  # 39.3 against 45.9 for block_m 192
    # K = 512, block_m 256 (its plain epilogue, benchmarks/h200-model-ab-short-k-256.md): 65.1 against 70.3 for
    # 128 x 128 (which won, 71.8 against 75.6, while block_m 256 overlapped its stores), 129.4 against 139.2
    (2048, 32768, 512, (256, 128)), (4096, 32768, 512, (256, 128)),
    # Short K, where 128 x 192's per-tile cost shows (session 12's per-block_m exposed tail):
    (160, 24576, 1536, (128, 128)),  # 23.8 against 25.0 for 128 x 192
    (256, 24576, 1536, (128, 128)),  # 25.2 against 26.9 for 128 x 192 (was a tuned entry)
    (768, 24576, 1536, (128, 128)),  # 55.2 against 57.8 for 128 x 192
    # 128 x 192 there since the K-loop unroll: 24.1 / 24.3 us against 25.3 / 25.3 (two runs, 2026-12-04)
    (768, 7168, 2048, (128, 192)),
    (4096, 7168, 16384, (256, 128)), (4096, 4096, 7168, (256, 128)), (4096, 7168, 2048, (256, 128)),
])
def test_config_mid_m_picks_measured_fastest_tiles(m: int, n: int, k: int, tile: tuple[int, int]) -> None:
    c = choose_fp8_gemm_config(m, n, k, 132)
    assert (c.block_m, c.block_n) == tile


# Dense GEMMs with M >= 512 and K >= 2048 (dev/bench_split.py, interleaved, bitwise equal outputs; docs/performance.md):
# 128 x 192 measured faster than the fitted model's pick, which DENSE_WIDE_TILE_SHARE corrects; short K and the
# ten-wave 4096 x 7168 x 16384 keep 256 x 128, as measured; grouped layouts rank without the rule.
@pytest.mark.parametrize("m,n,k,tile", [
    (32768, 4096, 7168, (128, 192)),  # 1612-1622 us against 1722-1727 for 256 x 128
    (16384, 7168, 7168, (128, 192)),  # 1328-1407 against 1426-1501
    (8192, 7168, 16384, (128, 192)),  # 1609-1654 against 1676-1725
    (16384, 7168, 16384, (128, 192)),  # 3281.9 against 3521.1
    (16384, 5120, 5120, (128, 192)),  # 639.3 against 672.4
    (4096, 14336, 4096, (256, 128)),  # since the unroll 336.7 / 337.1 against 341.5 / 344.1 (DENSE_TALL_TILE_SHARE)
    (1024, 14336, 4096, (128, 192)),  # 97.9 against 103.4 for 128 x 128
    (2048, 7168, 7168, (128, 192)),  # 165.7 against 169.5 for 128 x 128
    (32768, 7168, 2048, (256, 128)),  # K = 2048: 764 against 787 for 128 x 192
    (16384, 24576, 1536, (256, 128)),  # K = 1536: 1013-1084 against 1046-1136
    (4096, 7168, 16384, (256, 128)),  # 724-729 against 759-767 for 128 x 192
    (768, 14336, 4096, (128, 192)),  # 77.6 against 82.9 for 256 x 128
    (512, 24576, 7168, (128, 192)),  # 137.2 against 143.0
    (3072, 4096, 4096, (128, 192)),  # 80.7 against 84.3
    (384, 7168, 16384, (128, 192)),  # below M = 512 the fitted model decides (here the same tile)
])
def test_config_dense_long_k_picks_128_x_192_where_measured_faster(m: int, n: int, k: int, tile: tuple[int, int]) -> None:
    c = choose_fp8_gemm_config(m, n, k, 132)
    assert (c.block_m, c.block_n) == tile


# Decode sizes with two 64-row M-blocks (benchmarks/h200-decode-tiles.md, interleaved with DeepGEMM HEAD): where 128 x 64
# and 64 x 128 tie in the model, the 128-row tile measured faster up to K = 16384 and slower at K = 28672.
@pytest.mark.parametrize("m,n,k,tile", [
    (128, 24576, 1536, (128, 64)),  # 20.3 us against 21.6 for 64 x 128
    (128, 7168, 2048, (128, 64)),  # 12.2 against 12.5
    (128, 6144, 4096, (128, 64)),  # 16.1 against 16.5
    (128, 7168, 16384, (128, 64)),  # 43.7 against 44.3
    (100, 7168, 2048, (128, 64)),  # one 128-row block instead of two 64-row ones (the same argument, not timed)
    (128, 8192, 28672, (64, 128)),  # 74.5 against 76.1 for 128 x 64
    (64, 7168, 2048, (64, 64)),  # one M-block: no tie to break
    (128, 4096, 7168, (64, 64)),  # no tie: the model rates 64 x 64 faster than 128 x 32
])
def test_decode_ties_go_to_two_math_warpgroups(m: int, n: int, k: int, tile: tuple[int, int]) -> None:
    c = choose_fp8_gemm_config(m, n, k, 132)
    assert (c.block_m, c.block_n) == tile
    assert prefers_two_warpgroups(m, k) == (64 < m <= 128 and k <= 16384)


def test_decode_tie_rule_is_dense_only() -> None:
    """Grouped layouts rank without it (not measured there): a masked decode group keeps 64-row tiles."""
    assert choose_fp8_gemm_config(128, 7168, 2048, 132, rules=RankingRules(decode_ties=False)).block_m == 64
    assert choose_fp8_gemm_config(128, 7168, 2048, 132, rules=GROUPED_RULES).block_m == 64
    assert masked_tile(64, 128, 1, 7168, 2048, 132, 2) == (64, 128)


def test_dense_wide_tile_rule_is_dense_only() -> None:
    assert dense_wide_tile_share(32768, 7168) < 1 and dense_wide_tile_share(511, 7168) == 1
    assert dense_wide_tile_share(32768, 2048) < 1 and dense_wide_tile_share(32768, 2047) == 1
    plain = choose_fp8_gemm_config(32768, 4096, 7168, 132, rules=RankingRules(tile_shares=False))
    assert (plain.block_m, plain.block_n) == (256, 128)
    # The grouped tile choices call the model with the rule off (masked ones rank by their own expected time).
    assert masked_tile(1024, 4096, 1, 4096, 7168, 132, 2) == (128, 128)
    assert contiguous_tile(4 * 8192, 4, 4096, 7168, 132, 2) == (128, 192)  # their own measured rule


# After the K-loop unroll (2026-12-04, dev/model_ab.py, benchmarks/h200-wide-tile-rules.md): the 128 x 192 share from
# K = 2048, and 256 x 128 rated with its own share against a first-placed 128 x 192 at M <= 8192. New / old pick, µs.
@pytest.mark.parametrize("m,n,k,tile", [
    (4096, 1536, 2048, (128, 192)),  # 24.6 against 25.5 for 128 x 128
    (12288, 1536, 2048, (128, 192)),  # 60.1 against 64.3 for 128 x 128
    (6144, 4608, 3584, (128, 192)),  # 146.0 against 151.0 for 256 x 128
    (4096, 10240, 8192, (256, 128)),  # 482.8 against 502.5 for 128 x 192
    (8192, 4096, 14336, (256, 128)),  # 662.8 against 693.6
    (2048, 28672, 8192, (256, 128)),  # 678.1 against 694.1
    (32768, 8192, 8192, (128, 192)),  # M > 8192: the plain share (256 x 128 ran 1.9% slower there)
    (640, 10240, 8192, (128, 160)),  # not against 128 x 160: 256 x 128 ran 92.1 -> 96.8
    (512, 14336, 4096, (128, 160)),  # 50.5 against 52.7 for 256 x 128
])
def test_config_wide_and_tall_tile_shares_after_the_unroll(m: int, n: int, k: int, tile: tuple[int, int]) -> None:
    c = choose_fp8_gemm_config(m, n, k, 132)
    assert (c.block_m, c.block_n) == tile


def test_dense_tall_tile_share_scope() -> None:
    assert dense_tall_tile_share(4096, 8192) < 1 and dense_tall_tile_share(8192, 2048) < 1
    assert dense_tall_tile_share(8193, 8192) == 1 and dense_tall_tile_share(511, 8192) == 1
    assert dense_tall_tile_share(4096, 2047) == 1

    def first(rules: RankingRules = DENSE_RULES) -> tuple[int, int]:
        _, block_m, block_n = ranked_candidates(4096, 10240, 8192, 132, rules=rules)[0]
        return block_m, block_n

    assert first() == (256, 128)
    with pytest.MonkeyPatch.context() as patch:  # without the 256 x 128 share the 128 x 192 share would pick it
        patch.setattr(cost_model, "DENSE_TALL_TILE_SHARE", 1.0)
        assert first() == (128, 192)
    # Grouped rules turn both dense shares off (the plain estimate: 256 x 128 here, 494 against 529 us).
    assert first(GROUPED_RULES) == first(RankingRules(tile_shares=False)) == (256, 128)
    assert GROUPED_RULES.tile_shares is False and GROUPED_RULES.decode_ties is False


def test_config_block_m_192_only_on_request() -> None:
    """block_m 192 was never the fastest tile at M >= 512 in the mid-M sweep (1.03-1.25x the best), so the model
    leaves it out unless asked (the tuner and tuned entries may still choose it)."""
    for m, (n, k) in itertools.product((512, 768, 1000, 4096, 8192), NKS):
        assert choose_fp8_gemm_config(m, n, k, 132).block_m != 192
    # Asked for, it competes on its estimate (768x3072x7168: 4 x 24 = 96 tiles of 192 rows, one wave).
    assert any(block_m == 192 for _, block_m, _ in ranked_candidates(768, 3072, 7168, 132, allow_block_m_192=True))
    assert all(block_m != 192 for _, block_m, _ in ranked_candidates(768, 3072, 7168, 132))


@pytest.mark.parametrize("m,n,k,plain_n,split_n", [
    (1, 2112, 7168, 16, 32), (16, 1536, 7168, 16, 32), (64, 2112, 7168, 16, 32), (1, 576, 7168, 8, 16),
    (128, 2112, 7168, 32, 64),  # two M-blocks: 32 wide still splits
    (64, 4096, 7168, 32, None),  # one M-block 32 wide: split measured 10% slower
    (64, 7168, 2048, 64, None),  # 16 K blocks: too short
    (128, 7168, 16384, None, None),  # 128 x 64 (test_decode_ties_go_to_two_math_warpgroups): not narrow, no split
    (4096, 2112, 7168, None, None),
])
def test_config_decode_split_k(m: int, n: int, k: int, plain_n: int | None, split_n: int | None) -> None:
    """Narrow one-wave decode tiles over a long K run as twice-as-wide split-K tiles (H200 sweeps, session 10)."""
    plain = choose_fp8_gemm_config(m, n, k, 132, decode_split=False)
    chosen = choose_fp8_gemm_config(m, n, k, 132)
    assert not plain.split_tail or plain.block_m == 192
    if plain_n is not None:
        assert (plain.block_m, plain.block_n) == (64, plain_n)
    if split_n is None:
        assert chosen == plain
    else:
        assert (chosen.block_m, chosen.block_n, chosen.split_tail) == (64, split_n, True)
        assert split_tail_applies(m, n, k, 64, split_n, 132)  # the launch really splits K


@pytest.mark.parametrize("block_m,rows,box", [(64, 1, 8), (64, 8, 8), (64, 9, 16), (64, 17, 24), (64, 63, 64), (64, 64, 64),
                                              (64, 4096, 64), (128, 100, 104), (64, 65, 8), (64, 72, 8), (64, 73, 16),
                                              (64, 127, 64), (128, 129, 8), (256, 300, 48), (256, 512, 256), (64, 0, 8)])
def test_dense_last_box_rows(block_m: int, rows: int, box: int) -> None:
    """A dense launch loads its last M-block's A and sfa in boxes of that block's rows rounded up to 8."""
    assert dense_last_box_rows(block_m, rows) == box


def test_config_is_deterministic() -> None:
    first = [choose_fp8_gemm_config(m, n, k, s) for m, (n, k), s in itertools.product(MS, NKS, SMS)]
    second = [choose_fp8_gemm_config(m, n, k, s) for m, (n, k), s in itertools.product(MS, NKS, SMS)]
    assert first == second


def test_config_covers_a_variety_of_tiles() -> None:
    """The grid exercises every block_m value the model picks and pipelining; the model never picks 2-CTA clusters
    (measured slower; a config asks for them). block_m 192 is a candidate only on request (the test above)."""
    grid = list(itertools.product(MS, NKS, SMS, (2, 4)))
    configs = {choose_fp8_gemm_config(m, n, k, s, o) for m, (n, k), s, o in grid}
    assert {c.block_m for c in configs} == {64, 128, 256}
    assert {c.pipelined for c in configs} == {True, False}
    assert {c.cluster_m for c in configs} == {1}


@pytest.mark.parametrize(
    "args",
    [(0, 128, 128, 132), (1, 0, 128, 132), (1, 128, 0, 132), (1, 128, 128, 0), (-1, 128, 128, 132), (1, 128, 128, -132)],
)
def test_config_invalid_args(args) -> None:
    with pytest.raises(ValueError):
        choose_fp8_gemm_config(*args)


def test_gemm_config_is_frozen() -> None:
    c = choose_fp8_gemm_config(128, 4096, 7168, 132)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.block_n = 64  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.num_stages = 1  # type: ignore[misc]
    assert hash(c) == hash(dataclasses.replace(c))
    assert c == dataclasses.replace(c)
    assert c != dataclasses.replace(c, num_stages=c.num_stages - 1)


def test_smem_grows_with_stages_and_k() -> None:
    base = fp8_gemm_smem_bytes(128, 128, 4, 7168, 2)
    assert fp8_gemm_smem_bytes(128, 128, 5, 7168, 2) - base == 128 * 128 + 128 * 128 + 128 * 4 + 16
    assert fp8_gemm_smem_bytes(128, 128, 4, 7168 * 4, 2) > base
    assert fp8_gemm_smem_bytes(128, 128, 4, 7168, 4) > base
    # Besides the stages and output buffers: two tile slots (a 64-byte header and 56 sfb floats, 384 bytes
    # each), 16 bytes of split-tail flags, and the barriers (two per stage, two per tile slot).
    def fixed(stages: int) -> int:
        return 2 * 384 + 16 + 2 * stages * 8 + 2 * 2 * 8

    # block_m 256, chunked stores: one 8 KB buffer of 64 columns per math warpgroup.
    stage_256 = 256 * 128 + 128 * 128 + 256 * 4
    assert fp8_gemm_smem_bytes(256, 128, 4, 7168, 2, chunked_store=True) == 4 * stage_256 + 2 * 64 * 128 + fixed(4)
    # By default one full-width 16 KB buffer per wave (two per warpgroup): three stages fit, not four.
    assert fp8_gemm_smem_bytes(256, 128, 3, 7168, 2) == 3 * stage_256 + 2 * 2 * 64 * 256 + fixed(3)
    assert fp8_gemm_smem_bytes(256, 128, 4, 7168, 2) > SMEM_CAPACITY


def test_block_m_256_store_layout() -> None:
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config

    wide = make_config(4096, 7168, 16384, 256, 128, 132)
    assert not wide.chunked_store and wide.num_stages == 3
    # FP32 output: per-wave buffers would leave two stages, so chunks (and four stages) instead.
    fp32 = make_config(4096, 7168, 16384, 256, 128, 132, 4)
    assert fp32.chunked_store and fp32.num_stages == 4
    forced = make_config(4096, 7168, 16384, 256, 128, 132, chunked_store=True)
    assert forced.chunked_store and forced.num_stages == 4 and "cs1" in forced.label()
    with pytest.raises(ValueError, match="chunked_store"):
        make_config(4096, 7168, 16384, 128, 128, 132, chunked_store=True)


def test_make_config_takes_a_pipeline_depth_within_what_fits() -> None:
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.smem import max_stages

    deepest = max_stages(128, 128, 7168, 2)
    assert make_config(4096, 2112, 7168, 128, 128, 132).num_stages == deepest
    shallow = make_config(4096, 2112, 7168, 128, 128, 132, num_stages=3)
    assert shallow.num_stages == 3 and shallow.smem_bytes == fp8_gemm_smem_bytes(128, 128, 3, 7168, 2)
    for bad in (1, deepest + 1):
        with pytest.raises(ValueError, match="num_stages"):
            make_config(4096, 2112, 7168, 128, 128, 132, num_stages=bad)


@pytest.mark.parametrize("tiles,slots,grid", [
    (512, 132, 128),  # 4096 x 4096 with 256 x 128 tiles: four tiles per CTA instead of 116 x 4 + 16 x 3
    (896, 132, 128),  # 4096 x 7168: seven each
    (544, 132, 109),  # five waves either way
    (133, 132, 67),
    (132, 132, 132),
    (100, 132, 100),  # fewer tiles than slots: one each
    (1, 132, 1),
])
def test_balanced_grid_keeps_the_waves_and_evens_the_tiles(tiles: int, slots: int, grid: int) -> None:
    from deepgemm.kernels.common.grid import balanced_grid

    assert balanced_grid(tiles, slots) == grid
    waves = -(-tiles // slots)
    assert -(-tiles // grid) == waves  # the same number of waves
    assert grid <= slots and tiles <= grid * waves


def test_balanced_grid_rejects_empty_input() -> None:
    from deepgemm.kernels.common.grid import balanced_grid

    with pytest.raises(ValueError, match="positive"):
        balanced_grid(0, 132)


def test_balanced_grid_is_a_config_field_from_k_1024() -> None:
    """Dense configs get a balanced grid from K = 1024 (measured 0.5-2.4% faster; 5% slower at K = 512); a config
    may turn it off, and grouped configs never have it."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.heuristics import choose_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind, GemmProblem
    from deepgemm.kernels.common.grid import balanced_grid_applies

    assert not balanced_grid_applies(512) and balanced_grid_applies(1024) and balanced_grid_applies(16384)
    assert choose_fp8_gemm_config(4096, 4096, 7168, 132).balanced_grid
    assert not choose_fp8_gemm_config(4096, 32768, 512, 132).balanced_grid
    assert not make_config(4096, 4096, 7168, 128, 128, 132, balanced_grid=False).balanced_grid
    grouped = choose_config(GemmProblem(8192, 4096, 7168, 132, kind=GemmKind.GROUPED_CONTIGUOUS, groups=4))
    assert not grouped.balanced_grid


@pytest.mark.parametrize("name", ["DEEPGEMM_SPLIT_TAIL", "DEEPGEMM_NARROW_LAST_N", "DEEPGEMM_CLUSTER_M",
                                  "DEEPGEMM_BALANCED_GRID"])
def test_removed_switch_warns_and_changes_nothing(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A removed algorithm switch that is still set gets a warning naming the config field that replaces it; the
    choice stays the cost model's."""
    from deepgemm.utils import REMOVED_ENVIRONMENT, warn_removed_environment

    before = choose_fp8_gemm_config(4096, 2112, 7168, 132)
    monkeypatch.setenv(name, "0" if name in ("DEEPGEMM_NARROW_LAST_N", "DEEPGEMM_BALANCED_GRID") else "2")
    with pytest.warns(UserWarning, match=f"{name} is no longer read.*GemmConfig"):
        warn_removed_environment()
    assert REMOVED_ENVIRONMENT[name].startswith("GemmConfig.")
    assert choose_fp8_gemm_config(4096, 2112, 7168, 132) == before


def test_bf16_balanced_grid_dense_unsplit_from_k_1024() -> None:
    """BF16 dense unsplit configs launch a balanced grid from K = 1024 (the FP8 rule); split-K, grouped and
    k-grouped configs never do, and the label says which."""
    import torch

    from deepgemm.kernels.sm90_bf16_gemm.cost_model import make_config
    from deepgemm.kernels.sm90_bf16_gemm.plan import bf16_problem, bf16_spec, grouped_problem, Bf16Geometry
    from deepgemm.kernels.common.kind import GemmKind

    dense = bf16_spec(4096, 2112, 7168, "nt", torch.bfloat16, None, 132).config
    assert dense.balanced_grid and dense.label().endswith(" bal")
    assert not bf16_spec(4096, 32768, 512, "nt", torch.bfloat16, None, 132).config.balanced_grid
    problem = bf16_problem(64, 2112, 7168, "nt", torch.bfloat16, None, 132)
    assert not make_config(problem, 64, 64, split_k=True).balanced_grid
    for kind in (GemmKind.GROUPED_CONTIGUOUS, GemmKind.K_GROUPED):
        grouped = grouped_problem(kind, Bf16Geometry(8192, 4), 4096, 7168, torch.bfloat16, None, 2048, 132)
        assert not make_config(grouped, 128, 128).balanced_grid
