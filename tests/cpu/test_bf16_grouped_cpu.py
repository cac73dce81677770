"""MoE grouped BF16 GEMMs on CPU tensors (the reference path): M-grouped contiguous (m_indices and psum forms) and
masked (NT), k-grouped (TN). Numerics against float64 computed here (not deepgemm.reference) on NaN-poisoned outputs:
empty experts, padding rows zero, masked rows past the count untouched, empty k-groups carrying C, C as out. The
argument rules of every docstring (each raises the documented type naming the argument, on the reference and the
kernel path alike), the kernel path's host logic (plan keys, launch-ready cache) with planning faked, the custom ops
(opcheck, fake kernels, torch.compile) and compile-only sm_90a builds of every grouped kind without spills or stack."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
import torch._dynamo
from torch._subclasses.fake_tensor import FakeTensorMode

import deepgemm
from deepgemm.api import bf16_grouped as api
from deepgemm.kernels.common.kind import GemmKind
from deepgemm.kernels.sm90_bf16_gemm.plan import Bf16Geometry, grouped_spec
from tests.helpers import GraphRecorder, assert_wrong_ranks_raise_typed, no_launch, outcome

BF16, FP32 = torch.bfloat16, torch.float32
ALIGN = 128  # contiguous segments (get_m_alignment_for_contiguous_layout())
MASKED_BLOCK = 64  # max_m's multiple: rows of one masked output block
NAN = float("nan")

contiguous = deepgemm.m_grouped_bf16_gemm_nt_contiguous
contiguous_psum = deepgemm.m_grouped_bf16_gemm_nt_contiguous_psum
masked = deepgemm.m_grouped_bf16_gemm_nt_masked
k_grouped = deepgemm.k_grouped_bf16_gemm_tn_contiguous


def q(name: str) -> str:
    return re.escape(f"'{name}'")


def bf16(*shape: int) -> torch.Tensor:
    """Random BF16 values from torch's global generator (seeded and printed by the `seed` fixture)."""
    return torch.randn(shape).to(BF16)


