"""Grouping tensors with malformed values on an sm_90 GPU: the kernels compute what the documented reading says and
what the CPU path computes, on block_m 64, 128 and 256 tiles (forced through the tile rule).

For each layout of tests/grouped_layout_cases.py (two experts in a segment, a segment or half starting with -1,
out-of-range expert ids; decreasing, negative or out-of-range psum; negative or over-range masked_m): the kernel's
rows with an expert against float64 (deepgemm.reference with the tile's lookup), its zero rows exactly zero, masked
rows past the written blocks untouched (NaN); then the public function on CPU copies (the reference path, which asks
the same tile rule) against the same float64 product and the kernel's output (calc_diff, FP8 tolerance).
"""

from __future__ import annotations

import pytest
import torch

import deepgemm
from deepgemm.reference import (
    contiguous_row_experts,
    m_grouped_contiguous_reference,
    m_grouped_masked_reference,
    m_indices_from_psum,
)
from tests.gpu.checks import masked_operands, nan_like_out
from tests.gpu.guard import GEMM_ENTRY
from tests.grouped_layout_cases import M_INDICES_CASES, MASKED_CASES, PSUM_CASES, SEGMENT, rule_masked
from tests.helpers import assert_close_to_reference, random_activations, random_grouped_weights

pytestmark = pytest.mark.gpu

N, K = 256, 512  # two N-blocks of 128 columns, four K blocks: one kernel per (form, block_m)
BLOCK_MS = (64, 128, 256)
QUICK_M_INDICES = {"two experts in one segment", "segment starting with -1", "second half of another expert"}


@pytest.fixture
def force_block_m(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """force_block_m(bm): grouped plans (and the CPU path's tile rule) use bm x 128 tiles from then on."""
    import deepgemm.kernels.sm90_fp8_gemm_1d2d.heuristics as heuristics
    from deepgemm.api.grouped import clear_grouped_plans

    def force(block_m: int) -> None:
        clear_grouped_plans()  # (also the reference path's memo of the tile rule)
        monkeypatch.setattr(heuristics, "contiguous_tile", lambda *args: (block_m, 128))
        monkeypatch.setattr(heuristics, "masked_tile", lambda *args: (block_m, 128))

    yield force
    clear_grouped_plans()


def _planned_block_m(kind_name: str, rows: int, groups: int, config_m: int, max_m: int = 0) -> int:
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import Geometry, get_grouped_plan
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind

    masked = kind_name == "GROUPED_MASKED"
    geometry = Geometry(rows=rows, groups=groups, max_m=max_m, tiles_known=False) if masked else \
        Geometry(rows=rows, groups=groups)
    plan = get_grouped_plan(0, getattr(GemmKind, kind_name), geometry, N, K, torch.bfloat16, config_m)
    return plan.spec.config.block_m


def _cpu(pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return pair[0].cpu(), pair[1].cpu()


def _check_contiguous(out: torch.Tensor, a, b, indices: torch.Tensor, lookup: int, what: str) -> None:  # noqa: ANN001
    """Rows the reading gives an expert against float64; the other rows exactly zero."""
    device = out.device
    experts = contiguous_row_experts(indices.to(device), b[0].shape[0], lookup)
    zero = experts < 0
    assert (out[zero] == 0).all(), f"{what}: rows the kernel reads as padding must be zero"
    if (~zero).any():
        ref = m_grouped_contiguous_reference(a[0], a[1], b[0], b[1], indices.to(device), torch.float64,
                                             lookup_rows=lookup)
        ref_abs = m_grouped_contiguous_reference(a[0].float().abs(), a[1].abs(), b[0].float().abs(), b[1].abs(),
                                                 indices.to(device), torch.float64, lookup_rows=lookup)
        try:
            assert_close_to_reference(out[~zero], ref[~zero], ref_abs[~zero])
        except AssertionError as error:
            raise AssertionError(f"{what}: {error}") from None


def _contiguous_params() -> list:
    return [pytest.param(name, block_m, id=f"{block_m}-{name}",
                         marks=[pytest.mark.quick] if block_m in (64, 128) and name in QUICK_M_INDICES else [])
            for block_m in BLOCK_MS for name in M_INDICES_CASES]


@pytest.mark.parametrize("name,block_m", _contiguous_params())
def test_malformed_m_indices_match_the_reference_on_every_tile(name: str, block_m: int, force_block_m, seed: int,
                                                               gpu_guard) -> None:  # noqa: ANN001
    groups, values = M_INDICES_CASES[name]
    force_block_m(block_m)
    m_total = len(values)
    assert _planned_block_m("GROUPED_CONTIGUOUS", m_total, groups, m_total) == block_m
    indices = torch.tensor(values, dtype=torch.int32)
    a = random_activations(m_total, K, "cuda", seed)
    b = random_grouped_weights(groups, N, K, "cuda", seed + 1)
    out = nan_like_out((m_total, N), torch.bfloat16)
    before = gpu_guard.launches(GEMM_ENTRY)
    assert deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, indices.cuda()) is out
    assert gpu_guard.launches(GEMM_ENTRY) > before, "no GEMM kernel launched"
    lookup = min(block_m, SEGMENT)
    _check_contiguous(out, a, b, indices, lookup, f"kernel, block_m {block_m}")

    cpu_out = nan_like_out((m_total, N), torch.bfloat16, "cpu")
    deepgemm.m_grouped_fp8_gemm_nt_contiguous(_cpu(a), _cpu(b), cpu_out, indices)
    _check_contiguous(cpu_out, _cpu(a), _cpu(b), indices, lookup, "CPU path")
    if (contiguous_row_experts(indices, groups, lookup) >= 0).any():  # (calc_diff of two zero tensors is NaN)
        assert deepgemm.calc_diff(out.cpu().double(), cpu_out.double()) < 1e-3


@pytest.mark.parametrize("block_m", BLOCK_MS)
@pytest.mark.parametrize("name", list(PSUM_CASES))
def test_malformed_psum_matches_the_reference_on_every_tile(name: str, block_m: int, force_block_m, seed: int,
                                                            gpu_guard) -> None:  # noqa: ANN001
    ends, m_total = PSUM_CASES[name]
    groups = len(ends)
    force_block_m(block_m)
    assert _planned_block_m("GROUPED_CONTIGUOUS_PSUM", m_total, groups, m_total) == block_m
    psum = torch.tensor(ends, dtype=torch.int32)
    a = random_activations(m_total, K, "cuda", seed)
    b = random_grouped_weights(groups, N, K, "cuda", seed + 1)
    out = nan_like_out((m_total, N), torch.bfloat16)
    before = gpu_guard.launches(GEMM_ENTRY)
    assert deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, out, psum.cuda()) is out
    assert gpu_guard.launches(GEMM_ENTRY) > before, "no GEMM kernel launched"
    indices = m_indices_from_psum(psum, m_total)  # the documented reading, the same for every tile
    _check_contiguous(out, a, b, indices, SEGMENT, f"kernel, block_m {block_m}")

    cpu_out = nan_like_out((m_total, N), torch.bfloat16, "cpu")
    deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(_cpu(a), _cpu(b), cpu_out, psum)
    _check_contiguous(cpu_out, _cpu(a), _cpu(b), indices, SEGMENT, "CPU path")
    if (indices >= 0).any():
        assert deepgemm.calc_diff(out.cpu().double(), cpu_out.double()) < 1e-3


