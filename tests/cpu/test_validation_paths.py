"""One validation on every path (issue 25, points 1, 2 and 4).

Every public function applies the kernel's rules before it chooses the path, so a call tested on CPU behaves the same
on Hopper: each malformed call here raises the same exception type with the same message on the reference path and
on the kernel path (simulated on CPU: `backend_for` answers "sm90" and planning a launch fails the test), and the
metadata rules raise the same message from the custom ops' fake kernels. Memory rules (16-byte data pointers, an
output that overlaps another argument or itself) run on the eager checked path. Sizes the GPU kernels cannot index or
launch are refused first; precompile, the dequantizers and calc_diff validate their arguments.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import deepgemm
from deepgemm.api import gemm as gemm_api
from deepgemm.api import grouped as grouped_api
from deepgemm.api import kgrouped as kgrouped_api
from tests.helpers import no_launch, outcome

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16


def q(*names: str) -> str:
    """Regex: the message quotes every name ('a[0]'), in this order."""
    return ".*".join(re.escape(f"'{name}'") for name in names)


def fp8(*shape: int, gen: torch.Generator | None = None) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * 8).to(FP8)


def scales(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) + 0.5


def offset_view(shape: tuple[int, ...], dtype: torch.dtype, offset_elements: int = 1) -> torch.Tensor:
    """A contiguous tensor whose data pointer sits `offset_elements` elements past an aligned allocation."""
    numel = 1
    for size in shape:
        numel *= size
    return torch.zeros(numel + offset_elements, dtype=dtype)[offset_elements:].view(shape)


# ---------------------------------------------------------------- operands


def dense(m: int = 8, n: int = 136, k: int = 256):
    return (fp8(m, k), scales(m, -(-k // 128))), (fp8(n, k), scales(-(-n // 128), -(-k // 128)))


GROUPS, N_GROUPED, K_GROUPED, M_TOTAL, MAX_M = 2, 64, 256, 128, 64


def grouped_b(groups: int = GROUPS, n: int = N_GROUPED, k: int = K_GROUPED):
    return fp8(groups, n, k), scales(groups, -(-n // 128), -(-k // 128))


def contiguous_args(k: int = K_GROUPED):
    a = (fp8(M_TOTAL, k), scales(M_TOTAL, -(-k // 128)))
    m_indices = torch.tensor([0] * 64 + [-1] * 64, dtype=torch.int32)
    return a, grouped_b(k=k), torch.empty(M_TOTAL, N_GROUPED, dtype=BF16), m_indices


def masked_args(k: int = K_GROUPED):
    a = (fp8(GROUPS, MAX_M, k), scales(GROUPS, MAX_M, max(1, -(-k // 128))))
    if k == 0:
        a = (fp8(GROUPS, MAX_M, 0), scales(GROUPS, MAX_M, 0))
    b = grouped_b(k=k) if k else (fp8(GROUPS, N_GROUPED, 0), scales(GROUPS, 1, 0))
    return a, b, torch.zeros(GROUPS, MAX_M, N_GROUPED, dtype=BF16), torch.tensor([5, 64], dtype=torch.int32), 32


KS = [128, 256]


def kgrouped_args():
    a = (fp8(16, 384), scales(16, 3))
    b = (fp8(8, 384), scales(8, 3))
    return a, b, torch.empty(2, 16, 8), KS


# ---------------------------------------------------------------- both paths






def on_both_paths(monkeypatch: pytest.MonkeyPatch, call: Callable[[], object]) -> tuple[object, object]:
    """(outcome on the reference path, outcome on the kernel path): the kernel path is CPU tensors routed to "sm90",
    with planning replaced by a failure, so only validation can stop the call."""
    reference = outcome(call)
    with monkeypatch.context() as patch:
        for module in (gemm_api, grouped_api, kgrouped_api):
            patch.setattr(module, "backend_for", lambda *tensors, **kw: "sm90")
        patch.setattr(gemm_api, "get_plan", no_launch)
        patch.setattr(gemm_api, "tuned_config", lambda *args: None)
        patch.setattr(grouped_api, "get_grouped_plan", no_launch)
        patch.setattr(kgrouped_api, "get_kgrouped_plan", no_launch)
        kernel = outcome(call)
    return reference, kernel


def _case_dense_k100():
    a, b = dense(k=100)
    return lambda: deepgemm.fp8_gemm_nt(a, b), "a[0]"


def _case_dense_a_offset():
    a, b = dense()
    return lambda: deepgemm.fp8_gemm_nt((offset_view((8, 256), FP8), a[1]), b), "a[0]"


def _case_dense_b_strided():
    a, b = dense()
    return lambda: deepgemm.fp8_gemm_nt(a, (fp8(136, 512)[:, ::2], b[1])), "b[0]"


def _case_dense_a_row_stride():
    a, b = dense()
    return lambda: deepgemm.fp8_gemm_nt((fp8(8, 264)[:, :256], a[1]), b), "a[0]"


def _case_dense_out_transposed():
    a, b = dense()
    return lambda: deepgemm.fp8_gemm_nt(a, b, torch.empty(136, 8, dtype=BF16).t()), "out"


def _case_dense_out_row_stride():
    a, b = dense()
    return lambda: deepgemm.fp8_gemm_nt(a, b, torch.empty(8, 140, dtype=BF16)[:, :136]), "out"


def _case_dense_out_offset():
    a, b = dense()
    return lambda: deepgemm.fp8_gemm_nt(a, b, offset_view((8, 136), BF16)), "out"


def _case_contiguous_k100():
    a, b, out, m_indices = contiguous_args(k=100)
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices), "a[0]"


def _case_contiguous_a_offset():
    a, b, out, m_indices = contiguous_args()
    bad = (offset_view((M_TOTAL, K_GROUPED), FP8), a[1])
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous(bad, b, out, m_indices), "a[0]"


def _case_contiguous_out_transposed():
    a, b, _, m_indices = contiguous_args()
    out = torch.empty(N_GROUPED, M_TOTAL, dtype=BF16).t()
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices), "out"


def _case_contiguous_b_not_stacked():
    a, b, out, m_indices = contiguous_args()
    bad = (fp8(GROUPS, 72, K_GROUPED)[:, :N_GROUPED], b[1])
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, bad, out, m_indices), "b[0]"


def _case_psum_out_row_stride():
    a, b, _, _ = contiguous_args()
    out = torch.empty(M_TOTAL, 68, dtype=BF16)[:, :N_GROUPED]
    psum = torch.tensor([64, 64], dtype=torch.int32)
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, out, psum), "out"


def _case_psum_k100():
    a, b, out, _ = contiguous_args(k=100)
    psum = torch.tensor([64, 64], dtype=torch.int32)
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, out, psum), "a[0]"


def _case_masked_k100():
    a, b, out, masked_m, expected = masked_args(k=100)
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected), "a[0]"


def _case_masked_k0():
    a, b, out, masked_m, expected = masked_args(k=0)
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected), "a[0]"


def _case_masked_a_not_stacked():
    a, b, out, masked_m, expected = masked_args()
    bad = (fp8(GROUPS, 2 * MAX_M, K_GROUPED)[:, :MAX_M], a[1])
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(bad, b, out, masked_m, expected), "a[0]"


def _case_masked_out_not_stacked():
    a, b, _, masked_m, expected = masked_args()
    out = torch.zeros(GROUPS, 2 * MAX_M, N_GROUPED, dtype=BF16)[:, :MAX_M]
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected), "out"


def _case_masked_masked_m_strided():
    a, b, out, _, expected = masked_args()
    masked_m = torch.tensor([5, 0, 64, 0], dtype=torch.int32)[::2]
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected), "masked_m"


def _case_masked_out_offset():
    a, b, _, masked_m, expected = masked_args()
    out = offset_view((GROUPS, MAX_M, N_GROUPED), BF16)
    return lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected), "out"


def _case_kgrouped_out_transposed():
    a, b, _, ks = kgrouped_args()
    out = torch.empty(2, 8, 16).transpose(1, 2)
    return lambda: deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, out, ks), "out"


def _case_kgrouped_c_transposed():
    a, b, out, ks = kgrouped_args()
    c = torch.empty(2, 8, 16).transpose(1, 2)
    return lambda: deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, out, ks, c), "c"


def _case_kgrouped_a_strided():
    a, b, out, ks = kgrouped_args()
    bad = (fp8(16, 768)[:, ::2], a[1])
    return lambda: deepgemm.k_grouped_fp8_gemm_tn_contiguous(bad, b, out, ks), "a[0]"


def _case_kgrouped_out_offset():
    a, b, _, ks = kgrouped_args()
    out = offset_view((2, 16, 8), torch.float32)
    return lambda: deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, out, ks), "out"


PATH_CASES = {name.removeprefix("_case_"): fn for name, fn in dict(globals()).items() if name.startswith("_case_")}


@pytest.mark.parametrize("case", sorted(PATH_CASES))
def test_kernel_rules_apply_on_every_path(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """K % 16, unit-stride rows, 16-byte rows and pointers, stacked groups, masked_m contiguity, masked K > 0:
    the same ValueError, naming the argument, on the reference and on the kernel path."""
    call, name = PATH_CASES[case]()
    reference, kernel = on_both_paths(monkeypatch, call)
    assert reference is not None, "the reference path accepted a call the kernel path cannot take"
    assert reference == kernel
    assert reference[0] is ValueError and f"'{name}'" in reference[1], reference


def test_valid_layouts_still_pass_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the kernel takes is still accepted: a narrowed out view with 16-byte rows, M-major and row-major
    scales, a single-row A with any row stride, empty M; the kernel path gets as far as planning."""
    a, b = dense()
    storage = torch.empty(8, 144, dtype=BF16)
    calls = [
        lambda: deepgemm.fp8_gemm_nt(a, b, storage[:, :136]),
        lambda: deepgemm.fp8_gemm_nt((a[0], a[1].t().contiguous().t()), b),
        lambda: deepgemm.fp8_gemm_nt((fp8(1, 512)[:, :256], a[1][:1]), b),
    ]
    for call in calls:
        reference, kernel = on_both_paths(monkeypatch, call)
        assert reference is None
        assert kernel is not None and kernel[0] is AssertionError and "planning" in kernel[1]
    empty = (fp8(0, 256), scales(0, 2))
    assert deepgemm.fp8_gemm_nt(empty, b).shape == (0, 136)


