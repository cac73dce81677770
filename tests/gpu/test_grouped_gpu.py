"""MoE grouped FP8 GEMMs on an sm_90 GPU against float64 references: contiguous and masked layouts."""

from __future__ import annotations

import random

import pytest
import torch

import deepgemm
from deepgemm.reference import m_grouped_contiguous_reference, m_grouped_masked_reference
from tests.helpers import assert_close_to_reference, random_activations, random_grouped_weights

pytestmark = pytest.mark.gpu
ALIGN = 128


def contiguous_layout(counts: list[int], extra_padding_segments: int = 0) -> torch.Tensor:
    """m_indices for experts with `counts` rows each, every segment padded to 128 rows with -1."""
    indices: list[int] = []
    for group, count in enumerate(counts):
        padded = -(-count // ALIGN) * ALIGN
        indices += [group] * count + [-1] * (padded - count)
    indices += [-1] * (ALIGN * extra_padding_segments)
    return torch.tensor(indices, dtype=torch.int32)


def poison_padding(a: tuple[torch.Tensor, torch.Tensor], m_indices: torch.Tensor) -> None:
    """Padding rows hold FP8 NaNs and NaN scales: they must not reach any valid output."""
    pad = (m_indices < 0).to(a[0].device)
    a[0].view(torch.uint8)[pad] = 0x7F
    a[1][pad] = float("nan")


def check_contiguous(counts: list[int], n: int, k: int, seed: int, extra_padding_segments: int = 0) -> None:
    check_contiguous_indices(contiguous_layout(counts, extra_padding_segments), len(counts), n, k, seed)


def check_contiguous_indices(m_indices: torch.Tensor, groups: int, n: int, k: int, seed: int) -> None:
    """One contiguous GEMM on a NaN-poisoned output against float64, segment by segment; padding rows zero."""
    a = random_activations(m_indices.numel(), k, "cuda", seed)
    poison_padding(a, m_indices)
    b = random_grouped_weights(groups, n, k, "cuda", seed + 1)
    out = torch.full((m_indices.numel(), n), float("nan"), dtype=torch.bfloat16, device="cuda")
    result = deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices.cuda())
    assert result is out
    valid = m_indices >= 0
    a_clean = (a[0].clone(), a[1].clone())
    a_clean[0].view(torch.uint8)[~valid.cuda()] = 0
    a_clean[1][~valid.cuda()] = 0
    ref = m_grouped_contiguous_reference(a_clean[0], a_clean[1], b[0], b[1], m_indices.cuda(), torch.float64)
    ref_abs = m_grouped_contiguous_reference(a_clean[0].float().abs(), a_clean[1].abs(), b[0].float().abs(), b[1].abs(),
                                             m_indices.cuda(), torch.float64)
    assert (out[~valid.cuda()] == 0).all(), "padding rows must be zero"
    for start in range(0, m_indices.numel(), ALIGN):
        rows = slice(start, start + ALIGN)
        seg_valid = valid[rows].cuda()
        if seg_valid.any():
            assert_close_to_reference(out[rows][seg_valid], ref[rows][seg_valid], ref_abs[rows][seg_valid])


@pytest.mark.parametrize("counts,n,k", [
    ([7400, 8100, 9900, 6500], 4096, 7168),
    ([0, 1, 127, 128, 129, 300, 0, 55], 2056, 7296),
    ([1000], 7168, 2048),
    ([3, 0, 0, 250], 136, 144),
])
def test_contiguous(counts: list[int], n: int, k: int) -> None:
    check_contiguous(counts, n, k, seed=sum(counts) + n)


def test_contiguous_random_experts_with_padding_segment() -> None:
    rng = random.Random(7)
    for trial in range(3):
        groups = rng.choice([1, 9, 64, 256])
        counts = [rng.choice([0, rng.randint(1, 40), rng.randint(1, 300)]) for _ in range(groups)]
        check_contiguous(counts, 512, 1024, seed=trial, extra_padding_segments=1)


