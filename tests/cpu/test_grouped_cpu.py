"""Grouped FP8 GEMMs on CPU tensors (reference path) and their argument checks."""

from __future__ import annotations

import pytest
import torch

import deepgemm
from deepgemm.reference import fp8_gemm_nt_reference


def _weights(groups: int, n: int, k: int):
    parts = [deepgemm.quantize_per_block(torch.randn(n, k)) for _ in range(groups)]
    return torch.stack([q for q, _ in parts]), torch.stack([s for _, s in parts])


def test_contiguous_reference_matches_per_expert_gemms() -> None:
    counts = [5, 0, 130]
    indices = sum(([g] * c + [-1] * (-(-c // 128) * 128 - c) for g, c in enumerate(counts)), [])
    m_indices = torch.tensor(indices, dtype=torch.int32)
    a = deepgemm.quantize_per_token_group(torch.randn(len(indices), 256))
    b = _weights(3, 24, 256)
    out = torch.full((len(indices), 24), float("nan"), dtype=torch.bfloat16)
    deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices)
    assert (out[m_indices < 0] == 0).all()
    for g in range(3):
        rows = (m_indices == g).nonzero().flatten()
        if rows.numel():
            expected = fp8_gemm_nt_reference(a[0][rows], a[1][rows], b[0][g], b[1][g], torch.float64)
            assert deepgemm.calc_diff(out[rows], expected) < 1e-5


def test_masked_reference_writes_only_valid_rows() -> None:
    groups, max_m, k, n = 3, 64, 256, 40
    x = torch.randn(groups * max_m, k)
    q, sf = deepgemm.quantize_per_token_group(x)
    a = (q.view(groups, max_m, k), sf.reshape(groups, max_m, -1))
    b = _weights(groups, n, k)
    masked_m = torch.tensor([0, 10, 64], dtype=torch.int32)
    out = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16)
    deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected_m=32)
    assert out[0].isnan().all() and out[1, 10:].isnan().all() and not out[2].isnan().any()
    expected = fp8_gemm_nt_reference(a[0][1, :10], a[1][1, :10], b[0][1], b[1][1], torch.float64)
    assert deepgemm.calc_diff(out[1, :10], expected) < 1e-5


def test_grouped_validation_names_arguments() -> None:
    a = deepgemm.quantize_per_token_group(torch.randn(128, 256))
    b = _weights(2, 32, 256)
    out = torch.empty(128, 32, dtype=torch.bfloat16)
    good = torch.zeros(128, dtype=torch.int32)
    with pytest.raises(TypeError, match="m_indices"):
        deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, good.long())
    with pytest.raises(ValueError, match="b\\[0\\]"):
        deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, (b[0][0], b[1][0]), out, good)
    with pytest.raises(ValueError, match="out"):
        deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out[:, :16], good)
    a3 = (a[0].view(2, 64, 256), a[1].reshape(2, 64, 2))
    out3 = torch.empty(2, 64, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="expected_m"):
        deepgemm.m_grouped_fp8_gemm_nt_masked(a3, b, out3, torch.zeros(2, dtype=torch.int32), expected_m=0)
    with pytest.raises(ValueError, match="masked_m"):
        deepgemm.m_grouped_fp8_gemm_nt_masked(a3, b, out3, torch.zeros(3, dtype=torch.int32), expected_m=8)
    a_odd = (a[0][:96].view(2, 48, 256), a[1][:96].reshape(2, 48, 2))
    with pytest.raises(ValueError, match="multiple of 64"):
        deepgemm.m_grouped_fp8_gemm_nt_masked(a_odd, b, torch.empty(2, 48, 32, dtype=torch.bfloat16),
                                              torch.zeros(2, dtype=torch.int32), expected_m=8)


def test_masked_block_n_cap_never_spans_three_scale_blocks_and_compiles() -> None:
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config, spans_at_most_two_scale_blocks
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec, compile_spec
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.grouped_heuristics import max_block_n_for

    for n in range(8, 264, 8):
        for cap in (16, 64, 128, 160, 192):
            assert spans_at_most_two_scale_blocks(max_block_n_for(n, cap))
    block_n = max_block_n_for(152, 160)  # 152 itself would span three 128-column scale blocks
    config = make_config(4096, 152, 7168, 128, block_n, 132, cluster_m=1)
    compiled = compile_spec(Fp8GemmSpec(152, 7168, torch.bfloat16, config, GemmKind.GROUPED_MASKED))
    assert compiled.resources is not None and compiled.resources.spill_stores == 0