def test_row_limits_are_checked_on_every_path() -> None:
    """More rows than the kernels' 32-bit row index: refused on CPU (meta tensors, no memory) as on the GPU."""
    rows = 2**31
    meta = torch.device("meta")
    a = (torch.empty(rows, 128, dtype=FP8, device=meta), torch.empty(rows, 1, device=meta))
    b = (torch.empty(8, 128, dtype=FP8, device=meta), torch.empty(1, 1, device=meta))
    with pytest.raises(ValueError, match=q("a[0]") + ".*32-bit"):
        deepgemm.fp8_gemm_nt(a, b)
    small = (torch.empty(8, 128, dtype=FP8, device=meta), torch.empty(8, 1, device=meta))
    big = (a[0], torch.empty(rows // 128, 1, device=meta))
    with pytest.raises(ValueError, match=q("b[0]") + ".*32-bit"):
        deepgemm.fp8_gemm_nt(small, big)


def test_k_limit_is_checked_by_every_m_and_n_major_gemm() -> None:
    """K past the 32-bit coordinates: bf16_gemm_* and the k-grouped GEMMs refused it, fp8_gemm_nt and the M-grouped
    GEMMs accepted it (meta tensors stand in for the multi-GB operands; these are the rules the fake kernels run)."""
    from deepgemm.api import bf16 as dense_bf16, bf16_grouped, grouped

    k = 2**31 + 128
    kg, meta, bf16, i32 = k // 128, torch.device("meta"), torch.bfloat16, torch.int32

    def e(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype, device=meta)

    calls = {
        "fp8_gemm_nt": lambda: deepgemm.fp8_gemm_nt((e(1, k, dtype=FP8), e(1, kg)), (e(8, k, dtype=FP8), e(1, kg))),
        "bf16_gemm_nt": lambda: dense_bf16.check_bf16_gemm("nt", e(1, k, dtype=bf16), e(8, k, dtype=bf16), None,
                                                           None, None),
        "fp8 contiguous": lambda: grouped.check_contiguous(
            (e(128, k, dtype=FP8), e(128, kg)), (e(1, 8, k, dtype=FP8), e(1, 1, kg)), e(128, 8, dtype=bf16),
            e(128, dtype=i32), psum_form=False),
        "fp8 masked": lambda: grouped.check_masked(
            (e(1, 64, k, dtype=FP8), e(1, 64, kg)), (e(1, 8, k, dtype=FP8), e(1, 1, kg)), e(1, 64, 8, dtype=bf16),
            e(1, dtype=i32), 64),
        "bf16 contiguous": lambda: bf16_grouped.check_bf16_contiguous(
            e(128, k, dtype=bf16), e(1, 8, k, dtype=bf16), e(128, 8, dtype=bf16), e(128, dtype=i32), psum_form=False),
        "bf16 masked": lambda: bf16_grouped.check_bf16_masked(
            e(1, 64, k, dtype=bf16), e(1, 8, k, dtype=bf16), e(1, 64, 8, dtype=bf16), e(1, dtype=i32), 64),
    }
    for label, call in calls.items():
        with pytest.raises(ValueError, match=r"\(K\) = 2147483776 exceeds the kernels' 32-bit"):
            call()
            pytest.fail(f"{label} accepted K = {k}")


# ---------------------------------------------------------------- the fake kernels apply the same metadata rules


def _fake_copies(*tensors: torch.Tensor) -> tuple[FakeTensorMode, list[torch.Tensor]]:
    mode = FakeTensorMode()
    return mode, [mode.from_tensor(t) for t in tensors]


def test_fake_kernels_raise_the_eager_messages() -> None:
    a, b = dense(k=100)
    eager = outcome(lambda: deepgemm.fp8_gemm_nt(a, b))
    mode, fakes = _fake_copies(*a, *b)
    with mode:
        traced = outcome(lambda: torch.ops.deepgemm.fp8_gemm_nt(*fakes))
    assert eager is not None and eager == traced

    a, b = dense()
    out_t = torch.empty(136, 8, dtype=BF16).t()
    eager = outcome(lambda: deepgemm.fp8_gemm_nt(a, b, out_t))
    mode, fakes = _fake_copies(*a, *b, out_t)
    with mode:
        traced = outcome(lambda: torch.ops.deepgemm.fp8_gemm_nt_out(*fakes))
    assert eager is not None and eager == traced

    (am, sfm), (bm, sbm), out, _, expected = masked_args()
    strided = torch.tensor([5, 0, 64, 0], dtype=torch.int32)[::2]
    eager = outcome(lambda: deepgemm.m_grouped_fp8_gemm_nt_masked((am, sfm), (bm, sbm), out, strided, expected))
    mode, fakes = _fake_copies(am, sfm, bm, sbm, strided, out)
    with mode:
        traced = outcome(lambda: torch.ops.deepgemm.m_grouped_fp8_gemm_nt_masked_out(*fakes[:5], expected, fakes[5]))
    assert eager is not None and eager == traced

    (ka, ksf), (kb, kbsf), _, ks = kgrouped_args()
    out_kt = torch.empty(2, 8, 16).transpose(1, 2)
    eager = outcome(lambda: deepgemm.k_grouped_fp8_gemm_tn_contiguous((ka, ksf), (kb, kbsf), out_kt, ks))
    mode, fakes = _fake_copies(ka, ksf, kb, kbsf, out_kt)
    with mode:
        traced = outcome(lambda: torch.ops.deepgemm.k_grouped_fp8_gemm_tn_contiguous_out(*fakes[:4], ks, None,
                                                                                         fakes[4]))
    assert eager is not None and eager == traced

    x = torch.empty(2**31, 128, device="meta")
    eager = outcome(lambda: deepgemm.quantize_per_token_group(x))
    mode, fakes = _fake_copies(x)
    with mode:
        traced = outcome(lambda: torch.ops.deepgemm.quantize_per_token_group(fakes[0]))
    assert eager is not None and eager == traced


# ---------------------------------------------------------------- aliasing


def test_dense_out_overlapping_an_operand_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    (a0, sfa), b = dense()
    buffer = torch.zeros(8 * 136 + 64)
    shared_sfa = buffer[:16].view(8, 2)
    out = buffer[8:8 + 8 * 136].view(8, 136)  # starts inside sfa
    reference, kernel = on_both_paths(monkeypatch, lambda: deepgemm.fp8_gemm_nt((a0, shared_sfa), b, out))
    assert reference == kernel and reference is not None and reference[0] is ValueError
    assert re.search(q("out", "a[1]"), reference[1]), reference

    raw = torch.zeros(136 * 256 + 16 * 8 * 136, dtype=torch.uint8)
    b0 = raw[:136 * 256].view(FP8).view(136, 256)
    b0.copy_(b[0])
    out_over_b = raw[128 * 256:128 * 256 + 4 * 8 * 136].view(torch.float32).view(8, 136)  # the last rows of B
    with pytest.raises(ValueError, match=q("out", "b[0]")):
        deepgemm.fp8_gemm_nt((a0, sfa), (b0, b[1]), out_over_b)


def test_dense_out_overlapping_itself_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = dense(n=16)
    broadcast = torch.zeros(1, 16).expand(8, 16)  # stride 0 rows
    overlapping_rows = torch.zeros(8 * 8 + 16).as_strided((8, 16), (8, 1))  # rows 8 apart, 16 wide
    for out in (broadcast, overlapping_rows):
        reference, kernel = on_both_paths(monkeypatch, lambda: deepgemm.fp8_gemm_nt(a, b, out))
        assert reference == kernel and reference is not None and reference[0] is ValueError
        assert "'out' overlaps itself" in reference[1], reference


def test_broadcast_fp8_operands_reach_the_kernel_path_as_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows 0 bytes apart (an expanded row) are no TMA tensor: A and B reach the kernel path materialized, and the
    result matches the reference on the broadcast operands."""
    (a0, sfa), (b0, sfb) = dense(n=136)
    a_b, b_b = a0[:1].expand(*a0.shape), b0[:1].expand(*b0.shape)
    expected = deepgemm.fp8_gemm_nt((a_b.contiguous(), sfa), (b_b.contiguous(), sfb))
    assert torch.equal(deepgemm.fp8_gemm_nt((a_b, sfa), (b_b, sfb)), expected)
    monkeypatch.setattr(gemm_api, "backend_for", lambda *tensors, **kw: "sm90")
    monkeypatch.setattr(gemm_api, "tuned_config", lambda *args, **kw: None)
    captured: list[torch.Tensor] = []

    class Plan:
        def packed_args(self, a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                        out: torch.Tensor) -> None:
            captured.extend((a, b))

        def launch_packed(self, args: object) -> None:
            pass

    monkeypatch.setattr(gemm_api, "get_plan", lambda *args, **kw: Plan())
    deepgemm.fp8_gemm_nt((a_b, sfa), (b_b, sfb))
    assert [t.stride(0) for t in captured] == [a0.shape[1], b0.shape[1]]


def test_disjoint_parts_of_one_buffer_are_accepted() -> None:
    """Overlap means intersecting byte ranges, not a shared allocation: a workspace carved in parts is fine."""
    (a0, sfa), b = dense()
    buffer = torch.zeros(16 + 8 * 136)
    shared_sfa = buffer[:16].view(8, 2)
    shared_sfa.copy_(sfa)
    out = buffer[16:].view(8, 136)
    deepgemm.fp8_gemm_nt((a0, shared_sfa), b, out)
    assert torch.equal(out, deepgemm.fp8_gemm_nt((a0, sfa), b, out_dtype=torch.float32))


def test_grouped_out_overlapping_an_argument_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, _, _ = contiguous_args()
    buffer = torch.zeros(M_TOTAL + M_TOTAL * N_GROUPED)
    m_indices = buffer[:M_TOTAL].view(torch.int32)
    m_indices.copy_(torch.tensor([0] * 64 + [-1] * 64, dtype=torch.int32))
    out = buffer[64:64 + M_TOTAL * N_GROUPED].view(M_TOTAL, N_GROUPED)  # starts inside m_indices
    reference, kernel = on_both_paths(monkeypatch,
                                      lambda: deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices))
    assert reference == kernel and reference is not None and reference[0] is ValueError
    assert re.search(q("out", "m_indices"), reference[1]), reference

    am, bm, _, _, expected = masked_args()
    holder = torch.zeros(GROUPS * MAX_M * N_GROUPED)
    out_m = holder.view(GROUPS, MAX_M, N_GROUPED)
    overlapping_masked_m = holder.view(torch.int32)[:GROUPS]  # the first two elements of out
    overlapping_masked_m.zero_()
    reference, kernel = on_both_paths(monkeypatch, lambda: deepgemm.m_grouped_fp8_gemm_nt_masked(
        am, bm, out_m, overlapping_masked_m, expected))
    assert reference == kernel and reference is not None and reference[0] is ValueError
    assert re.search(q("out", "masked_m"), reference[1]), reference


def test_k_grouped_c_is_out_allowed_partial_overlap_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, _, ks = kgrouped_args()
    plain = deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, torch.empty(2, 16, 8), ks)
    acc = torch.ones(2, 16, 8)
    deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, acc, ks, c=acc)  # the documented in-place form
    assert torch.allclose(acc, plain + 1, atol=1e-5)
    same = torch.ones(2, 16, 8)
    deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, same, ks, c=same.view(2, 16, 8))  # the same memory, as a view
    assert torch.allclose(same, plain + 1, atol=1e-5)

    storage = torch.ones(3 * 16 * 8)
    out = storage[:2 * 128].view(2, 16, 8)
    c = storage[128:].view(2, 16, 8)  # c[0] is out[1]
    reference, kernel = on_both_paths(monkeypatch, lambda: deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, out, ks, c))
    assert reference == kernel and reference is not None and reference[0] is ValueError
    assert re.search(q("out", "c"), reference[1]), reference

    sfa_holder = torch.zeros(16 * 3 + 2 * 16 * 8)
    sfa = sfa_holder[:48].view(16, 3)
    sfa.copy_(a[1])
    out_over_sfa = sfa_holder[40:40 + 256].view(2, 16, 8)
    with pytest.raises(ValueError, match=q("out", "a[1]")):
        deepgemm.k_grouped_fp8_gemm_tn_contiguous((a[0], sfa), b, out_over_sfa, ks)


# ---------------------------------------------------------------- the launch-ready fast paths stay validation-free


class _RecordingPlan:
    def __init__(self) -> None:
        self.launches: list[object] = []

    def launch_packed(self, args: object) -> None:
        self.launches.append(args)


def test_fast_paths_do_no_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A remembered argument set launches without the metadata or the memory checks."""
    a, b = dense()
    out = torch.empty(8, 136, dtype=BF16)
    plan = _RecordingPlan()
    monkeypatch.setattr(gemm_api, "_ready", {gemm_api._metadata_key(a[0], a[1], b[0], b[1], out): (plan, "args")})
    monkeypatch.setattr(gemm_api, "check_fp8_gemm_nt", no_launch)
    monkeypatch.setattr(gemm_api, "check_fp8_gemm_nt_memory", no_launch)
    assert deepgemm.fp8_gemm_nt(a, b, out) is out and plan.launches == ["args"]

    ga, gb, gout, m_indices = contiguous_args()
    key = grouped_api._metadata_key(grouped_api._CONTIGUOUS_FORM, ga[0], ga[1], gb[0], gb[1], gout, m_indices)
    monkeypatch.setattr(grouped_api, "_ready", {key: (plan, "grouped")})
    monkeypatch.setattr(grouped_api, "check_contiguous", no_launch)
    monkeypatch.setattr(grouped_api, "_check_memory", no_launch)
    assert deepgemm.m_grouped_fp8_gemm_nt_contiguous(ga, gb, gout, m_indices) is gout
    assert plan.launches == ["args", "grouped"]


# ---------------------------------------------------------------- sizes (point 4)

META = torch.device("meta")


def test_quantizers_refuse_more_than_32_bit_rows_or_columns() -> None:
    with pytest.raises(ValueError, match=q("x") + ".*32-bit"):
        deepgemm.quantize_per_token_group(torch.empty(2**32 + 1, 128, device=META))
    with pytest.raises(ValueError, match=q("x") + ".*32-bit"):
        deepgemm.quantize_per_token_group(torch.empty(2**31, 128, device=META))
    with pytest.raises(ValueError, match=q("w") + ".*32-bit"):
        deepgemm.quantize_per_block(torch.empty(2**31, 128, device=META))


def test_per_block_quantization_refuses_more_than_65535_k_blocks() -> None:
    with pytest.raises(ValueError, match=q("w") + ".*65535"):
        deepgemm.quantize_per_block(torch.empty(1, 65536 * 32, device=META), 32)
    q_meta, sf_meta = deepgemm.quantize_per_block(torch.empty(1, 65535 * 32, device=META), 32)  # the limit itself
    assert sf_meta.shape == (1, 65535)


def test_per_token_group_quantization_refuses_a_grid_past_cuda_limits() -> None:
    with pytest.raises(ValueError, match=q("x") + ".*grid"):
        deepgemm.quantize_per_token_group(torch.empty(2**30, 1024, device=META), 32)


def test_precompile_validates_num_sms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemm_api, "compile_spec", no_launch)
    most = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    for bad, error in ((most + 1, ValueError), (1000, ValueError), (-4, ValueError), (64.0, TypeError),
                       (True, TypeError), ("132", TypeError)):
        with pytest.raises(error, match=q("num_sms")):
            deepgemm.precompile_fp8_gemm_nt(128, 256, 512, num_sms=bad)


def test_dequantizers_validate_sf_dtype_and_dtype() -> None:
    x = torch.randn(5, 256)
    qx, sfx = deepgemm.quantize_per_token_group(x)
    qw, sfw = deepgemm.quantize_per_block(x)
    for fn, q_, sf in ((deepgemm.dequantize_per_token_group, qx, sfx), (deepgemm.dequantize_per_block, qw, sfw)):
        for sf_dtype in (torch.float64, torch.bfloat16, torch.int32):
            with pytest.raises(TypeError, match=q("sf")):
                fn(q_, sf.to(sf_dtype))
        for dtype in (torch.int32, FP8, torch.bool, "bfloat16", None):
            with pytest.raises(TypeError, match=q("dtype")):
                fn(q_, sf, 128, dtype)
        for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            assert fn(q_, sf, 128, dtype).dtype == dtype


def test_calc_diff_rejects_mismatched_shapes() -> None:
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=q("x", "y")):
        deepgemm.calc_diff(x, x[0])
    with pytest.raises(ValueError, match=q("x", "y")):
        deepgemm.calc_diff(x, x.t())
    with pytest.raises(TypeError, match=q("y")):
        deepgemm.calc_diff(x, 1.0)
    assert deepgemm.calc_diff(x, x) == pytest.approx(0.0, abs=1e-15)


