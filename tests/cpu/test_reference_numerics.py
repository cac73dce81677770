"""fp8_gemm_nt on CPU tensors (the reference path) against an independent float64 computation.

The expected values are built here from first principles: the FP8 operands are decoded to float64,
each 1x128 (A) / 128x128 (B) block is multiplied by its scale with explicit reshapes, and the
product is taken in float64. Nothing from deepgemm.reference is used.
"""

from __future__ import annotations

import math

import pytest
import torch

import deepgemm
from deepgemm.utils import calc_diff

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def _gen(seed: int | None = None) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(torch.seed() % (2**31) if seed is None else seed)
    return gen


def random_fp8(rows: int, cols: int, gen: torch.Generator, spread: float = 60.0) -> torch.Tensor:
    """Random e4m3 values (normal, clamped to the finite range, so never NaN)."""
    x = torch.randn(rows, cols, generator=gen, dtype=torch.float32) * spread
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(FP8)


def random_scales(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """Positive float32 scales spanning a few orders of magnitude (so a misplaced scale shows)."""
    return torch.exp(torch.randn(rows, cols, generator=gen, dtype=torch.float64) * 1.5).float() * 1e-2


def make_operands(m: int, n: int, k: int, gen: torch.Generator):
    kg = math.ceil(k / 128)
    a = random_fp8(m, k, gen)
    b = random_fp8(n, k, gen)
    sfa = random_scales(m, kg, gen)
    sfb = random_scales(math.ceil(n / 128), kg, gen)
    return a, sfa, b, sfb


def expected_fp64(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor) -> torch.Tensor:
    """(A * sfa) @ (B * sfb)^T in float64, with the scale broadcasting done by padded reshapes."""
    m, k = a.shape
    n = b.shape[0]
    kg = math.ceil(k / 128)
    nb = math.ceil(n / 128)
    k_pad = kg * 128
    a64 = torch.zeros(m, k_pad, dtype=torch.float64)
    a64[:, :k] = a.to(torch.float64)
    a64 = (a64.view(m, kg, 128) * sfa.to(torch.float64).view(m, kg, 1)).view(m, k_pad)[:, :k]
    b64 = torch.zeros(nb * 128, k_pad, dtype=torch.float64)
    b64[:n, :k] = b.to(torch.float64)
    b64 = (b64.view(nb, 128, kg, 128) * sfb.to(torch.float64).view(nb, 1, kg, 1)).view(nb * 128, k_pad)[:n, :k]
    return a64 @ b64.t()


def expected_abs_fp64(a, sfa, b, sfb) -> torch.Tensor:
    return expected_fp64(a.float().abs().to(FP8), sfa, b.float().abs().to(FP8), sfb)


def expected_by_loops(a, sfa, b, sfb) -> torch.Tensor:
    """Same product with explicit per-K-block loops (only for small shapes)."""
    m, k = a.shape
    n = b.shape[0]
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    out = torch.zeros(m, n, dtype=torch.float64)
    for g in range(math.ceil(k / 128)):
        lo, hi = g * 128, min(k, (g + 1) * 128)
        partial = a64[:, lo:hi] @ b64[:, lo:hi].t()  # [m, n]
        row_scale = sfa[:, g].to(torch.float64).view(m, 1)
        col_scale = torch.tensor([float(sfb[j // 128, g]) for j in range(n)], dtype=torch.float64).view(1, n)
        out += partial * row_scale * col_scale
    return out


def assert_matches(out: torch.Tensor, a, sfa, b, sfb, out_dtype: torch.dtype) -> None:
    ref = expected_fp64(a, sfa, b, sfb)
    ref_abs = expected_abs_fp64(a, sfa, b, sfb)
    assert out.shape == ref.shape
    assert out.dtype == out_dtype
    out64 = out.to(torch.float64)
    assert torch.isfinite(out64).all()
    if ref.numel():
        diff = calc_diff(out64, ref)
        assert diff < 1e-5, f"calc_diff {diff:.3e}"
    # Element-wise: the output rounding plus a worst-case float32 error for dequantizing (2 roundings
    # per product) and summing K products (K - 1 roundings): (K + 2) * 2^-24 * sum |products|.
    rounding = 2.0**-8 if out_dtype == torch.bfloat16 else 2.0**-23
    k = a.shape[1]
    tol = rounding * ref.abs() + (k + 2) * 2.0**-24 * ref_abs + 1e-30
    err = (out64 - ref).abs()
    assert (err <= tol).all(), f"max excess {(err - tol).max().item():.3e}"


@pytest.mark.parametrize("m", [1, 7, 65, 129])
@pytest.mark.parametrize("n", [8, 136, 200])
@pytest.mark.parametrize("k", [16, 128, 144, 304])
def test_reference_matches_float64(m: int, n: int, k: int) -> None:
    gen = _gen()
    a, sfa, b, sfb = make_operands(m, n, k, gen)
    out = deepgemm.fp8_gemm_nt((a, sfa), (b, sfb), out_dtype=torch.float32)
    assert_matches(out, a, sfa, b, sfb, torch.float32)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32, None])
@pytest.mark.parametrize("m,n,k", [(65, 200, 304), (129, 136, 144), (7, 8, 1008)])
def test_out_dtypes(m: int, n: int, k: int, out_dtype) -> None:
    gen = _gen()
    a, sfa, b, sfb = make_operands(m, n, k, gen)
    out = deepgemm.fp8_gemm_nt((a, sfa), (b, sfb), out_dtype=out_dtype)
    assert_matches(out, a, sfa, b, sfb, out_dtype or torch.bfloat16)


def test_explicit_loops_agree_with_reshapes() -> None:
    """Cross-check the test's own float64 expectation two ways, and the library against both."""
    gen = _gen()
    a, sfa, b, sfb = make_operands(9, 260, 304, gen)
    by_reshape = expected_fp64(a, sfa, b, sfb)
    by_loops = expected_by_loops(a, sfa, b, sfb)
    assert calc_diff(by_reshape, by_loops) < 1e-14
    out = deepgemm.fp8_gemm_nt((a, sfa), (b, sfb), out_dtype=torch.float32)
    assert calc_diff(out, by_loops) < 1e-5


def test_exact_small_product() -> None:
    """A case small enough to compute by hand: every value and scale is a power of two."""
    # K padded with zero columns to 16 (the kernels' TMA rule, checked on every path); zeros add nothing.
    a = torch.nn.functional.pad(torch.tensor([[2.0, -1.0], [0.5, 4.0]]), (0, 14)).to(FP8)
    b = torch.nn.functional.pad(torch.tensor([[3.0, 1.0], [1.0, 1.0], [-2.0, 0.25]]), (0, 14)).to(FP8)
    sfa = torch.tensor([[0.5], [2.0]])
    sfb = torch.tensor([[0.25]])
    out = deepgemm.fp8_gemm_nt((a, sfa), (b, sfb), out_dtype=torch.float32)
    # row 0: 0.5*0.25*(2*[3,1,-2] - [1,1,0.25]) = 0.125*[5, 1, -4.25]
    # row 1: 2*0.25*(0.5*[3,1,-2] + 4*[1,1,0.25]) = 0.5*[5.5, 4.5, 0]
    expected = torch.tensor([[0.625, 0.125, -0.53125], [2.75, 2.25, 0.0]])
    assert torch.equal(out, expected)


def test_scale_blocks_are_applied_to_the_right_rows_and_columns() -> None:
    """All-ones operands: D[i, j] = sum_g sfa[i, g] * sfb[j // 128, g] * (block length of g)."""
    m, n, k = 3, 304, 304
    a = torch.ones(m, k).to(FP8)
    b = torch.ones(n, k).to(FP8)
    sfa = torch.tensor([[1.0, 2.0, 4.0], [8.0, 16.0, 32.0], [64.0, 128.0, 256.0]])
    sfb = torch.tensor([[1.0, 1 / 2, 1 / 4], [1 / 8, 1 / 16, 1 / 32], [1 / 64, 1 / 128, 1 / 256]])
    out = deepgemm.fp8_gemm_nt((a, sfa), (b, sfb), out_dtype=torch.float32)
    lengths = [128, 128, 48]
    for i in range(m):
        for j in (0, 127, 128, 255, 256, 303):
            want = sum(float(sfa[i, g]) * float(sfb[j // 128, g]) * lengths[g] for g in range(3))
            assert out[i, j].item() == pytest.approx(want, rel=1e-6), (i, j)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_out_poisoned_with_nan_is_overwritten_and_returned(out_dtype: torch.dtype) -> None:
    gen = _gen()
    m, n, k = 65, 136, 304
    a, sfa, b, sfb = make_operands(m, n, k, gen)
    out = torch.full((m, n), float("nan"), dtype=out_dtype)
    result = deepgemm.fp8_gemm_nt((a, sfa), (b, sfb), out)
    assert result is out
    assert not torch.isnan(out).any()
    assert_matches(out, a, sfa, b, sfb, out_dtype)


def test_out_view_writes_only_its_own_elements() -> None:
    """A narrowed `out` view is written in place; the padding columns of its storage stay untouched."""
    gen = _gen()
    m, n, k = 7, 200, 144
    a, sfa, b, sfb = make_operands(m, n, k, gen)
    storage = torch.full((m, 208), float("nan"), dtype=torch.bfloat16)
    out = storage[:, :n]
    result = deepgemm.fp8_gemm_nt((a, sfa), (b, sfb), out)
    assert result is out
    assert_matches(out, a, sfa, b, sfb, torch.bfloat16)
    assert torch.isnan(storage[:, n:]).all()


def test_inputs_are_not_modified() -> None:
    gen = _gen()
    a, sfa, b, sfb = make_operands(65, 200, 304, gen)
    copies = [t.clone() for t in (a.view(torch.uint8), sfa, b.view(torch.uint8), sfb)]
    deepgemm.fp8_gemm_nt((a, sfa), (b, sfb))
    for before, after in zip(copies, (a.view(torch.uint8), sfa, b.view(torch.uint8), sfb)):
        assert torch.equal(before, after)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_empty_m_and_n(out_dtype: torch.dtype) -> None:
    gen = _gen()
    for m, n, k in [(0, 136, 304), (7, 0, 304), (0, 0, 144)]:
        a, sfa, b, sfb = make_operands(m, n, k, gen)
        out = deepgemm.fp8_gemm_nt((a, sfa), (b, sfb), out_dtype=out_dtype)
        assert out.shape == (m, n)
        assert out.dtype == out_dtype


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_k_zero_gives_zeros(out_dtype: torch.dtype) -> None:
    m, n = 7, 136
    a = torch.empty(m, 0, dtype=FP8)
    b = torch.empty(n, 0, dtype=FP8)
    sfa = torch.empty(m, 0)
    sfb = torch.empty(2, 0)
    out = deepgemm.fp8_gemm_nt((a, sfa), (b, sfb), out_dtype=out_dtype)
    assert out.shape == (m, n) and out.dtype == out_dtype
    assert torch.equal(out.float(), torch.zeros(m, n))
    # An explicit, poisoned out is zeroed too.
    poisoned = torch.full((m, n), float("nan"), dtype=out_dtype)
    result = deepgemm.fp8_gemm_nt((a, sfa), (b, sfb), poisoned)
    assert result is poisoned
    assert torch.equal(poisoned.float(), torch.zeros(m, n))


@pytest.mark.parametrize("m", [1, 7, 65, 129])
def test_row_major_and_m_major_sfa_agree(m: int) -> None:
    gen = _gen()
    n, k = 200, 304
    a, sfa, b, sfb = make_operands(m, n, k, gen)
    rows = -(-m // 4) * 4
    storage = torch.full((sfa.shape[1], rows), float("nan"))
    storage[:, :m] = sfa.t()
    sfa_m_major = storage[:, :m].t()
    assert sfa_m_major.stride() == (1, rows)
    assert torch.equal(sfa_m_major, sfa)
    row_major = deepgemm.fp8_gemm_nt((a, sfa.contiguous()), (b, sfb), out_dtype=torch.float32)
    m_major = deepgemm.fp8_gemm_nt((a, sfa_m_major), (b, sfb), out_dtype=torch.float32)
    assert torch.equal(row_major, m_major)
    assert_matches(m_major, a, sfa, b, sfb, torch.float32)


def test_quantized_operands_end_to_end() -> None:
    """Through deepgemm's own quantizers: the product approximates the unquantized float64 one."""
    gen = _gen()
    m, n, k = 65, 200, 304
    x = torch.randn(m, k, generator=gen, dtype=torch.float64)
    w = torch.randn(n, k, generator=gen, dtype=torch.float64)
    a = deepgemm.quantize_per_token_group(x.float())
    b = deepgemm.quantize_per_block(w.float())
    out = deepgemm.fp8_gemm_nt(a, b, out_dtype=torch.float32)
    assert_matches(out, a[0], a[1], b[0], b[1], torch.float32)
    # e4m3 has 3 mantissa bits: against the unquantized product only ~1e-3 agreement is possible.
    assert calc_diff(out, x @ w.t()) < 2e-3


def test_backend_is_reference_without_gpu() -> None:
    a = torch.zeros(4, 128, dtype=FP8)
    assert deepgemm.backend_for(a) == "reference"
    assert deepgemm.backend_for(a, torch.zeros(4, 1)) == "reference"
    assert deepgemm.backend_for() == "reference"
    if not torch.cuda.is_available():
        assert deepgemm.supported() is False
        assert deepgemm.supported(0) is False
        assert deepgemm.supported("cuda:0") is False
    assert deepgemm.supported("cpu") is False