def test_m_indices_from_psum_layout() -> None:
    from deepgemm.reference import m_indices_from_psum

    # Expert 0: 5 rows; expert 1: none; expert 2: 130 rows from row 128; expert 3: 1 row from row 384.
    psum = torch.tensor([5, 5, 258, 385], dtype=torch.int32)
    indices = m_indices_from_psum(psum, 512)
    expected = torch.full((512,), -1, dtype=torch.int32)
    expected[:5] = 0
    expected[128:258] = 2
    expected[384:385] = 3
    assert torch.equal(indices, expected)
    # Ends past M_total are clipped; a decreasing psum never moves a start backwards.
    assert torch.equal(m_indices_from_psum(torch.tensor([600], dtype=torch.int32), 256), torch.zeros(256, dtype=torch.int32))
    decreasing = m_indices_from_psum(torch.tensor([200, 100, 300], dtype=torch.int32), 384)
    assert (decreasing[:200] == 0).all() and (decreasing[200:256] == -1).all() and (decreasing[256:300] == 2).all()


def test_contiguous_psum_matches_m_indices_form() -> None:
    from deepgemm.reference import m_indices_from_psum

    psum = torch.tensor([5, 5, 258, 385], dtype=torch.int32)
    a = deepgemm.quantize_per_token_group(torch.randn(512, 256))
    b = _weights(4, 24, 256)
    by_psum = torch.full((512, 24), float("nan"), dtype=torch.bfloat16)
    deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, by_psum, psum)
    by_index = torch.full((512, 24), float("nan"), dtype=torch.bfloat16)
    deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, by_index, m_indices_from_psum(psum, 512))
    assert torch.equal(by_psum, by_index)
    assert (by_psum[5:128] == 0).all() and (by_psum[385:] == 0).all()
    expected = fp8_gemm_nt_reference(a[0][128:258], a[1][128:258], b[0][2], b[1][2], torch.float64)
    assert deepgemm.calc_diff(by_psum[128:258], expected) < 1e-5


def test_contiguous_psum_validation_names_arguments() -> None:
    a = deepgemm.quantize_per_token_group(torch.randn(128, 256))
    b = _weights(2, 32, 256)
    out = torch.empty(128, 32, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="psum"):
        deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, out, torch.tensor([10, 20]))
    with pytest.raises(ValueError, match="psum"):
        deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, out, torch.tensor([10, 20, 30], dtype=torch.int32))
    a_odd = deepgemm.quantize_per_token_group(torch.randn(100, 256))
    with pytest.raises(ValueError, match="multiple of 128"):
        deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a_odd, b, torch.empty(100, 32, dtype=torch.bfloat16),
                                                       torch.tensor([10, 20], dtype=torch.int32))


def test_contiguous_psum_kernel_compiles_without_spills() -> None:
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec, compile_spec
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind

    for out_dtype in (torch.bfloat16, torch.float32):
        config = make_config(4096, 4096, 7168, 128, 128, 132, 4 if out_dtype == torch.float32 else 2, cluster_m=1)
        compiled = compile_spec(Fp8GemmSpec(4096, 7168, out_dtype, config, GemmKind.GROUPED_CONTIGUOUS_PSUM))
        assert compiled.resources is not None
        assert (compiled.resources.spill_stores, compiled.resources.stack_frame) == (0, 0)