def padded(count: int) -> int:
    return -(-count // ALIGN) * ALIGN


def contiguous_layout(counts: list[int]) -> torch.Tensor:
    """int32 m_indices: expert g's counts[g] rows, each segment padded to 128 rows with -1."""
    indices: list[int] = []
    for group, count in enumerate(counts):
        indices += [group] * count + [-1] * (padded(count) - count)
    return torch.tensor(indices, dtype=torch.int32)


def psum_of(counts: list[int]) -> torch.Tensor:
    """int32 end rows (exclusive) of each expert in the same padded layout."""
    ends, start = [], 0
    for count in counts:
        ends.append(start + count)
        start += padded(count)
    return torch.tensor(ends, dtype=torch.int32)


# ---------------------------------------------------------------- float64 yardsticks (written here, on purpose)


def contiguous_float64(a: torch.Tensor, b: torch.Tensor, m_indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(A[r] B[g]^T, |A[r]| |B[g]|^T) in float64 for rows r of expert g = m_indices[r]; padding rows zero."""
    ref = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    mag = torch.zeros_like(ref)
    for g in range(b.shape[0]):
        rows = (m_indices == g).nonzero().flatten()
        if rows.numel():
            x, w = a[rows].double(), b[g].double()
            ref[rows] = x @ w.t()
            mag[rows] = x.abs() @ w.abs().t()
    return ref, mag


def masked_float64(a: torch.Tensor, b: torch.Tensor, counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    groups, max_m, _ = a.shape
    ref = torch.zeros(groups, max_m, b.shape[1], dtype=torch.float64)
    mag = torch.zeros_like(ref)
    for g, count in enumerate(counts):
        rows = max(0, min(count, max_m))
        x, w = a[g, :rows].double(), b[g].double()
        ref[g, :rows] = x @ w.t()
        mag[g, :rows] = x.abs() @ w.abs().t()
    return ref, mag


def k_grouped_float64(a: torch.Tensor, b: torch.Tensor, ks: list[int], c: torch.Tensor | None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """c[g] + A_g^T B_g over each group's token range, and the summed magnitudes."""
    ref = torch.zeros(len(ks), a.shape[1], b.shape[1], dtype=torch.float64)
    mag = torch.zeros_like(ref)
    begin = 0
    for g, k in enumerate(ks):
        x, y = a[begin:begin + k].double(), b[begin:begin + k].double()
        ref[g] = x.t() @ y
        mag[g] = x.abs().t() @ y.abs()
        begin += k
    if c is not None:
        ref += c.double()
        mag += c.double().abs()
    return ref, mag


def assert_matches(out: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor, what: str = "") -> None:
    """Finite, and every element within float32 summation error (2^-18 of the summed magnitudes) plus the output's
    rounding (half a BF16 ulp: 2^-8 relative); calc_diff < 1e-5 where anything is non-zero. Zero rows of the
    yardstick (padding) must be exactly zero."""
    got = out.double()
    assert torch.isfinite(got).all(), f"{what}: NaN/Inf in the output (an element never written)"
    rounding = 2.0**-8 if out.dtype == BF16 else 2.0**-23
    bound = mag * 2.0**-18 + ref.abs() * rounding + 1e-30
    worst = ((got - ref).abs() / bound).max().item() if ref.numel() else 0.0
    assert worst <= 1.0, f"{what}: an element is {worst:.2f}x past its bound"
    if ref.numel() and ref.abs().sum() > 0:
        assert deepgemm.calc_diff(got, ref) < 1e-5, what


# ---------------------------------------------------------------- contiguous (m_indices and psum)

# An empty expert, one of exactly 128 rows, ragged ones, one of a single row.
COUNTS = [5, 0, 128, 130, 1]


@pytest.mark.parametrize("out_dtype", [BF16, FP32])
@pytest.mark.parametrize("n,k", [(72, 136), (8, 8), (200, 264)])
def test_contiguous_matches_float64(out_dtype: torch.dtype, n: int, k: int, seed: int) -> None:
    m_indices = contiguous_layout(COUNTS)
    a, b = bf16(m_indices.numel(), k), bf16(len(COUNTS), n, k)
    a[m_indices < 0] = NAN  # padding rows of A must reach no output
    out = torch.full((m_indices.numel(), n), NAN, dtype=out_dtype)
    assert contiguous(a, b, out, m_indices) is out
    assert (out[m_indices < 0] == 0).all(), "padding rows must be written as zeros"
    assert_matches(out, *contiguous_float64(a, b, m_indices), f"contiguous n={n} k={k} out={out_dtype}")


@pytest.mark.parametrize("out_dtype", [BF16, FP32])
def test_contiguous_psum_equals_m_indices_form(out_dtype: torch.dtype, seed: int) -> None:
    m_indices, psum = contiguous_layout(COUNTS), psum_of(COUNTS)
    a, b = bf16(m_indices.numel(), 64), bf16(len(COUNTS), 40, 64)
    by_psum = torch.full((m_indices.numel(), 40), NAN, dtype=out_dtype)
    assert contiguous_psum(a, b, by_psum, psum, validate=True) is by_psum
    by_index = torch.full_like(by_psum, NAN)
    contiguous(a, b, by_index, m_indices, validate=True)
    assert torch.equal(by_psum, by_index)
    assert_matches(by_psum, *contiguous_float64(a, b, m_indices), "psum")


def test_contiguous_rows_outside_the_experts_are_zero(seed: int) -> None:
    """Out-of-range indices and psum ends past M_total (both read as the kernel reads them, validate=False)."""
    m_indices = torch.tensor([0] * 10 + [-1] * 118 + [7] * 128, dtype=torch.int32)  # 7: no such expert
    a, b = bf16(256, 32), bf16(2, 16, 32)
    out = torch.full((256, 16), NAN, dtype=BF16)
    contiguous(a, b, out, m_indices)
    assert (out[10:] == 0).all()
    assert_matches(out[:10], *(t[:10] for t in contiguous_float64(a, b, m_indices)))
    with pytest.raises(deepgemm.GroupedLayoutError, match="m_indices"):
        contiguous(a, b, out, m_indices, validate=True)
    # psum [10, 600]: expert 1 starts at row 128 and is clipped at M_total = 256.
    by_psum = torch.full((256, 16), NAN, dtype=BF16)
    contiguous_psum(a, b, by_psum, torch.tensor([10, 600], dtype=torch.int32))
    indices = torch.tensor([0] * 10 + [-1] * 118 + [1] * 128, dtype=torch.int32)
    assert_matches(by_psum, *contiguous_float64(a, b, indices))


def test_contiguous_strided_out_with_16_byte_rows(seed: int) -> None:
    """`out` need not be contiguous: rows 16-byte apart (a view of a wider buffer) are written in place, the
    columns past N untouched."""
    m_indices = contiguous_layout([100, 28])
    a, b = bf16(256, 48), bf16(2, 24, 48)
    storage = torch.full((256, 32), NAN, dtype=BF16)
    out = storage[:, :24]
    assert not out.is_contiguous()
    contiguous(a, b, out, m_indices)
    assert storage[:, 24:].isnan().all()
    assert_matches(out, *contiguous_float64(a, b, m_indices))


def test_contiguous_empty_sizes(seed: int) -> None:
    """M_total = 0 and N = 0 return `out` as is; K = 0 and G = 0 write zeros."""
    empty = torch.empty(0, 16, dtype=BF16)
    assert contiguous(bf16(0, 32), bf16(2, 16, 32), empty, torch.empty(0, dtype=torch.int32)) is empty
    m_indices = contiguous_layout([3])
    contiguous(bf16(128, 32), bf16(1, 0, 32), torch.empty(128, 0, dtype=BF16), m_indices)
    for a, b in ((bf16(128, 0), bf16(1, 16, 0)), (bf16(128, 32), bf16(0, 16, 32))):
        out = torch.full((128, 16), NAN, dtype=BF16)
        grouping = m_indices if b.shape[0] else torch.full((128,), -1, dtype=torch.int32)
        contiguous(a, b, out, grouping)
        assert (out == 0).all()
        out.fill_(NAN)
        contiguous_psum(a, b, out, psum_of([3])[: b.shape[0]])
        assert (out == 0).all()


# ---------------------------------------------------------------- masked

MAX_M = 128
MASKED_COUNTS = [0, 1, 63, 64, 65, MAX_M]


@pytest.mark.parametrize("out_dtype", [BF16, FP32])
def test_masked_matches_float64_and_leaves_rows_past_the_count(out_dtype: torch.dtype, seed: int) -> None:
    groups, n, k = len(MASKED_COUNTS), 72, 136
    a, b = bf16(groups, MAX_M, k), bf16(groups, n, k)
    for g, count in enumerate(MASKED_COUNTS):
        a[g, count:] = NAN  # rows past the count must reach no valid row
    out = torch.full((groups, MAX_M, n), NAN, dtype=out_dtype)
    masked_m = torch.tensor(MASKED_COUNTS, dtype=torch.int32)
    assert masked(a, b, out, masked_m, expected_m=64, validate=True) is out
    ref, mag = masked_float64(a, b, MASKED_COUNTS)
    for g, count in enumerate(MASKED_COUNTS):
        if count:
            assert_matches(out[g, :count], ref[g, :count], mag[g, :count], f"group {g} ({count} rows)")
        blocks_past = -(-count // MASKED_BLOCK) * MASKED_BLOCK
        assert out[g, blocks_past:].isnan().all(), f"group {g}: blocks past masked_m={count} must stay untouched"
        assert out[g, count:].isnan().all(), f"group {g}: the reference path writes no row past masked_m={count}"


def test_masked_counts_are_clamped(seed: int) -> None:
    """Without validate a negative count is no rows and one past max_m is all of them (as the kernel reads them)."""
    a, b = bf16(2, 64, 32), bf16(2, 16, 32)
    out = torch.full((2, 64, 16), NAN, dtype=BF16)
    masked(a, b, out, torch.tensor([-5, 1000], dtype=torch.int32), expected_m=8)
    assert out[0].isnan().all()
    ref, mag = masked_float64(a, b, [0, 64])
    assert_matches(out[1], ref[1], mag[1])
    with pytest.raises(deepgemm.GroupedLayoutError, match="masked_m"):
        masked(a, b, out, torch.tensor([-5, 1000], dtype=torch.int32), expected_m=8, validate=True)


def test_masked_empty_sizes(seed: int) -> None:
    for a, b, out in ((bf16(0, 64, 32), bf16(0, 16, 32), torch.empty(0, 64, 16)),
                      (bf16(2, 0, 32), bf16(2, 16, 32), torch.empty(2, 0, 16)),
                      (bf16(2, 64, 32), bf16(2, 0, 32), torch.empty(2, 64, 0))):
        grouping = torch.zeros(a.shape[0], dtype=torch.int32)
        assert masked(a, b, out, grouping, expected_m=1) is out


# ---------------------------------------------------------------- k-grouped

KS = [256, 0, 128, 384]


@pytest.mark.parametrize("with_c", [False, True])
@pytest.mark.parametrize("m,n", [(40, 24), (8, 136), (136, 8)])
def test_k_grouped_matches_float64(m: int, n: int, with_c: bool, seed: int) -> None:
    a, b = bf16(sum(KS), m), bf16(sum(KS), n)
    c = torch.randn(len(KS), m, n) if with_c else None
    out = torch.full((len(KS), m, n), NAN)
    assert k_grouped(a, b, out, KS, c) is out
    ref, mag = k_grouped_float64(a, b, KS, c)
    for g, k in enumerate(KS):
        if k == 0:
            expected = c[g] if c is not None else torch.zeros(m, n)
            assert torch.equal(out[g], expected), f"group {g} has no tokens: out must be C (or zeros)"
        else:
            assert_matches(out[g], ref[g], mag[g], f"group {g} ({k} tokens)")


def test_k_grouped_c_is_out_accumulates_in_place(seed: int) -> None:
    a, b = bf16(sum(KS), 40), bf16(sum(KS), 24)
    acc = torch.randn(len(KS), 40, 24)
    start, pointer = acc.clone(), acc.data_ptr()
    assert k_grouped(a, b, acc, KS, c=acc) is acc
    assert acc.data_ptr() == pointer
    assert torch.equal(acc[1], start[1])
    assert_matches(acc, *k_grouped_float64(a, b, KS, start))
    plain = k_grouped(a, b, torch.empty_like(acc), KS)
    assert torch.allclose(acc, plain + start, rtol=0, atol=1e-4)


def test_k_grouped_empty_sizes_and_tensor_ks(seed: int) -> None:
    c = torch.randn(3, 16, 8)
    out = torch.full((3, 16, 8), NAN)
    k_grouped(bf16(0, 16), bf16(0, 8), out, [0, 0, 0], c)  # K_total = 0: out = C
    assert torch.equal(out, c)
    k_grouped(bf16(0, 16), bf16(0, 8), out, [0, 0, 0])
    assert (out == 0).all()
    assert k_grouped(bf16(0, 16), bf16(0, 8), torch.empty(0, 16, 8), []).shape == (0, 16, 8)
    assert k_grouped(bf16(128, 0), bf16(128, 8), torch.empty(1, 0, 8), [128]).shape == (1, 0, 8)
    a, b = bf16(384, 16), bf16(384, 8)
    by_list = k_grouped(a, b, torch.empty(3, 16, 8), [128, 0, 256])
    for ks in (torch.tensor([128, 0, 256]), torch.tensor([128, 0, 256], dtype=torch.int32), (128, 0, 256)):
        assert torch.equal(k_grouped(a, b, torch.empty(3, 16, 8), ks), by_list)


# ---------------------------------------------------------------- argument rules


def offset_view(shape: tuple[int, ...], byte_offset: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    """A contiguous tensor whose data pointer is `byte_offset` bytes past a 16-byte boundary (a multiple of the
    element size)."""
    size = dtype.itemsize
    numel = 1
    for extent in shape:
        numel *= extent
    raw = torch.zeros(numel * size + 32, dtype=torch.uint8)
    skip = (-raw.data_ptr()) % 16 + byte_offset
    t = raw[skip:skip + numel * size].view(dtype).view(shape)
    assert t.data_ptr() % 16 == byte_offset
    return t


def _contiguous_cases() -> dict[str, tuple[Callable[[], object], type, str]]:
    a, b = bf16(256, 64), bf16(2, 32, 64)
    out = torch.empty(256, 32, dtype=BF16)
    mi = contiguous_layout([100, 128])
    psum = psum_of([100, 128])
    shared = torch.zeros(256 * 64 + 256 * 32, dtype=BF16)
    raw = torch.zeros(256 * 32 * 2 + 1024, dtype=torch.uint8)
    b_and_out = torch.zeros(256 * 32, dtype=BF16)
    grad_a = a.clone().requires_grad_()
    fn, fp = contiguous, contiguous_psum
    return {
        "contiguous_a_not_a_tensor": (lambda: fn([[0.0] * 64] * 256, b, out, mi), TypeError, q("a")),
        "contiguous_a_fp32": (lambda: fn(a.float(), b, out, mi), TypeError, q("a") + ".*bfloat16"),
        "contiguous_b_fp8": (lambda: fn(a, b.to(torch.float8_e4m3fn), out, mi), TypeError, q("b")),
        "contiguous_out_fp16": (lambda: fn(a, b, out.half(), mi), TypeError, q("out")),
        "contiguous_m_indices_int64": (lambda: fn(a, b, out, mi.long()), TypeError, q("m_indices")),
        "contiguous_a_3d": (lambda: fn(a.view(2, 128, 64), b, out, mi), ValueError, q("a") + ".*2-D"),
        "contiguous_b_2d": (lambda: fn(a, b.view(64, 64), out, mi), ValueError, q("b") + ".*3-D"),
        "contiguous_k_mismatch": (lambda: fn(a, b[:, :, :56].contiguous(), out, mi), ValueError,
                                  q("a") + " has K=64 but " + q("b")),
        "contiguous_n_not_multiple_of_8": (lambda: fn(a, bf16(2, 12, 64), torch.empty(256, 12, dtype=BF16), mi),
                                           ValueError, "N=12.*" + q("b") + ".*multiple of 8"),
        "contiguous_k_not_multiple_of_8": (lambda: fn(bf16(256, 12), bf16(2, 32, 12), out, mi), ValueError,
                                           q("a") + " has K=12.*multiple of 8"),
        "contiguous_m_total_not_multiple_of_128": (lambda: fn(a[:200], b, out[:200], mi[:200]), ValueError,
                                                   q("a") + " has M_total=200.*multiple of 128"),
        "contiguous_out_shape": (lambda: fn(a, b, out[:, :16], mi), ValueError, q("out") + ".*shape"),
        "contiguous_m_indices_shape": (lambda: fn(a, b, out, mi[:128]), ValueError, q("m_indices") + ".*shape"),
        "contiguous_m_indices_not_contiguous": (lambda: fn(a, b, out, torch.zeros(512, dtype=torch.int32)[::2]),
                                                ValueError, q("m_indices") + " must be contiguous"),
        "contiguous_m_indices_on_meta": (lambda: fn(a, b, out, mi.to("meta")), ValueError,
                                         q("m_indices") + " is on meta"),
        "contiguous_out_on_meta": (lambda: fn(a, b, out.to("meta"), mi), ValueError, q("out") + " is on meta"),
        "contiguous_a_not_unit_stride": (lambda: fn(bf16(64, 256).t(), b, out, mi), ValueError,
                                         q("a") + ".*unit stride"),
        "contiguous_out_transposed": (lambda: fn(a, b, torch.empty(32, 256, dtype=BF16).t(), mi), ValueError,
                                      q("out") + ".*unit stride"),
        "contiguous_out_rows_misaligned": (lambda: fn(a, b, torch.empty(256, 36, dtype=BF16)[:, :32], mi),
                                           ValueError, q("out") + " row stride.*16 bytes"),
        "contiguous_b_not_stacked": (lambda: fn(a, bf16(2, 40, 64)[:, :32], out, mi), ValueError,
                                     q("b") + " groups must be stacked"),
        "contiguous_a_base_2_bytes_off": (lambda: fn(offset_view((256, 64), 2), b, out, mi), ValueError,
                                          q("a") + ".*16-byte aligned"),
        "contiguous_out_base_8_bytes_off": (lambda: fn(a, b, offset_view((256, 32), 8), mi), ValueError,
                                            q("out") + ".*16-byte aligned"),
        "contiguous_out_overlaps_itself": (lambda: fn(a, b, torch.zeros(1, 32, dtype=BF16).expand(256, 32), mi),
                                           ValueError, q("out") + " overlaps itself"),
        "contiguous_out_overlaps_a": (lambda: fn(shared[:256 * 64].view(256, 64), b,
                                                 shared[256 * 64 - 64:256 * 64 - 64 + 256 * 32].view(256, 32), mi),
                                      ValueError, q("out") + " overlaps " + q("a")),
        "contiguous_out_overlaps_b": (lambda: fn(a, b_and_out[:2 * 32 * 64].view(2, 32, 64), b_and_out.view(256, 32),
                                                 mi), ValueError, q("out") + " overlaps " + q("b")),
        "contiguous_out_overlaps_m_indices": (lambda: fn(a, b, raw[:256 * 64].view(BF16).view(256, 32),
                                                         raw[256 * 64 - 512:256 * 64 + 512].view(torch.int32)),
                                              ValueError, q("out") + " overlaps " + q("m_indices")),
        "contiguous_a_requires_grad": (lambda: fn(grad_a, b, out, mi), deepgemm.NotDifferentiableError,
                                       q("a") + " requires grad"),
        "contiguous_out_requires_grad": (lambda: fn(a, b, torch.zeros(256, 32, requires_grad=True), mi),
                                         deepgemm.NotDifferentiableError, q("out") + " requires grad"),
        "contiguous_validate_bad_expert": (lambda: fn(a, b, out, torch.full((256,), 2, dtype=torch.int32),
                                                      validate=True), deepgemm.GroupedLayoutError, q("m_indices")),
        "contiguous_validate_expert_after_padding": (
            lambda: fn(a, b, out, torch.tensor([-1] * 10 + [0] * 118 + [1] * 128, dtype=torch.int32), validate=True),
            deepgemm.GroupedLayoutError, q("m_indices") + r"\[10\]"),
        "psum_int64": (lambda: fp(a, b, out, psum.long()), TypeError, q("psum")),
        "psum_length": (lambda: fp(a, b, out, torch.tensor([1, 2, 3], dtype=torch.int32)), ValueError,
                        q("psum") + ".*shape"),
        "psum_not_contiguous": (lambda: fp(a, b, out, torch.zeros(4, dtype=torch.int32)[::2]), ValueError,
                                q("psum") + " must be contiguous"),
        "psum_m_total_not_multiple_of_128": (lambda: fp(a[:200], b, out[:200], psum), ValueError,
                                             "M_total=200.*multiple of 128"),
        "psum_b_fp32": (lambda: fp(a, b.float(), out, psum), TypeError, q("b")),
        "psum_out_overlaps_a": (lambda: fp(shared[:256 * 64].view(256, 64), b,
                                           shared[256 * 32:256 * 64].view(256, 32), psum), ValueError,
                                q("out") + " overlaps " + q("a")),
        "psum_b_requires_grad": (lambda: fp(a, b.clone().requires_grad_(), out, psum),
                                 deepgemm.NotDifferentiableError, q("b") + " requires grad"),
        "psum_validate_decreasing": (lambda: fp(a, b, out, torch.tensor([200, 100], dtype=torch.int32),
                                                validate=True), deepgemm.GroupedLayoutError, q("psum")),
        "psum_validate_past_m_total": (lambda: fp(a, b, out, torch.tensor([100, 300], dtype=torch.int32),
                                                  validate=True), deepgemm.GroupedLayoutError, q("psum")),
    }


def _masked_cases() -> dict[str, tuple[Callable[[], object], type, str]]:
    a, b = bf16(2, 64, 64), bf16(2, 32, 64)
    out = torch.empty(2, 64, 32, dtype=BF16)
    mm = torch.tensor([3, 64], dtype=torch.int32)
    shared = torch.zeros(2 * 64 * 64 + 2 * 64 * 32, dtype=BF16)
    fn = masked
    return {
        "masked_a_fp16": (lambda: fn(a.half(), b, out, mm, 8), TypeError, q("a")),
        "masked_out_int": (lambda: fn(a, b, out.int(), mm, 8), TypeError, q("out")),
        "masked_masked_m_int64": (lambda: fn(a, b, out, mm.long(), 8), TypeError, q("masked_m")),
        "masked_a_2d": (lambda: fn(a.view(128, 64), b, out, mm, 8), ValueError, q("a") + ".*3-D"),
        "masked_b_2d": (lambda: fn(a, b.view(64, 64), out, mm, 8), ValueError, q("b") + ".*3-D"),
        "masked_groups_differ": (lambda: fn(bf16(3, 64, 64), b, torch.empty(3, 64, 32, dtype=BF16),
                                            torch.zeros(3, dtype=torch.int32), 8), ValueError,
                                 q("a") + " has 3 groups but " + q("b") + " has 2"),
        "masked_k_mismatch": (lambda: fn(a, bf16(2, 32, 72), out, mm, 8), ValueError, q("a") + " has K=64"),
        "masked_n_not_multiple_of_8": (lambda: fn(a, bf16(2, 20, 64), torch.empty(2, 64, 20, dtype=BF16), mm, 8),
                                       ValueError, "N=20.*multiple of 8"),
        "masked_k_not_multiple_of_8": (lambda: fn(bf16(2, 64, 20), bf16(2, 32, 20), out, mm, 8), ValueError,
                                       q("a") + " has K=20.*multiple of 8"),
        "masked_max_m_not_multiple_of_64": (lambda: fn(bf16(2, 48, 64), b, torch.empty(2, 48, 32, dtype=BF16), mm, 8),
                                            ValueError, q("a") + " has max_m=48.*multiple of 64"),
        "masked_k_zero": (lambda: fn(bf16(2, 64, 0), bf16(2, 32, 0), out, mm, 8), ValueError,
                          q("a") + " has K=0"),
        "masked_out_shape": (lambda: fn(a, b, out[:, :, :16], mm, 8), ValueError, q("out") + ".*shape"),
        "masked_masked_m_length": (lambda: fn(a, b, out, torch.zeros(3, dtype=torch.int32), 8), ValueError,
                                   q("masked_m") + ".*shape"),
        "masked_masked_m_not_contiguous": (lambda: fn(a, b, out, torch.zeros(4, dtype=torch.int32)[::2], 8),
                                           ValueError, q("masked_m") + " must be contiguous"),
        "masked_expected_m_zero": (lambda: fn(a, b, out, mm, 0), ValueError, q("expected_m")),
        "masked_expected_m_bool": (lambda: fn(a, b, out, mm, True), ValueError, q("expected_m")),
        "masked_expected_m_float": (lambda: fn(a, b, out, mm, 8.0), ValueError, q("expected_m")),
        "masked_a_not_stacked": (lambda: fn(bf16(2, 80, 64)[:, :64], b, out, mm, 8), ValueError,
                                 q("a") + " groups must be stacked"),
        "masked_out_not_stacked": (lambda: fn(a, b, torch.empty(2, 80, 32, dtype=BF16)[:, :64], mm, 8), ValueError,
                                   q("out") + " groups must be stacked"),
        "masked_out_rows_misaligned": (lambda: fn(a, b, torch.empty(2, 64, 36, dtype=BF16)[:, :, :32], mm, 8),
                                       ValueError, q("out") + " rows must be a multiple of 16 bytes apart"),
        "masked_out_transposed": (lambda: fn(a, b, torch.empty(2, 32, 64, dtype=BF16).transpose(1, 2), mm, 8),
                                  ValueError, q("out") + " groups must be stacked"),
        "masked_out_overlaps_itself": (lambda: fn(a, b, torch.zeros(1, 1, 32, dtype=BF16).expand(2, 64, 32), mm, 8),
                                       ValueError, q("out") + " overlaps itself"),
        "masked_out_overlaps_a": (lambda: fn(shared[:2 * 64 * 64].view(2, 64, 64), b,
                                             shared[2 * 64 * 64 - 32:2 * 64 * 64 - 32 + 2 * 64 * 32].view(2, 64, 32),
                                             mm, 8), ValueError, q("out") + " overlaps " + q("a")),
        "masked_masked_m_on_meta": (lambda: fn(a, b, out, mm.to("meta"), 8), ValueError, q("masked_m") + " is on meta"),
        "masked_b_base_4_bytes_off": (lambda: fn(a, offset_view((2, 32, 64), 4), out, mm, 8), ValueError,
                                      q("b") + ".*16-byte aligned"),
        "masked_out_requires_grad": (lambda: fn(a, b, torch.zeros(2, 64, 32, requires_grad=True), mm, 8),
                                     deepgemm.NotDifferentiableError, q("out") + " requires grad"),
        "masked_validate_count_past_max_m": (lambda: fn(a, b, out, torch.tensor([3, 65], dtype=torch.int32), 8,
                                                        validate=True), deepgemm.GroupedLayoutError,
                                             q("masked_m") + r"\[1\]"),
        "masked_validate_negative_count": (lambda: fn(a, b, out, torch.tensor([-1, 3], dtype=torch.int32), 8,
                                                      validate=True), deepgemm.GroupedLayoutError,
                                           q("masked_m") + r"\[0\]"),
    }


def _k_grouped_cases() -> dict[str, tuple[Callable[[], object], type, str]]:
    ks = [128, 0, 256]
    a, b = bf16(384, 16), bf16(384, 24)
    out = torch.empty(3, 16, 24)
    buffer = torch.zeros(3 * 16 * 24 + 24)
    raw = torch.zeros(384 * 24 * 2, dtype=torch.uint8)
    fn = k_grouped
    return {
        "kgrouped_a_fp32": (lambda: fn(a.float(), b, out, ks), TypeError, q("a") + ".*bfloat16"),
        "kgrouped_b_not_a_tensor": (lambda: fn(a, None, out, ks), TypeError, q("b")),
        "kgrouped_out_bf16": (lambda: fn(a, b, out.to(BF16), ks), TypeError, q("out") + ".*float32"),
        "kgrouped_c_bf16": (lambda: fn(a, b, out, ks, torch.zeros(3, 16, 24, dtype=BF16)), TypeError, q("c")),
        "kgrouped_a_3d": (lambda: fn(a.view(1, 384, 16), b, out, ks), ValueError, q("a") + ".*2-D"),
        "kgrouped_b_1d": (lambda: fn(a, b.view(-1), out, ks), ValueError, q("b") + ".*2-D"),
        "kgrouped_k_total_mismatch": (lambda: fn(a, b[:256], out, ks), ValueError,
                                      q("a") + r" \(\[K_total, M\]\) has K_total=384.*" + q("b")),
        "kgrouped_ks_not_multiple_of_128": (lambda: fn(a, b, out, [128, 64, 192]), ValueError,
                                            q("ks[1]") + "=64.*multiple of 128"),
        "kgrouped_ks_negative": (lambda: fn(a, b, out, [512, -128, 0]), ValueError, q("ks[1]")),
        "kgrouped_ks_not_summing": (lambda: fn(a, b, out, [128, 0, 128]), ValueError,
                                    q("ks") + " sums to 256 tokens.*K_total=384"),
        "kgrouped_ks_float": (lambda: fn(a, b, out, [128.0, 0, 256]), TypeError, q("ks[0]")),
        "kgrouped_ks_bool": (lambda: fn(a, b, out, [128, False, 256]), TypeError, q("ks[1]")),
        "kgrouped_ks_string": (lambda: fn(a, b, out, "128"), TypeError, q("ks")),
        "kgrouped_ks_float_tensor": (lambda: fn(a, b, out, torch.tensor([128.0, 0, 256])), TypeError, q("ks")),
        "kgrouped_m_not_multiple_of_8": (lambda: fn(bf16(384, 12), b, torch.empty(3, 12, 24), ks), ValueError,
                                         q("a") + " has M=12.*multiple of 8"),
        "kgrouped_n_not_multiple_of_8": (lambda: fn(a, bf16(384, 20), torch.empty(3, 16, 20), ks), ValueError,
                                         q("b") + " has N=20.*multiple of 8"),
        "kgrouped_out_shape": (lambda: fn(a, b, torch.empty(2, 16, 24), ks), ValueError, q("out") + ".*shape"),
        "kgrouped_c_shape": (lambda: fn(a, b, out, ks, torch.zeros(3, 24, 16)), ValueError, q("c") + ".*shape"),
        "kgrouped_out_not_contiguous": (lambda: fn(a, b, torch.empty(3, 24, 16).transpose(1, 2), ks), ValueError,
                                        q("out") + " must be contiguous"),
        "kgrouped_out_rows_padded": (lambda: fn(a, b, torch.empty(3, 16, 32)[:, :, :24], ks), ValueError,
                                     q("out") + " must be contiguous"),
        "kgrouped_c_not_contiguous": (lambda: fn(a, b, out, ks, torch.zeros(3, 24, 16).transpose(1, 2)), ValueError,
                                      q("c") + " must be contiguous"),
        "kgrouped_a_not_unit_stride": (lambda: fn(bf16(16, 384).t(), b, out, ks), ValueError,
                                       q("a") + ".*unit stride"),
        "kgrouped_b_rows_misaligned": (lambda: fn(a, bf16(384, 28)[:, :24], out, ks), ValueError,
                                       q("b") + " row stride"),
        "kgrouped_a_base_2_bytes_off": (lambda: fn(offset_view((384, 16), 2), b, out, ks), ValueError,
                                        q("a") + ".*16-byte aligned"),
        "kgrouped_out_base_4_bytes_off": (lambda: fn(a, b, offset_view((3, 16, 24), 4, FP32), ks), ValueError,
                                          q("out") + ".*16-byte aligned"),
        "kgrouped_c_base_8_bytes_off": (lambda: fn(a, b, out, ks, offset_view((3, 16, 24), 8, FP32)), ValueError,
                                        q("c") + ".*16-byte aligned"),
        "kgrouped_out_overlaps_c": (lambda: fn(a, b, buffer[:1152].view(3, 16, 24), ks, buffer[24:].view(3, 16, 24)),
                                    ValueError, q("out") + " overlaps " + q("c")),
        "kgrouped_out_overlaps_b": (lambda: fn(a, raw.view(BF16).view(384, 24), raw[:4608].view(FP32).view(3, 16, 24),
                                               ks), ValueError, q("out") + " overlaps " + q("b")),
        "kgrouped_c_on_meta": (lambda: fn(a, b, out, ks, torch.zeros(3, 16, 24, device="meta")), ValueError,
                               q("c") + " is on meta"),
        "kgrouped_a_requires_grad": (lambda: fn(a.clone().requires_grad_(), b, out, ks),
                                     deepgemm.NotDifferentiableError, q("a") + " requires grad"),
        "kgrouped_c_requires_grad": (lambda: fn(a, b, out, ks, torch.zeros(3, 16, 24, requires_grad=True)),
                                     deepgemm.NotDifferentiableError, q("c") + " requires grad"),
    }


def _bad_cases() -> dict[str, tuple[Callable[[], object], type, str]]:
    """case -> (call, exception type, regex the message must match: it names the argument)."""
    return {**_contiguous_cases(), **_masked_cases(), **_k_grouped_cases()}


BAD_CASES = sorted(_bad_cases())


def on_both_paths(monkeypatch: pytest.MonkeyPatch, call: Callable[[], object]) -> tuple[object, object]:
    """(outcome on the reference path, outcome on the kernel path): the kernel path is CPU tensors routed to "sm90"
    with planning replaced by a failure, so only the checks (run before the path choice) can stop the call."""
    reference = outcome(call)
    with monkeypatch.context() as patch:
        patch.setattr(api, "backend_for", lambda *tensors, **kw: "sm90")
        patch.setattr(api, "get_bf16_grouped_plan", no_launch)
        patch.setattr(api, "_ready", {})
        kernel = outcome(call)
    return reference, kernel


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_arguments_raise_naming_the_argument_on_both_paths(case: str, seed: int,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    call, error, pattern = _bad_cases()[case]
    reference, kernel = on_both_paths(monkeypatch, call)
    assert reference is not None, "the reference path accepted a call the rules refuse"
    assert reference[0] is error and re.search(pattern, reference[1]), reference
    assert kernel == reference, "the kernel path raised something else than the reference path"


def test_inputs_that_require_grad_pass_under_no_grad(seed: int) -> None:
    m_indices = contiguous_layout([3])
    a, b = bf16(128, 32).requires_grad_(), bf16(1, 16, 32).requires_grad_()
    with torch.no_grad():
        out = contiguous(a, b, torch.empty(128, 16, dtype=BF16), m_indices)
    assert not out.requires_grad
    assert_matches(out, *contiguous_float64(a.detach(), b.detach(), m_indices))


# ---------------------------------------------------------------- the kernel path's host logic (planning faked)


class FakePlan:
    """Stands in for a Bf16GemmPlan: records what it is asked to pack and launch."""

    def __init__(self, request: tuple) -> None:
        self.request = request
        self.packed: list[tuple] = []
        self.launched: list[object] = []

    def packed_args(self, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None,
                    grouping: torch.Tensor | None = None) -> tuple:
        args = (a, b, d, c, grouping)
        self.packed.append(args)
        return args

    def launch_packed(self, args: object) -> None:
        self.launched.append(args)

    def launch(self, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
               grouping: torch.Tensor | None = None) -> None:
        self.launch_packed(self.packed_args(a, b, d, c, grouping))


@pytest.fixture
def fake_kernel_path(monkeypatch: pytest.MonkeyPatch) -> list[FakePlan]:
    """CPU tensors routed to the kernel path with planning recorded: the plans asked for, in order."""
    plans: list[FakePlan] = []

    def plan(device_index: int, kind: GemmKind, geometry: Bf16Geometry, n: int, k: int, out_dtype: torch.dtype,
             c_dtype: torch.dtype | None, expected_m: int, c_in_place: bool = False) -> FakePlan:
        request = (kind, geometry, n, k, out_dtype, c_dtype, expected_m)
        plans.append(FakePlan(request + (("c = out",) if c_in_place else ())))
        return plans[-1]

    offsets = []
    monkeypatch.setattr(api, "backend_for", lambda *tensors, **kw: "sm90")
    monkeypatch.setattr(api, "get_bf16_grouped_plan", plan)
    monkeypatch.setattr(api, "_ready", {})
    monkeypatch.setattr(api._offsets, "get", lambda device, ks, where: offsets.append(ks) or
                        torch.tensor([0, *ks]).cumsum(0).int())
    return plans


def test_kernel_path_plans_each_form(fake_kernel_path: list[FakePlan], seed: int) -> None:
    plans = fake_kernel_path
    m_indices, psum = contiguous_layout([100, 128]), psum_of([100, 128])
    a, b = bf16(256, 64), bf16(2, 32, 64)
    out = torch.empty(256, 32, dtype=FP32)
    contiguous(a, b, out, m_indices)
    contiguous_psum(a, b, out, psum)
    assert [p.request for p in plans] == [
        (GemmKind.GROUPED_CONTIGUOUS, Bf16Geometry(256, 2), 32, 64, FP32, None, 0),
        (GemmKind.GROUPED_CONTIGUOUS_PSUM, Bf16Geometry(256, 2), 32, 64, FP32, None, 0),
    ]
    assert plans[0].packed[0][2] is out and plans[0].packed[0][4] is m_indices and plans[1].packed[0][4] is psum
    # A second identical call is launch-ready: no validation, no planning, one launch of the same arguments.
    contiguous(a, b, out, m_indices)
    assert len(plans) == 2 and plans[0].launched == [plans[0].packed[0]] * 2
    # masked: geometry (G * max_m, G, max_m), expected_m bucketed to a power of two capped at max_m.
    am, om, mm = bf16(3, 128, 64), torch.empty(3, 128, 32, dtype=BF16), torch.tensor([1, 2, 3], dtype=torch.int32)
    for expected, bucket in ((1, 1), (3, 4), (64, 64), (65, 128), (100, 128), (5000, 128)):
        masked(am, bf16(3, 32, 64), om, mm, expected)
        assert plans[-1].request == (GemmKind.GROUPED_MASKED, Bf16Geometry(384, 3, 128), 32, 64, BF16, None, bucket)
    # k-grouped: (M, G), k = 0 (each group's K range is run time), FP32, c's dtype; offsets passed as grouping. C = out
    # plans the in-place build, which is launched without C (its stores add into out); a separate C is passed.
    ka, kb = bf16(384, 16), bf16(384, 24)
    kout, kc = torch.empty(3, 16, 24), torch.randn(3, 16, 24)
    k_grouped(ka, kb, kout, [128, 0, 256])
    k_grouped(ka, kb, kout, [128, 0, 256], c=kout)
    k_grouped(ka, kb, kout, [128, 0, 256], c=kc)
    assert plans[-3].request == (GemmKind.K_GROUPED, Bf16Geometry(16, 3), 24, 0, FP32, None, 0)
    assert plans[-2].request == (GemmKind.K_GROUPED, Bf16Geometry(16, 3), 24, 0, FP32, FP32, 0, "c = out")
    assert plans[-1].request == (GemmKind.K_GROUPED, Bf16Geometry(16, 3), 24, 0, FP32, FP32, 0)
    _, _, d, c, offsets = plans[-2].packed[0]
    assert d is kout and c is None and offsets.tolist() == [0, 128, 128, 384]
    _, _, d, c, _ = plans[-1].packed[0]
    assert d is kout and c is kc


def test_kernel_path_shortcuts_launch_nothing(fake_kernel_path: list[FakePlan], seed: int) -> None:
    """Empty extents return at once; K = 0 (contiguous) and K_total = 0 (k-grouped) write zeros or C without a
    kernel; the masked form refuses K = 0 (the counts live on the device)."""
    m_indices = contiguous_layout([3])
    out = torch.full((128, 16), NAN, dtype=BF16)
    contiguous(bf16(128, 0), bf16(1, 16, 0), out, m_indices)
    assert (out == 0).all()
    out.fill_(NAN)
    contiguous(bf16(128, 32), bf16(0, 16, 32), out, torch.full((128,), -1, dtype=torch.int32))
    assert (out == 0).all()
    contiguous(bf16(0, 32), bf16(1, 16, 32), torch.empty(0, 16, dtype=BF16), torch.empty(0, dtype=torch.int32))
    masked(bf16(2, 0, 32), bf16(2, 16, 32), torch.empty(2, 0, 16), torch.zeros(2, dtype=torch.int32), 1)
    c = torch.randn(2, 16, 8)
    kout = torch.full((2, 16, 8), NAN)
    k_grouped(bf16(0, 16), bf16(0, 8), kout, [0, 0], c)
    assert torch.equal(kout, c)
    k_grouped(bf16(0, 16), bf16(0, 8), kout, [0, 0])
    assert (kout == 0).all()
    assert fake_kernel_path == []


def test_launch_ready_cache_keys(fake_kernel_path: list[FakePlan], seed: int) -> None:
    """A remembered argument set launches without checks, except that inputs requiring grad, an expected_m that only
    compares equal (True for 1, 64.0 for 64), another form or validate=True take the checked path."""
    plans = fake_kernel_path
    am, b = bf16(2, 64, 64), bf16(2, 32, 64)
    out, mm = torch.empty(2, 64, 32, dtype=BF16), torch.tensor([3, 64], dtype=torch.int32)
    masked(am, b, out, mm, 1)
    assert len(plans) == 1 and len(api._ready) == 1
    masked(am, b, out, mm, 1)
    assert len(plans) == 1 and len(plans[0].launched) == 2
    with pytest.raises(ValueError, match=q("expected_m")):
        masked(am, b, out, mm, True)
    with pytest.raises(ValueError, match=q("expected_m")):
        masked(am, b, out, mm, 1.0)
    with pytest.raises(deepgemm.GroupedLayoutError):
        masked(am, b, out, torch.tensor([3, 65], dtype=torch.int32), 1, validate=True)
    with torch.enable_grad():
        am.requires_grad_()
        with pytest.raises(deepgemm.NotDifferentiableError, match=q("a")):
            masked(am, b, out, mm, 1)
    am.requires_grad_(False)
    masked(am, b, out, mm, 1, validate=True)  # validated: checks the values, then launches (no new plan kept)
    assert len(plans[0].launched) == 2 and len(plans) == 2
    api.clear_bf16_grouped_plans()
    assert api._ready == {}


def test_contiguous_reference_lookup_follows_the_kernel_tile(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """A layout that check_grouped_layout refuses (padding at row 64 of a segment, then rows of the expert) is
    computed as the kernel's tile reads it: block_m 64 zeroes the second half, block_m 128 computes it."""
    m_indices = torch.tensor([0] * 10 + [-1] * 54 + [-1] + [0] * 63, dtype=torch.int32)
    a, b = bf16(128, 32), bf16(1, 16, 32)
    results = {}
    for block_m in (64, 128):
        monkeypatch.setattr(api, "_kernel_block_m", lambda *args, bm=block_m: bm)
        out = torch.full((128, 16), NAN, dtype=BF16)
        contiguous(a, b, out, m_indices)
        results[block_m] = out
    first_half = torch.where(torch.arange(128) < 64, m_indices, -1).int()
    assert (results[64][10:] == 0).all()
    assert_matches(results[64], *contiguous_float64(a, b, first_half))
    assert_matches(results[128], *contiguous_float64(a, b, m_indices))
    assert not (results[128][65:] == 0).all()


# ---------------------------------------------------------------- regressions: the error wording, k-grouped descriptors per K_total


def test_not_differentiable_message_does_not_blame_fp8(seed: int) -> None:
    m_indices = contiguous_layout([3])
    a = bf16(128, 32).requires_grad_()
    with pytest.raises(deepgemm.NotDifferentiableError) as caught:
        contiguous(a, bf16(1, 16, 32), torch.empty(128, 16, dtype=BF16), m_indices)
    assert "FP8" not in str(caught.value), str(caught.value)


def test_k_grouped_packed_args_follow_k_total(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    from deepgemm.kernels.sm90_bf16_gemm.plan import Bf16GemmPlan

    geometry = Bf16Geometry(16, 2)
    spec = grouped_spec(GemmKind.K_GROUPED, geometry, 24, 0, FP32, None, 0, 132)
    plan = Bf16GemmPlan(0, geometry, spec, kernel=None)  # type: ignore[arg-type]  (never launched here)
    monkeypatch.setattr(plan, "_pack", lambda a, b, d, c, grouping: (tuple(a.shape), tuple(b.shape)))
    tokens_a, tokens_b = bf16(512, 16), bf16(512, 24)
    out = torch.empty(2, 16, 24)
    offsets = torch.zeros(3, dtype=torch.int32)  # the same address for both calls (an evicted upload reused)
    first = plan.packed_args(tokens_a[:256], tokens_b[:256], out, None, offsets)
    second = plan.packed_args(tokens_a[:384], tokens_b[:384], out, None, offsets)
    assert first == ((256, 16), (256, 24))
    assert second == ((384, 16), (384, 24)), "descriptors of K_total = 256 reused for K_total = 384"


# ---------------------------------------------------------------- custom ops

OP_NAMES = (
    "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nt_contiguous_out",
    "m_grouped_bf16_gemm_nt_contiguous_psum", "m_grouped_bf16_gemm_nt_contiguous_psum_out",
    "m_grouped_bf16_gemm_nt_masked", "m_grouped_bf16_gemm_nt_masked_out",
    "k_grouped_bf16_gemm_tn_contiguous", "k_grouped_bf16_gemm_tn_contiguous_out",
    "k_grouped_bf16_gemm_tn_contiguous_accumulate",
)


def _op_cases() -> dict[str, tuple[str, tuple]]:
    """case -> (op name, positional arguments): odd N (136), ragged experts, an empty k-group."""
    groups, n, k = 3, 136, 72
    b = bf16(groups, n, k)
    m_indices = torch.tensor([0] * 128 + [2] * 100 + [-1] * 28 + [1] * 128 + [-1] * 128, dtype=torch.int32)
    psum = torch.tensor([100, 356, 400], dtype=torch.int32)
    a = bf16(512, k)
    am = bf16(groups, 128, k)
    masked_m = torch.tensor([100, 0, 128], dtype=torch.int32)
    ks = [128, 0, 256]
    ka, kb = bf16(384, 72), bf16(384, 40)
    c = torch.randn(3, 72, 40)
    return {
        "contiguous": ("m_grouped_bf16_gemm_nt_contiguous", (a, b, m_indices, None)),
        "contiguous-fp32": ("m_grouped_bf16_gemm_nt_contiguous", (a, b, m_indices, FP32)),
        "contiguous_out": ("m_grouped_bf16_gemm_nt_contiguous_out", (a, b, m_indices, torch.empty(512, n))),
        "contiguous_psum": ("m_grouped_bf16_gemm_nt_contiguous_psum", (a, b, psum, BF16)),
        "contiguous_psum_out": ("m_grouped_bf16_gemm_nt_contiguous_psum_out",
                                (a, b, psum, torch.empty(512, n, dtype=BF16))),
        "masked": ("m_grouped_bf16_gemm_nt_masked", (am, b, masked_m, 100, None)),
        "masked-fp32": ("m_grouped_bf16_gemm_nt_masked", (am, b, masked_m, 100, FP32)),
        "masked_out": ("m_grouped_bf16_gemm_nt_masked_out", (am, b, masked_m, 100, torch.zeros(groups, 128, n))),
        "k_grouped": ("k_grouped_bf16_gemm_tn_contiguous", (ka, kb, ks, None)),
        "k_grouped-c": ("k_grouped_bf16_gemm_tn_contiguous", (ka, kb, ks, c)),
        "k_grouped_out": ("k_grouped_bf16_gemm_tn_contiguous_out", (ka, kb, ks, c, torch.empty_like(c))),
        "k_grouped_out-no-c": ("k_grouped_bf16_gemm_tn_contiguous_out", (ka, kb, ks, None, torch.empty_like(c))),
        "k_grouped_accumulate": ("k_grouped_bf16_gemm_tn_contiguous_accumulate", (ka, kb, ks, c.clone())),
    }


OP_CASES = sorted(_op_cases())


def test_every_op_is_registered_with_cpu_cuda_and_fake_kernels() -> None:
    for name in OP_NAMES:
        for key in ("CPU", "CUDA", "Meta"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"deepgemm::{name}", key), f"{name}: no {key}"
    assert {name for name, _ in _op_cases().values()} == set(OP_NAMES)


@pytest.mark.parametrize("case", OP_CASES)
def test_opcheck(case: str, seed: int) -> None:
    name, args = _op_cases()[case]
    torch.library.opcheck(getattr(torch.ops.deepgemm, name).default, args)


@pytest.mark.parametrize("case", OP_CASES)
def test_fake_kernels_give_the_real_shapes_strides_and_dtypes(case: str, seed: int) -> None:
    name, args = _op_cases()[case]
    op = getattr(torch.ops.deepgemm, name).default
    real = None if name.endswith(("_out", "_accumulate")) else op(*args)
    mode = FakeTensorMode()
    fake_args = tuple(mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in args)
    with mode:
        fake = op(*fake_args)
    if real is None:
        assert fake is None
    else:
        assert (tuple(fake.shape), fake.stride(), fake.dtype) == (tuple(real.shape), real.stride(), real.dtype)


@pytest.mark.parametrize("case", OP_CASES)
def test_wrong_ranks_raise_the_public_errors(case: str, seed: int) -> None:
    """A wrong-rank operand raised IndexError while the functional ops computed their output's shape."""
    name, args = _op_cases()[case]
    assert assert_wrong_ranks_raise_typed(getattr(torch.ops.deepgemm, name).default, args) > 0


def test_functional_ops_match_the_public_functions(seed: int) -> None:
    cases = _op_cases()
    a, b, m_indices, _ = cases["contiguous"][1]
    got = torch.ops.deepgemm.m_grouped_bf16_gemm_nt_contiguous(a, b, m_indices)
    assert got.dtype == BF16 and got.shape == (512, 136)
    assert torch.equal(got, contiguous(a, b, torch.empty(512, 136, dtype=BF16), m_indices))
    _, _, psum, _ = cases["contiguous_psum"][1]
    got = torch.ops.deepgemm.m_grouped_bf16_gemm_nt_contiguous_psum(a, b, psum, FP32)
    assert torch.equal(got, contiguous_psum(a, b, torch.empty(512, 136), psum))
    am, _, masked_m, expected_m, _ = cases["masked"][1]
    got = torch.ops.deepgemm.m_grouped_bf16_gemm_nt_masked(am, b, masked_m, expected_m)
    out = masked(am, b, torch.zeros(3, 128, 136, dtype=BF16), masked_m, expected_m)
    assert torch.equal(got, out)  # the functional form zeroes the rows past each count
    assert (got[0, 100:] == 0).all() and (got[1] == 0).all()
    ka, kb, ks, c = cases["k_grouped-c"][1]
    acc = c.clone()
    torch.ops.deepgemm.k_grouped_bf16_gemm_tn_contiguous_accumulate(ka, kb, ks, acc)
    assert torch.equal(acc, torch.ops.deepgemm.k_grouped_bf16_gemm_tn_contiguous(ka, kb, ks, c))
    target = torch.full_like(c, NAN)
    assert torch.ops.deepgemm.k_grouped_bf16_gemm_tn_contiguous_out(ka, kb, ks, None, target) is None
    assert torch.equal(target, k_grouped(ka, kb, torch.empty_like(c), ks))


def _fake_rule_cases() -> dict[str, tuple[str, tuple, Callable[[], object]]]:
    """case -> (op, arguments, the eager call): metadata the rules refuse."""
    b = bf16(2, 32, 64)
    mi = contiguous_layout([100, 128])
    am = bf16(2, 48, 64)
    ka, kb = bf16(384, 12), bf16(384, 24)
    return {
        "contiguous_m_total": ("m_grouped_bf16_gemm_nt_contiguous", (bf16(200, 64), b, mi[:200], None),
                               lambda: contiguous(bf16(200, 64), b, torch.empty(200, 32, dtype=BF16), mi[:200])),
        "psum_n": ("m_grouped_bf16_gemm_nt_contiguous_psum", (bf16(256, 64), bf16(2, 12, 64), psum_of([1, 2]), None),
                   lambda: contiguous_psum(bf16(256, 64), bf16(2, 12, 64), torch.empty(256, 12, dtype=BF16),
                                           psum_of([1, 2]))),
        "masked_max_m": ("m_grouped_bf16_gemm_nt_masked", (am, b, torch.zeros(2, dtype=torch.int32), 8, None),
                         lambda: masked(am, b, torch.empty(2, 48, 32, dtype=BF16), torch.zeros(2, dtype=torch.int32),
                                        8)),
        "k_grouped_m": ("k_grouped_bf16_gemm_tn_contiguous", (ka, kb, [128, 256], None),
                        lambda: k_grouped(ka, kb, torch.empty(2, 12, 24), [128, 256])),
        "k_grouped_ks": ("k_grouped_bf16_gemm_tn_contiguous", (bf16(384, 16), kb, [128, 64], None),
                         lambda: k_grouped(bf16(384, 16), kb, torch.empty(2, 16, 24), [128, 64])),
    }


@pytest.mark.parametrize("case", sorted(_fake_rule_cases()))
def test_fake_kernels_apply_the_metadata_rules(case: str, seed: int) -> None:
    name, args, eager_call = _fake_rule_cases()[case]
    eager = outcome(eager_call)
    assert eager is not None and eager[0] is ValueError
    mode = FakeTensorMode()
    fake_args = tuple(mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in args)
    with mode:
        fake = outcome(lambda: getattr(torch.ops.deepgemm, name)(*fake_args))
    assert fake == eager


def test_compile_with_out_and_accumulate(seed: int) -> None:
    """torch.compile(fullgraph) of every form: graph nodes of the custom ops, the same results as eager; validate=True
    cannot be traced."""
    torch._dynamo.reset()
    cases = _op_cases()
    a, b, m_indices, _ = cases["contiguous"][1]
    _, _, psum, _ = cases["contiguous_psum"][1]
    am, _, masked_m, _, _ = cases["masked"][1]
    ka, kb, ks, c = cases["k_grouped-c"][1]

    def moe(out: torch.Tensor, by_psum: torch.Tensor, masked_out: torch.Tensor, acc: torch.Tensor,
            grads: torch.Tensor) -> torch.Tensor:
        deepgemm.m_grouped_bf16_gemm_nt_contiguous(a, b, out, m_indices)
        deepgemm.m_grouped_bf16_gemm_nt_contiguous_psum(a, b, by_psum, psum)
        deepgemm.m_grouped_bf16_gemm_nt_masked(am, b, masked_out, masked_m, 100)
        deepgemm.k_grouped_bf16_gemm_tn_contiguous(ka, kb, acc, ks, c=acc)
        deepgemm.k_grouped_bf16_gemm_tn_contiguous(ka, kb, grads, ks)
        return out.float().sum() + by_psum.sum() + masked_out.float().sum() + acc.sum() + grads.sum()

    def fresh() -> list[torch.Tensor]:
        return [torch.full((512, 136), NAN, dtype=BF16), torch.full((512, 136), NAN),
                torch.zeros(3, 128, 136, dtype=BF16), c.clone(), torch.full_like(c, NAN)]

    eager_args, compiled_args = fresh(), fresh()
    recorder = GraphRecorder()
    expected = moe(*eager_args)
    got = torch.compile(moe, fullgraph=True, backend=recorder)(*compiled_args)
    assert torch.equal(got, expected)
    for eager_out, compiled_out in zip(eager_args, compiled_args, strict=True):
        assert torch.equal(eager_out, compiled_out)
    assert {"deepgemm.m_grouped_bf16_gemm_nt_contiguous_out", "deepgemm.m_grouped_bf16_gemm_nt_contiguous_psum_out",
            "deepgemm.m_grouped_bf16_gemm_nt_masked_out", "deepgemm.k_grouped_bf16_gemm_tn_contiguous_accumulate",
            "deepgemm.k_grouped_bf16_gemm_tn_contiguous_out"} <= recorder.targets()

    torch._dynamo.reset()

    def checked(out: torch.Tensor) -> torch.Tensor:
        return deepgemm.m_grouped_bf16_gemm_nt_contiguous(a, b, out, m_indices, validate=True)

    with pytest.raises(Exception, match="validate=True"):
        torch.compile(checked, fullgraph=True, backend="eager")(torch.empty(512, 136, dtype=BF16))