def planned_tile(m_total: int, groups: int, n: int, k: int, out_dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import Geometry, get_grouped_plan
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind

    plan = get_grouped_plan(0, GemmKind.GROUPED_CONTIGUOUS, Geometry(rows=m_total, groups=groups), n, k, out_dtype, m_total)
    return plan.spec.config.block_m, plan.spec.config.block_n


def planned_block_m(m_total: int, groups: int, n: int, k: int) -> int:
    return planned_tile(m_total, groups, n, k)[0]


@pytest.fixture
def block_m_256(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """Contiguous plans built with 256 x 128 tiles (the layout's own choice is 128 x 192 wherever those are faster),
    so the half-tile path runs; grouped plans built before or with it are dropped."""
    import deepgemm.kernels.sm90_fp8_gemm_1d2d.heuristics as heuristics
    from deepgemm.api.grouped import clear_grouped_plans

    clear_grouped_plans()
    monkeypatch.setattr(heuristics, "contiguous_tile", lambda *args: (256, 128))
    yield
    clear_grouped_plans()


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_contiguous_long_experts_plan_128x192_tiles(out_dtype: torch.dtype) -> None:
    """The issue-5 layouts run 128 x 192 tiles (measured 6-9% faster than 256 x 128); FP32 output too."""
    counts, n, k = [7400, 8100, 0, 6500], 4096, 7168
    m_indices = contiguous_layout(counts)
    assert planned_tile(m_indices.numel(), len(counts), n, k, out_dtype) == (128, 192)
    a = random_activations(m_indices.numel(), k, "cuda", 21)
    poison_padding(a, m_indices)
    b = random_grouped_weights(len(counts), n, k, "cuda", 22)
    out = torch.full((m_indices.numel(), n), float("nan"), dtype=out_dtype, device="cuda")
    deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices.cuda())
    by_psum = torch.full_like(out, float("nan"))
    deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, by_psum, psum_of(counts).cuda())
    assert torch.equal(by_psum, out)
    valid = (m_indices >= 0).cuda()
    assert (out[~valid] == 0).all()
    a_clean = (a[0].clone(), a[1].clone())
    a_clean[0].view(torch.uint8)[~valid] = 0
    a_clean[1][~valid] = 0
    ref = m_grouped_contiguous_reference(a_clean[0], a_clean[1], b[0], b[1], m_indices.cuda(), torch.float64)
    ref_abs = m_grouped_contiguous_reference(a_clean[0].float().abs(), a_clean[1].abs(), b[0].float().abs(), b[1].abs(),
                                             m_indices.cuda(), torch.float64)
    assert_close_to_reference(out[valid], ref[valid], ref_abs[valid])


def segments(*parts: tuple[int, int]) -> torch.Tensor:
    """m_indices from (group, valid rows) segments, each padded to 128 rows; group -1 (or 0 rows) is a
    segment of padding."""
    indices: list[int] = []
    for group, count in parts:
        padded = max(-(-count // ALIGN), 1) * ALIGN
        indices += ([group] * count + [-1] * (padded - count)) if group >= 0 else [-1] * padded
    return torch.tensor(indices, dtype=torch.int32)


@pytest.mark.usefixtures("block_m_256")
@pytest.mark.parametrize("n,k", [(4096, 7168), (2048, 1024)])
def test_contiguous_block_m_256_half_tiles(n: int, k: int) -> None:
    """Long experts run 256-row tiles; a 256-row block whose halves hold two experts, an expert and padding,
    or padding and an expert runs as two half tiles. Every kind of boundary is in this layout."""
    m_indices = segments((0, 1000), (-1, 128), (1, 1100), (2, 0), (3, 2300), (4, 129), (5, 3000), (-1, 128),
                         (6, 1900))
    groups = 7
    assert m_indices.numel() % 256 == 128  # and a tail block with one half
    assert planned_block_m(m_indices.numel(), groups, n, k) == 256
    starts = {int(s) for s in range(0, m_indices.numel(), ALIGN)}
    first = {s: int(m_indices[s]) for s in starts}
    pairs = {(first[s], first[s + ALIGN]) for s in starts if s % 256 == 0 and s + ALIGN in starts}
    assert any(a >= 0 and b >= 0 and a != b for a, b in pairs), "two experts in one block"
    assert any(a >= 0 > b for a, b in pairs) and any(b >= 0 > a for a, b in pairs), "expert/padding halves"
    check_contiguous_indices(m_indices, groups, n, k, seed=n)


@pytest.mark.usefixtures("block_m_256")
def test_contiguous_psum_block_m_256_matches_m_indices_form() -> None:
    counts = [1000, 1100, 0, 2300, 129, 3000]
    m_indices = contiguous_layout(counts, extra_padding_segments=1)
    assert planned_block_m(m_indices.numel(), len(counts), 4096, 2048) == 256
    a = random_activations(m_indices.numel(), 2048, "cuda", 5)
    poison_padding(a, m_indices)
    b = random_grouped_weights(len(counts), 4096, 2048, "cuda", 6)
    by_psum = torch.full((m_indices.numel(), 4096), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, by_psum, psum_of(counts).cuda())
    by_index = torch.full_like(by_psum, float("nan"))
    deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, by_index, m_indices.cuda())
    assert torch.equal(by_psum, by_index)
    check_contiguous(counts, 4096, 2048, seed=11, extra_padding_segments=1)


@pytest.mark.usefixtures("block_m_256")
def test_contiguous_block_m_256_on_few_sms(monkeypatch: pytest.MonkeyPatch) -> None:
    """With fewer CTAs than N-blocks one CTA visits an M-block once per N-block; the psum cursor must still
    find the block's first half (a look-ahead that moved it past there zeroed those rows). The layout also
    ends in a block with one half."""
    import deepgemm.kernels.sm90_fp8_gemm_1d2d.plan as plan_module

    monkeypatch.setattr(plan_module, "sm_count", lambda device_index: 16)
    counts, n, k = [1000, 1100, 0, 2300, 129, 3000], 4096, 1152  # a (n, k) no other test plans
    m_indices = contiguous_layout(counts, extra_padding_segments=2)
    assert m_indices.numel() % 256 == 128
    assert planned_block_m(m_indices.numel(), len(counts), n, k) == 256
    a = random_activations(m_indices.numel(), k, "cuda", 9)
    poison_padding(a, m_indices)
    b = random_grouped_weights(len(counts), n, k, "cuda", 10)
    by_psum = torch.full((m_indices.numel(), n), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, by_psum, psum_of(counts).cuda())
    by_index = torch.full_like(by_psum, float("nan"))
    deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, by_index, m_indices.cuda())
    assert torch.equal(by_psum, by_index)
    check_contiguous_indices(m_indices, len(counts), n, k, seed=9)