@pytest.mark.parametrize("kind_name", ["GROUPED_CONTIGUOUS", "GROUPED_CONTIGUOUS_PSUM"])
def test_contiguous_block_m_256_compiles_without_spills(kind_name: str) -> None:
    """block_m 256 (two waves per warpgroup, half tiles at expert boundaries) for both contiguous forms."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec, compile_spec
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind

    for out_dtype in (torch.bfloat16, torch.float32):
        config = make_config(32768, 4096, 7168, 256, 128, 132, 4 if out_dtype == torch.float32 else 2, cluster_m=1)
        assert not config.pipelined
        compiled = compile_spec(Fp8GemmSpec(4096, 7168, out_dtype, config, GemmKind[kind_name]))
        assert compiled.resources is not None
        assert (compiled.resources.spill_stores, compiled.resources.stack_frame) == (0, 0)


def test_contiguous_block_m_256_needs_long_expert_segments() -> None:
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import RankingRules, choose_fp8_gemm_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.grouped_heuristics import contiguous_allows_block_m_256

    assert contiguous_allows_block_m_256(4 * 8192, 4) and contiguous_allows_block_m_256(8 * 4096, 8)
    assert not contiguous_allows_block_m_256(256 * 128, 256)  # decode-sized experts: half tiles everywhere
    assert not contiguous_allows_block_m_256(384, 1)  # below the dense minimum too
    assert contiguous_allows_block_m_256(1024, 1) and not contiguous_allows_block_m_256(1024, 2)
    # Where it is allowed the cost model takes it for these MoE shapes, as for dense M = 4096.
    for n, k in ((4096, 7168), (7168, 2048)):
        assert choose_fp8_gemm_config(32768, n, k, 132, allow_block_m_256=True,
                                      rules=RankingRules(tile_shares=False)).block_m == 256


def test_contiguous_layouts_take_128x192_tiles_where_they_pay() -> None:
    """128 x 192 tiles for the issue-5 layouts (measured 6-9% faster than 256 x 128), not where wave quantization
    or narrow N makes them lose: 8 x 128 rows at N = 4096 (two waves of them against one of 256 x 128), N = 256."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.grouped_heuristics import contiguous_tile

    for m_total, groups, n, k in ((34152, 4, 4096, 7168), (32784, 4, 7168, 2048), (33696, 8, 4096, 7168),
                                  (38240, 8, 7168, 2048)):
        assert contiguous_tile(m_total, groups, n, k, 132, 2) == (128, 192)
        assert contiguous_tile(m_total, groups, n, k, 132, 4) == (128, 192)  # FP32 output: three stages still fit
    assert contiguous_tile(1024, 8, 4096, 7168, 132, 2) != (128, 192)
    assert contiguous_tile(4096, 2, 256, 7168, 132, 2)[1] <= 128
    assert contiguous_tile(64, 1, 4096, 7168, 132, 2)[0] == 64  # decode-sized: the model's pick


def test_masked_decode_tiles_stay_at_most_128_wide() -> None:
    """Decode-sized masked groups keep the model's pick capped at 128 columns (measured there)."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.grouped_heuristics import masked_tile

    for groups, expected, n, k in ((32, 16, 4096, 7168), (256, 8, 2048, 7168), (64, 32, 7168, 2048), (8, 64, 4096, 7168)):
        block_m, block_n = masked_tile(expected, 128, groups, n, k, 132, 2)
        assert block_n <= 128 and block_m in (64, 128)
    assert masked_tile(64, 128, 8, 4096, 7168, 132, 2) == (128, 128)  # rows up to 83: one M-block per group
    assert masked_tile(16, 128, 32, 4096, 7168, 132, 2) == (64, 128)


def test_masked_block_counts_are_the_distribution_of_the_sum() -> None:
    """Two groups of 3-5 rows with 2-row blocks, enumerated by hand: the convolution gives the same distribution."""
    import itertools

    from deepgemm.kernels.sm90_fp8_gemm_1d2d import grouped_heuristics as gh

    counts = gh._masked_block_counts(4, 4096, 2, 2)  # rows uniform in round(2.8)..round(5.2) = 3..5
    expected: dict[int, float] = {}
    for a, b in itertools.product(range(3, 6), repeat=2):
        blocks = -(-a // 2) + -(-b // 2)
        expected[blocks] = expected.get(blocks, 0.0) + 1 / 9
    assert counts.keys() == expected.keys() and all(abs(counts[b] - expected[b]) < 1e-12 for b in expected)
    # max_m caps the spread: every group holds exactly 3 rows.
    assert gh._masked_block_counts(4, 3, 2, 2) == {4: 1.0}
    # Many groups: the mean stands for the distribution.
    many = gh._masked_block_counts(100, 4096, 128, gh.MASKED_EXACT_GROUPS + 1)
    assert len(many) == 1 and abs(sum(many.values()) - 1) < 1e-12


def test_masked_tiles_ranked_over_the_row_spread() -> None:
    """Above decode sizes the tile is ranked by its expected time over rows 0.7-1.3 x expected_m: 1 x ~1024 rows at
    N = 4096, K = 7168 leaves 256 x 128 (one wave at 1007 rows, two at 1229: measured 51.6 / 93.3 us) for 128 x 128,
    and 4 x ~256 rows takes 128 x 192 (two waves across the spread where 128 x 128 mostly needs three). At N = 7168,
    K = 2048 the measured short-K share makes 128 x 192 the pick for all three cases (without it the model ranks
    128 x 128 first, 2-10% ahead; timed over 21 draws 128 x 192 was never behind DeepGEMM HEAD, 128 x 128 up to 16%)."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d import grouped_heuristics as gh
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import estimate_seconds

    # At exactly expected_m the model alone prefers 256 x 128 (the old rule's pick).
    assert estimate_seconds(1024, 4096, 7168, 256, 128, 132, 2) < estimate_seconds(1024, 4096, 7168, 128, 128, 132, 2)
    assert gh.masked_tile(1024, 4096, 1, 4096, 7168, 132, 2) == (128, 128)
    assert gh.masked_tile(256, 4096, 4, 4096, 7168, 132, 2) == (128, 192)
    for groups, expected, n, k in ((1, 1024, 7168, 2048), (2, 512, 7168, 2048), (4, 256, 7168, 2048)):
        assert gh.masked_tile(expected, 4096, groups, n, k, 132, 2) == (128, 192)
        blocks = gh._masked_block_counts(expected, 4096, 128, groups)
        plain, wide = (gh.masked_expected_seconds(blocks, expected, groups, n, k, 128, bn, 132, 2) for bn in (128, 192))
        assert plain < wide  # the unscaled model's order
        assert wide * gh.masked_wide_tile_share(k) < plain
    assert gh.masked_wide_tile_share(2048) == gh.MASKED_WIDE_TILE_SHARE_SHORT_K
    assert gh.masked_wide_tile_share(1024) == gh.masked_wide_tile_share(7168) == 1.0
    # The ranking follows the expected time it computes.
    counts = gh._masked_block_counts(1024, 4096, 256, 1)
    wide = gh.masked_expected_seconds(counts, 1024, 1, 4096, 7168, 256, 128, 132, 2)
    plain = gh.masked_expected_seconds(gh._masked_block_counts(1024, 4096, 128, 1), 1024, 1, 4096, 7168, 128, 128, 132, 2)
    assert plain < wide