def test_meta_tensors_run_every_gemm_as_metadata() -> None:
    """On the meta device (no memory: every data pointer is 0) the out= forms raised a false "'out' overlaps" error
    and the grouped GEMMs failed reading the grouping's values; they now return the output (metadata only), and a
    layout check, which needs values, raises a ValueError saying so."""
    meta, bf16, i32 = torch.device("meta"), torch.bfloat16, torch.int32

    def e(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype, device=meta)

    a, b = (e(256, 256, dtype=FP8), e(256, 2)), (e(2, 64, 256, dtype=FP8), e(2, 1, 2))
    am = (e(2, 128, 256, dtype=FP8), e(2, 128, 2))
    ka, kb = (e(64, 256, dtype=FP8), e(64, 2)), (e(32, 256, dtype=FP8), e(32, 2))
    x, w = e(256, 256, dtype=bf16), e(2, 64, 256, dtype=bf16)
    calls = {
        "fp8_gemm_nt out=": (lambda o: deepgemm.fp8_gemm_nt(a, (b[0][0], b[1][0]), o), e(256, 64, dtype=bf16)),
        "bf16_gemm_nt c=out": (lambda o: deepgemm.bf16_gemm_nt(x, w[0], o, c=o), e(256, 64)),
        "fp8 contiguous": (lambda o: deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, o, e(256, dtype=i32)),
                           e(256, 64, dtype=bf16)),
        "fp8 psum": (lambda o: deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, o, e(2, dtype=i32)),
                     e(256, 64, dtype=bf16)),
        "fp8 masked": (lambda o: deepgemm.m_grouped_fp8_gemm_nt_masked(am, b, o, e(2, dtype=i32), 64),
                       e(2, 128, 64, dtype=bf16)),
        "fp8 k-grouped": (lambda o: deepgemm.k_grouped_fp8_gemm_tn_contiguous(ka, kb, o, [128, 128], c=o),
                          e(2, 64, 32)),
        "bf16 contiguous": (lambda o: deepgemm.m_grouped_bf16_gemm_nt_contiguous(x, w, o, e(256, dtype=i32)),
                            e(256, 64, dtype=bf16)),
        "bf16 psum": (lambda o: deepgemm.m_grouped_bf16_gemm_nt_contiguous_psum(x, w, o, e(2, dtype=i32)),
                      e(256, 64, dtype=bf16)),
        "bf16 masked": (lambda o: deepgemm.m_grouped_bf16_gemm_nt_masked(e(2, 128, 256, dtype=bf16), w, o,
                                                                        e(2, dtype=i32), 64),
                        e(2, 128, 64, dtype=bf16)),
        "bf16 k-grouped": (lambda o: deepgemm.k_grouped_bf16_gemm_tn_contiguous(e(256, 64, dtype=bf16),
                                                                                e(256, 32, dtype=bf16), o, [128, 128]),
                           e(2, 64, 32)),
    }
    for label, (call, out) in calls.items():
        got = call(out)
        assert got is out and got.is_meta, label
    with pytest.raises(ValueError, match="'m_indices' is on the meta device"):
        deepgemm.check_grouped_layout(num_groups=2, m_indices=e(256, dtype=i32))
    with pytest.raises(ValueError, match="validate=True.*meta device"):
        deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, e(256, 64, dtype=bf16), e(256, dtype=i32), validate=True)