def psum_of(counts: list[int]) -> torch.Tensor:
    """Cumulative valid-row ends of the aligned contiguous layout (what the psum form takes)."""
    ends, start = [], 0
    for count in counts:
        ends.append(start + count)
        start += -(-count // ALIGN) * ALIGN
    return torch.tensor(ends, dtype=torch.int32)


@pytest.mark.parametrize("counts,n,k,out_dtype", [
    ([0, 1, 127, 128, 129, 300, 0, 55], 2056, 7296, torch.bfloat16),
    ([7400, 8100, 0, 6500], 4096, 7168, torch.bfloat16),
    ([3, 0, 0, 250, 128], 136, 144, torch.float32),
])
def test_contiguous_psum_matches_m_indices_form(counts: list[int], n: int, k: int, out_dtype: torch.dtype) -> None:
    """The psum form computes exactly what the m_indices form computes (same tiles, same MMAs), padding zeroed."""
    m_indices = contiguous_layout(counts, extra_padding_segments=1)
    a = random_activations(m_indices.numel(), k, "cuda", len(counts))
    poison_padding(a, m_indices)
    b = random_grouped_weights(len(counts), n, k, "cuda", n)
    by_psum = torch.full((m_indices.numel(), n), float("nan"), dtype=out_dtype, device="cuda")
    deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, by_psum, psum_of(counts).cuda())
    by_index = torch.full_like(by_psum, float("nan"))
    deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, by_index, m_indices.cuda())
    assert torch.equal(by_psum, by_index)
    assert (by_psum[(m_indices < 0).cuda()] == 0).all()
    check_contiguous(counts, n, k, seed=n + k)  # the m_indices form itself against float64