@pytest.mark.parametrize("block_m", BLOCK_MS)
@pytest.mark.parametrize("name", list(MASKED_CASES))
def test_malformed_masked_m_matches_the_reference_on_every_tile(name: str, block_m: int, force_block_m, seed: int,
                                                                gpu_guard) -> None:  # noqa: ANN001
    counts, max_m = MASKED_CASES[name]
    groups = len(counts)
    force_block_m(block_m)
    assert _planned_block_m("GROUPED_MASKED", groups * max_m, groups, max_m, max_m) == block_m
    a, b = masked_operands(groups, max_m, N, K, seed)
    masked_m = torch.tensor(counts, dtype=torch.int32)
    out = nan_like_out((groups, max_m, N), torch.bfloat16)
    before = gpu_guard.launches(GEMM_ENTRY)
    assert deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m.cuda(), expected_m=max_m) is out
    assert gpu_guard.launches(GEMM_ENTRY) > before, "no GEMM kernel launched"
    cpu_out = nan_like_out((groups, max_m, N), torch.bfloat16, "cpu")
    deepgemm.m_grouped_fp8_gemm_nt_masked(_cpu(a), _cpu(b), cpu_out, masked_m, expected_m=max_m)

    ref = m_grouped_masked_reference(a[0], a[1], b[0], b[1], masked_m, torch.float64)
    ref_abs = m_grouped_masked_reference(a[0].float().abs(), a[1].abs(), b[0].float().abs(), b[1].abs(), masked_m,
                                         torch.float64)
    for group, (valid, written) in enumerate(rule_masked(counts, max_m)):
        if valid:
            for what, result in (("kernel", out[group, :valid]), ("CPU path", cpu_out[group, :valid].cuda())):
                try:
                    assert_close_to_reference(result, ref[group, :valid], ref_abs[group, :valid])
                except AssertionError as error:
                    raise AssertionError(f"{what}, expert {group} (masked_m {counts[group]}): {error}") from None
        assert out[group, written:].isnan().all(), f"expert {group}: kernel rows past its written blocks touched"
        assert cpu_out[group, valid:].isnan().all(), f"expert {group}: CPU rows past masked_m touched"


def test_check_grouped_layout_refuses_to_read_under_capture() -> None:
    """The check copies the tensor to the host; under capture on its device that is refused before any copy."""
    m_indices = torch.zeros(SEGMENT, dtype=torch.int32, device="cuda")
    deepgemm.check_grouped_layout(num_groups=1, m_indices=m_indices)  # eagerly: fine
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(deepgemm.GraphCaptureError, match="before capturing"):
        with torch.cuda.graph(graph):
            deepgemm.check_grouped_layout(num_groups=1, m_indices=m_indices)