def test_sparse_tensors_are_refused_naming_the_argument() -> None:
    """A sparse (COO / CSR) operand reached torch internals and failed with a RuntimeError naming no argument."""
    a = deepgemm.quantize_per_token_group(torch.randn(16, 256))
    b = deepgemm.quantize_per_block(torch.randn(24, 256))
    x, w = torch.randn(16, 32).to(torch.bfloat16), torch.randn(24, 32).to(torch.bfloat16)
    calls = {
        "'x'": lambda: deepgemm.quantize_per_token_group(torch.randn(16, 128).to_sparse()),
        "'w'": lambda: deepgemm.quantize_per_block(torch.randn(16, 128).to_sparse()),
        "'b[1]'": lambda: deepgemm.fp8_gemm_nt(a, (b[0], b[1].to_sparse())),
        "'a'": lambda: deepgemm.bf16_gemm_nt(x.to_sparse_csr(), w),
        "'b'": lambda: deepgemm.bf16_gemm_nt(x, w.to_sparse()),
        "'ks'": lambda: deepgemm.k_grouped_fp8_gemm_tn_contiguous(
            a, deepgemm.quantize_per_token_group(torch.randn(24, 256)), torch.zeros(1, 16, 24),
            torch.tensor([256]).to_sparse()),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=re.escape(name) + " must be a dense \\(strided\\) tensor"):
            call()