def test_contiguous_psum_graph_replay_with_new_ends() -> None:
    counts, n, k = [200, 0, 90, 300], 512, 1024
    m_total = sum(-(-c // ALIGN) * ALIGN for c in counts)
    a = random_activations(m_total, k, "cuda", 3)
    b = random_grouped_weights(len(counts), n, k, "cuda", 4)
    psum = psum_of(counts).cuda()
    out = torch.full((m_total, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, out, psum)  # warm up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, out, psum)
    for new_counts in ([128, 128, 0, 256], [1, 0, 0, 5], [0, 0, 0, 0]):
        assert sum(-(-c // ALIGN) * ALIGN for c in new_counts) <= m_total
        psum.copy_(psum_of(new_counts))
        out.fill_(float("nan"))
        graph.replay()
        expected = torch.full_like(out, float("nan"))
        from deepgemm.reference import m_indices_from_psum

        deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, expected, m_indices_from_psum(psum.cpu(), m_total).cuda())
        assert torch.equal(out, expected), f"replay with counts {new_counts}"


def test_contiguous_rejects_unaligned_total() -> None:
    a = random_activations(130, 256, "cuda", 0)
    b = random_grouped_weights(2, 128, 256, "cuda", 1)
    out = torch.empty(130, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="multiple of 128"):
        deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, torch.zeros(130, dtype=torch.int32, device="cuda"))


def masked_inputs(groups: int, max_m: int, n: int, k: int, seed: int):
    a2d = random_activations(groups * max_m, k, "cuda", seed)
    a = (a2d[0].view(groups, max_m, k), a2d[1].reshape(groups, max_m, -1))
    return a, random_grouped_weights(groups, n, k, "cuda", seed + 1)


def check_masked(out: torch.Tensor, a, b, masked_m: torch.Tensor) -> None:
    ref = m_grouped_masked_reference(a[0], a[1], b[0], b[1], masked_m, torch.float64)
    ref_abs = m_grouped_masked_reference(a[0].float().abs(), a[1].abs(), b[0].float().abs(), b[1].abs(), masked_m,
                                         torch.float64)
    for group, count in enumerate(masked_m.tolist()):
        if count:
            assert_close_to_reference(out[group, :count], ref[group, :count], ref_abs[group, :count])
        untouched_from = -(-count // 64) * 64
        assert out[group, untouched_from:].isnan().all(), "rows in blocks past masked_m must stay untouched"


@pytest.mark.parametrize("groups,max_m,n,k", [(1, 4096, 4096, 7168), (4, 256, 7168, 2048), (32, 128, 4096, 7168),
                                              (6, 64, 136, 7296)])
def test_masked(groups: int, max_m: int, n: int, k: int) -> None:
    a, b = masked_inputs(groups, max_m, n, k, seed=groups + n)
    rng = random.Random(groups)
    counts = [rng.choice([0, max_m, rng.randint(1, max_m)]) for _ in range(groups)]
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    out = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected_m=max(1, sum(counts) // groups))
    check_masked(out, a, b, masked_m.cpu())


def test_masked_graph_replay_with_new_counts() -> None:
    groups, max_m, n, k = 8, 128, 2048, 7168
    a, b = masked_inputs(groups, max_m, n, k, seed=11)
    masked_m = torch.full((groups,), 17, dtype=torch.int32, device="cuda")
    out = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected_m=16)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected_m=16)
    for counts in ([0, 1, 64, 65, 128, 3, 0, 100], [128] * 8):
        masked_m.copy_(torch.tensor(counts, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_masked(out, a, b, masked_m.cpu())


@pytest.fixture
def masked_block_m_256(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """Masked plans (and the CPU path's tile rule) use 256 x 128 tiles while the test runs (the tile rule picks them
    only where their expected time over the routing spread is lowest)."""
    import deepgemm.kernels.sm90_fp8_gemm_1d2d.heuristics as heuristics
    from deepgemm.api.grouped import clear_grouped_plans

    clear_grouped_plans()
    monkeypatch.setattr(heuristics, "masked_tile", lambda *args: (256, 128))
    yield
    clear_grouped_plans()


@pytest.mark.parametrize("block_n", [16, 32])
def test_masked_narrow_tiles(block_n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Masked 64-row tiles of 16 or 32 columns (their TMA producer is an elected lane, loading A in 16-row boxes):
    empty, partial and full groups, N tails past the last full block."""
    import deepgemm.kernels.sm90_fp8_gemm_1d2d.heuristics as heuristics
    from deepgemm.api.grouped import clear_grouped_plans
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.grouped_heuristics import masked_config_m
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import Geometry, get_grouped_plan
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind

    clear_grouped_plans()
    monkeypatch.setattr(heuristics, "masked_tile", lambda *args: (64, block_n))
    groups, max_m, n, k, expected_m = 5, 128, 1064, 7168, 42
    a, b = masked_inputs(groups, max_m, n, k, seed=block_n)
    masked_m = torch.tensor([0, 1, 17, 128, 65], dtype=torch.int32, device="cuda")
    out = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    try:
        geometry = Geometry(rows=groups * max_m, groups=groups, max_m=max_m, tiles_known=False)
        plan = get_grouped_plan(0, GemmKind.GROUPED_MASKED, geometry, n, k, torch.bfloat16,
                                masked_config_m(expected_m, max_m))
        assert (plan.spec.config.block_m, plan.spec.config.block_n) == (64, block_n)
        deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected_m=expected_m)
    finally:
        clear_grouped_plans()
    check_masked(out, a, b, masked_m.cpu())


@pytest.mark.usefixtures("masked_block_m_256")
def test_masked_block_m_256_tails() -> None:
    """256-row masked tiles (long K): a group's last tile computes (and stores) only the 64-row pieces that start
    below masked_m, like 128-row tiles do."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import Geometry, get_grouped_plan
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind

    groups, max_m, n, k = 4, 1024, 2048, 7168
    geometry = Geometry(rows=groups * max_m, groups=groups, max_m=max_m, tiles_known=False)
    plan = get_grouped_plan(0, GemmKind.GROUPED_MASKED, geometry, n, k, torch.bfloat16, 512)
    assert plan.spec.config.block_m == 256
    a, b = masked_inputs(groups, max_m, n, k, seed=21)
    for counts in ([1024, 300, 0, 129], [64, 1000, 257, 1]):
        masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
        out = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected_m=512)
        check_masked(out, a, b, masked_m.cpu())


@pytest.mark.parametrize("block_m,expected_m,counts", [
    (64, 16, [16, 32, 48, 15, 17, 33, 49, 63]),
    (128, 64, [64, 65, 127, 1, 128, 0, 80, 45]),
    (256, 512, [64, 1000, 257, 1]),
], ids=lambda v: str(v))
def test_masked_loads_only_the_a_rows_a_tile_needs(block_m: int, expected_m: int, counts: list[int],
                                                   request: pytest.FixtureRequest) -> None:
    """Masked tiles load A in 16-row (block_m 64) or 64-row boxes, as many as their valid rows need: counts
    on and around the box edges, including FP32 output (block_m 256, forced, then stores in chunks)."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.grouped_heuristics import masked_config_m

    if block_m == 256:
        request.getfixturevalue("masked_block_m_256")
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import Geometry, get_grouped_plan
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind

    groups, n = len(counts), 4096
    max_m, k, out_dtype = (1024, 7168, torch.float32) if block_m == 256 else (128, 7168, torch.bfloat16)
    geometry = Geometry(rows=groups * max_m, groups=groups, max_m=max_m, tiles_known=False)
    plan = get_grouped_plan(0, GemmKind.GROUPED_MASKED, geometry, n, k, out_dtype, masked_config_m(expected_m, max_m))
    assert plan.spec.config.block_m == block_m
    a, b = masked_inputs(groups, max_m, n, k, seed=block_m)
    masked_m = torch.tensor(counts, dtype=torch.int32, device="cuda")
    out = torch.full((groups, max_m, n), float("nan"), dtype=out_dtype, device="cuda")
    deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected_m=expected_m)
    check_masked(out, a, b, masked_m.cpu())


def _must_not_run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
    raise AssertionError("a warm call went through validation")


def test_masked_warm_calls_read_current_counts_and_operands(monkeypatch: pytest.MonkeyPatch) -> None:
    """A repeated argument set launches through the remembered plan and arguments (validation is patched to fail),
    and still reads masked_m, A and its scales as they are now; scales that need a layout copy (K-major) are never
    remembered, so their new values reach the kernel too. Bad arguments after a warm call are still rejected."""
    from deepgemm.api import grouped

    monkeypatch.setattr(grouped, "_ready", {})
    groups, max_m, n, k = 4, 128, 256, 512
    a, b = masked_inputs(groups, max_m, n, k, seed=31)  # scales: a view of one M-major [G * max_m, K/128] tensor
    masked_m = torch.tensor([5, 128, 0, 64], dtype=torch.int32, device="cuda")
    out = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected_m=48)
    check_masked(out, a, b, masked_m.cpu())
    key = grouped._metadata_key(grouped._masked_form(48), a[0], a[1], b[0], b[1], out, masked_m)
    assert list(grouped._ready) == [key]
    fresh, _ = masked_inputs(groups, max_m, n, k, seed=32)
    a[0].copy_(fresh[0])
    a[1].copy_(fresh[1])
    masked_m.copy_(torch.tensor([128, 1, 65, 0], dtype=torch.int32))
    out.fill_(float("nan"))
    with monkeypatch.context() as patch:
        patch.setattr(grouped, "require_pair", _must_not_run)
        deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected_m=48)
    check_masked(out, a, b, masked_m.cpu())

    # K-major scales are copied into the kernel's layout on every call, and never remembered.
    a_k_major = (a[0], a[1].contiguous())
    deepgemm.m_grouped_fp8_gemm_nt_masked(a_k_major, b, out, masked_m, expected_m=48)
    a_k_major[1].mul_(2.0)
    out.fill_(float("nan"))
    deepgemm.m_grouped_fp8_gemm_nt_masked(a_k_major, b, out, masked_m, expected_m=48)
    check_masked(out, a_k_major, b, masked_m.cpu())
    assert list(grouped._ready) == [key]

    with pytest.raises(ValueError, match="expected_m"):
        deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected_m=48.0)
    with pytest.raises(TypeError, match="out"):
        deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out.view(torch.float16), masked_m, expected_m=48)


def test_contiguous_warm_calls_read_current_expert_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm contiguous calls (m_indices and psum forms) take the remembered launch (validation is patched to fail)
    and read the grouping tensor's current contents: experts reassigned in place get their new weights."""
    from deepgemm.api import grouped

    monkeypatch.setattr(grouped, "_ready", {})
    counts, n, k = [200, 56, 300], 384, 1024
    m_indices = contiguous_layout(counts).cuda()
    a = random_activations(m_indices.numel(), k, "cuda", 41)
    b = random_grouped_weights(len(counts), n, k, "cuda", 42)
    out = torch.full((m_indices.numel(), n), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices)
    assert list(grouped._ready) == [grouped._metadata_key(grouped._CONTIGUOUS_FORM, a[0], a[1], b[0], b[1], out, m_indices)]
    m_indices.copy_(torch.where(m_indices >= 0, (m_indices + 1) % len(counts), m_indices))
    out.fill_(float("nan"))
    with monkeypatch.context() as patch:
        patch.setattr(grouped, "_check_contiguous", _must_not_run)
        deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices)
    ref = m_grouped_contiguous_reference(a[0], a[1], b[0], b[1], m_indices, torch.float64)
    ref_abs = m_grouped_contiguous_reference(a[0].float().abs(), a[1].abs(), b[0].float().abs(), b[1].abs(), m_indices,
                                             torch.float64)
    valid = m_indices >= 0
    assert (out[~valid] == 0).all()
    assert_close_to_reference(out[valid], ref[valid], ref_abs[valid])

    psum = psum_of(counts).cuda()
    by_psum = torch.full_like(out, float("nan"))
    deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, by_psum, psum)
    assert grouped._metadata_key(grouped._PSUM_FORM, a[0], a[1], b[0], b[1], by_psum, psum) in grouped._ready
    by_psum.fill_(float("nan"))
    with monkeypatch.context() as patch:
        patch.setattr(grouped, "_check_contiguous", _must_not_run)
        deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, by_psum, psum)
    by_index = torch.full_like(out, float("nan"))
    deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, by_index, contiguous_layout(counts).cuda())
    assert torch.equal(by_psum, by_index)


@pytest.mark.parametrize("layout", ["per_group_m_major", "one_m_major_tensor", "padded_group_stride", "k_major",
                                    "single_k_block"])
def test_masked_scale_layouts(layout: str) -> None:
    """Scales M-major per group, a view of one M-major tensor, with a padded group stride, or [G, max_m, 1] at
    K = 128 (any K-block stride) are read in place through the 3-D descriptor (no copy); K-major ones are copied.
    Each matches the float64 reference on every valid row, including groups whose rows end inside a box."""
    from deepgemm.api.grouped import _masked_sfa_layout

    groups, max_m, n, k = 3, 192, 256, 128 if layout == "single_k_block" else 1024
    a, b = masked_inputs(groups, max_m, n, k, seed=51)
    k_groups = k // 128
    if layout == "per_group_m_major":
        storage = torch.empty(groups, k_groups, max_m, device="cuda")
        storage.copy_(a[1].transpose(1, 2))
        sfa = storage.transpose(1, 2)
    elif layout == "padded_group_stride":
        storage = torch.empty(k_groups, groups * (max_m + 64), device="cuda")
        sfa = storage.view(k_groups, groups, max_m + 64)[:, :, :max_m].permute(1, 2, 0)
        sfa.copy_(a[1])
    elif layout == "one_m_major_tensor":
        sfa = a[1]
    elif layout == "single_k_block":
        sfa = a[1].contiguous()  # strides (max_m, 1, 1): the K-block stride is never used
    else:
        sfa = a[1].contiguous()
    assert (_masked_sfa_layout(sfa) is sfa) == (layout != "k_major")
    a = (a[0], sfa)
    masked_m = torch.tensor([192, 70, 129], dtype=torch.int32, device="cuda")
    out = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected_m=100)
    check_masked(out, a, b, masked_m.cpu())