def test_masked_block_m_256_compiles_without_spills() -> None:
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec, compile_spec
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind

    config = make_config(1024, 4096, 7168, 256, 128, 132, 2, cluster_m=1)
    compiled = compile_spec(Fp8GemmSpec(4096, 7168, torch.bfloat16, config, GemmKind.GROUPED_MASKED))
    assert compiled.resources is not None
    assert (compiled.resources.spill_stores, compiled.resources.stack_frame) == (0, 0)


def test_masked_block_m_256_only_with_long_k() -> None:
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.grouped_heuristics import masked_allows_block_m_256

    assert masked_allows_block_m_256(7168) and not masked_allows_block_m_256(2048)


def test_masked_decode_tiles_leave_headroom_for_row_spread() -> None:
    """Decode-sized masked groups size their tile for expected_m plus a quarter (capped at max_m), so a
    group a little above expected_m still fits one M-block; larger groups use expected_m as given."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import choose_fp8_gemm_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.grouped_heuristics import masked_config_m

    assert [masked_config_m(e, 128) for e in (1, 8, 16, 32, 64, 100, 128, 500)] == [1, 10, 20, 40, 80, 125, 128, 128]
    assert masked_config_m(1024, 4096) == 1024 and masked_config_m(0, 128) == 1
    # 8 experts x ~64 tokens (45-83 rows each): 128-row tiles, so no group reads its weights twice.
    assert choose_fp8_gemm_config(masked_config_m(64, 128), 8 * 4096, 7168, 132, allow_block_m_192=False).block_m == 128
    # ~16 tokens per expert still fit 64-row tiles.
    assert choose_fp8_gemm_config(masked_config_m(16, 128), 32 * 4096, 7168, 132, allow_block_m_192=False).block_m == 64


@pytest.mark.parametrize("block_m", [64, 128])
def test_masked_partial_a_loads_compile_without_spills(block_m: int) -> None:
    """Masked tiles of 64 and 128 rows load A in 16- and 64-row boxes (the host's box matches: static_assert)."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import Fp8GemmSpec, a_box_rows, compile_spec
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind

    assert a_box_rows(GemmKind.GROUPED_MASKED, block_m) == (16 if block_m == 64 else 64)
    assert a_box_rows(GemmKind.DENSE, block_m) == block_m
    config = make_config(block_m, 4096, 7168, block_m, 128, 132, 2, cluster_m=1)
    compiled = compile_spec(Fp8GemmSpec(4096, 7168, torch.bfloat16, config, GemmKind.GROUPED_MASKED))
    assert compiled.resources is not None
    assert (compiled.resources.spill_stores, compiled.resources.stack_frame) == (0, 0)


def test_grouped_launch_cache_keys_and_reference_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The grouped APIs' launch-ready cache: CPU (reference) calls never fill it; a remembered argument set launches
    without validation, and a hint that only compares equal (True for 1, 64.0 for 64) or another grouping form
    misses it and goes through the checked path."""
    from deepgemm.api import grouped

    monkeypatch.setattr(grouped, "_ready", {})
    groups, max_m, n, k = 2, 64, 128, 256
    a = (torch.zeros(groups, max_m, k).to(torch.float8_e4m3fn), torch.ones(groups, max_m, k // 128))
    b = (torch.zeros(groups, n, k).to(torch.float8_e4m3fn), torch.ones(groups, 1, k // 128))
    out = torch.empty(groups, max_m, n, dtype=torch.bfloat16)
    masked_m = torch.tensor([3, 64], dtype=torch.int32)
    deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, 1)
    assert grouped._ready == {}

    launched = []

    class FakePlan:
        def launch_packed(self, args: object) -> None:
            launched.append(args)

    key = grouped._metadata_key(("masked", int, 1), a[0], a[1], b[0], b[1], out, masked_m)
    grouped._ready[key] = (FakePlan(), "args")
    assert deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, 1) is out
    assert launched == ["args"]
    with pytest.raises(ValueError, match="expected_m"):
        deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, True)
    with pytest.raises(ValueError, match="expected_m"):
        deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, 1.0)
    assert launched == ["args"]
    # A list instead of a tuple, or a non-tensor, skips the cache and gets the checked path's error.
    with pytest.raises(TypeError, match="'masked_m'"):
        deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, [3, 64], 1)
    assert launched == ["args"]


def test_masked_scale_layouts_used_in_place() -> None:
    """Masked scales are read through a 3-D descriptor (M, K block, group): M-major per group, a view of one
    M-major [G * max_m, K/128] tensor (what quantize_per_token_group returns for A viewed 2-D) and padded group
    strides are used as is; K-major scales and strides TMA cannot take are copied into the per-group form."""
    from deepgemm.api.grouped import _masked_sfa_layout
    from deepgemm.kernels.common.layout import masked_sfa_strides

    groups, max_m, k_groups = 3, 128, 5
    one_m_major = torch.randn(k_groups, groups * max_m).t().reshape(groups, max_m, k_groups)
    assert one_m_major.stride() == (max_m, 1, groups * max_m)
    per_group = torch.randn(groups, k_groups, max_m).transpose(1, 2)
    padded = torch.randn(k_groups, groups, max_m + 64)[:, :, :max_m].permute(1, 2, 0)
    single_k_block = torch.randn(groups, max_m, 1)  # strides (max_m, 1, 1): the K-block stride is never used
    single_group = torch.randn(k_groups, max_m).t()[None]  # strides (k_groups * max_m, 1, max_m)
    for sfa in (one_m_major, per_group, padded, single_k_block, single_group):
        assert _masked_sfa_layout(sfa) is sfa, sfa.stride()
    assert masked_sfa_strides(single_k_block) == (max_m, max_m)
    assert masked_sfa_strides(single_group) == (max_m, k_groups * max_m)
    assert masked_sfa_strides(one_m_major) == (groups * max_m, max_m)
    k_major = one_m_major.contiguous()
    odd_stride = torch.randn(k_groups, groups * max_m + 2)[:, : groups * max_m].t().reshape(groups, max_m, k_groups)
    for sfa in (k_major, odd_stride):
        copied = _masked_sfa_layout(sfa)
        assert copied is not sfa and torch.equal(copied, sfa)
        assert copied.stride(1) == 1 and copied.stride(2) % 4 == 0 and copied.stride(0) % 4 == 0


def test_ready_launch_tables_are_bounded() -> None:
    """Both APIs' launch-ready tables go through one helper: an entry is stored as (plan, args), and a full table is
    dropped before the next entry goes in."""
    from deepgemm.api import ready_launches

    table: dict[tuple, object] = {}
    for i in range(ready_launches.CAPACITY):
        ready_launches.remember(table, (i,), "plan", i)
    assert len(table) == ready_launches.CAPACITY and table[(7,)] == ("plan", 7)
    ready_launches.remember(table, ("next",), "plan", -1)
    assert table == {("next",): ("plan", -1)}