def test_outputs_made_in_inference_mode_are_written_only_in_it() -> None:
    """torch refuses in-place writes to an inference tensor outside inference mode: the reference path raised that
    RuntimeError while the kernel path would have written through the pointer. Both now raise the same ValueError
    outside the mode and run inside it."""
    a = deepgemm.quantize_per_token_group(torch.randn(32, 256))
    b = deepgemm.quantize_per_block(torch.randn(64, 256))
    x, w = torch.randn(32, 128).to(torch.bfloat16), torch.randn(64, 128).to(torch.bfloat16)
    ka = deepgemm.quantize_per_token_group(torch.randn(16, 256))
    kb = deepgemm.quantize_per_token_group(torch.randn(24, 256))
    with torch.inference_mode():
        out, acc, kout = torch.empty(32, 64, dtype=torch.bfloat16), torch.zeros(32, 64), torch.zeros(1, 16, 24)
    calls = [lambda: deepgemm.fp8_gemm_nt(a, b, out), lambda: deepgemm.bf16_gemm_nt(x, w, acc, c=acc),
             lambda: deepgemm.k_grouped_fp8_gemm_tn_contiguous(ka, kb, kout, [256])]
    for call in calls:
        with pytest.raises(ValueError, match="'out' was created under torch.inference_mode()"):
            call()
        with torch.inference_mode():
            call()
    assert not out.isnan().any() and acc.abs().sum() > 0 and kout.abs().sum() > 0
