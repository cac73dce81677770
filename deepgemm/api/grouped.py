"""MoE grouped FP8 GEMMs (all groups share N and K): contiguous and masked layouts along M."""

from __future__ import annotations

import functools
from typing import Any

import torch

from deepgemm.api.backend import backend_for
from deepgemm.api.grouped_layout import check_layout_values
from deepgemm.api.layout import tma_rows, to_mn_major_tma_aligned
from deepgemm.api.ready_launches import remember
from deepgemm.api.validation import (
    require_aligned,
    require_dtype,
    require_k_multiple_of_16,
    require_no_overlap,
    require_output,
    require_pair,
    require_rank,
    require_same_device,
    require_shape,
    require_row_count,
    require_stacked_strides,
    require_tensor,
    require_tma_strides,
    refuse_grad,
)
from deepgemm.jit.args import PackedArgs
from deepgemm.kernels.common.device import planning_sm_count
from deepgemm.kernels.common.layout import masked_sfa_strides
from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import Fp8GemmPlan, Geometry, clear_plans, get_grouped_plan, grouped_spec
from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind
from deepgemm.reference import (
    contiguous_row_experts,
    m_grouped_contiguous_reference,
    m_grouped_masked_reference,
    m_indices_from_psum,
)
from deepgemm.utils import align_up, ceil_div

FP8 = torch.float8_e4m3fn
OUT_DTYPES = (torch.bfloat16, torch.float32)
CONTIGUOUS_M_ALIGNMENT = 128
MASKED_M_ALIGNMENT = 64


# Launch-ready work (deepgemm.api.ready_launches); the grouping tensor (m_indices, psum, masked_m) is keyed by
# pointer, its contents are read by the kernel.
_ready: dict[tuple, tuple[Fp8GemmPlan, PackedArgs]] = {}


def _metadata_key(form: object, a_q: torch.Tensor, sfa: torch.Tensor, b_q: torch.Tensor, sfb: torch.Tensor,
                  out: torch.Tensor, grouping: torch.Tensor) -> tuple:
    # Pointers are unique across devices and host memory (unified addressing), so they pin each tensor's device.
    return (form,
            a_q.data_ptr(), a_q.shape, a_q.stride(), a_q.dtype, sfa.data_ptr(), sfa.shape, sfa.stride(), sfa.dtype,
            b_q.data_ptr(), b_q.shape, b_q.stride(), b_q.dtype, sfb.data_ptr(), sfb.shape, sfb.stride(), sfb.dtype,
            out.data_ptr(), out.shape, out.stride(), out.dtype,
            grouping.data_ptr(), grouping.shape, grouping.stride(), grouping.dtype)


_CONTIGUOUS_FORM = "contiguous"
_PSUM_FORM = "psum"


def _masked_form(expected_m: object) -> tuple:
    # The hint's type is part of the key: True == 1 and 64.0 == 64 as keys, but only an int passes validation.
    return ("masked", type(expected_m), expected_m)


def _launch_if_ready(form: object, a: object, b: object, out: Any, grouping: Any) -> bool:
    """Launch with one dictionary lookup if this argument set passed validation before; False otherwise
    (anything unusual, e.g. a non-tensor argument, falls through to the checked path)."""
    if type(a) is not tuple or type(b) is not tuple or len(a) != 2 or len(b) != 2:
        return False
    try:
        ready = _ready.get(_metadata_key(form, a[0], a[1], b[0], b[1], out, grouping))
    except (AttributeError, TypeError, RuntimeError):
        return False
    if ready is None or (torch.is_grad_enabled() and (a[0].requires_grad or a[1].requires_grad or b[0].requires_grad
                                                       or b[1].requires_grad or out.requires_grad)):
        return False
    ready[0].launch_packed(ready[1])
    return True


def clear_grouped_plans() -> None:
    """Forget every plan and launch-ready argument set, and the reference path's memo of the tile rule (for tools
    that swap the tile choice)."""
    clear_plans()
    _ready.clear()
    _kernel_lookup_rows.cache_clear()


def get_m_alignment_for_contiguous_layout() -> int:
    """Rows each expert's segment of A is padded to in the contiguous layout (one M-block never spans two): 128.

    Raises:
        Nothing.

    Example::

        align = deepgemm.get_m_alignment_for_contiguous_layout()
        rows = [-(-t // align) * align for t in (200, 0, 56)]       # [256, 0, 128]
    """
    return CONTIGUOUS_M_ALIGNMENT


def _check_grouped_b(b: object, where: str, k: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    b_q, sfb = require_pair(b, "b", where)
    require_dtype(b_q, "b[0]", where, (FP8,))
    require_rank(b_q, "b[0]", where, 3)
    groups, n, k_b = b_q.shape
    if k_b != k:
        raise ValueError(f"{where}: 'a[0]' has K={k} but 'b[0]' is [G={groups}, N={n}, K={k_b}]; K must match")
    require_dtype(sfb, "b[1]", where, (torch.float32,))
    require_shape(sfb, "b[1]", where, (groups, ceil_div(n, 128), ceil_div(k, 128)),
                  "one scale per expert and 128x128 block: [G, ceil(N/128), ceil(K/128)]")
    return b_q, sfb, groups, n


def _check_out(out: object, where: str, shape: tuple[int, ...]) -> torch.Tensor:
    tensor = require_tensor(out, "out", where)
    require_dtype(tensor, "out", where, OUT_DTYPES)
    require_shape(tensor, "out", where, shape, "the output rows of every expert")
    return tensor


def _check_memory(where: str, a_q: torch.Tensor, sfa: torch.Tensor, b_q: torch.Tensor, sfb: torch.Tensor,
                  out: torch.Tensor, grouping_name: str, grouping: torch.Tensor) -> None:
    """The rules that read data pointers (eager calls only; fake tensors have no storage), shared by every form:
    A, B and out start 16-byte aligned, and out shares no memory with another argument."""
    require_aligned(a_q, "a[0]", where)
    require_aligned(b_q, "b[0]", where)
    require_aligned(out, "out", where)
    require_no_overlap(where, "out", out, (("a[0]", a_q), ("a[1]", sfa), ("b[0]", b_q), ("b[1]", sfb),
                                           (grouping_name, grouping)))


def m_grouped_fp8_gemm_nt_contiguous(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    m_indices: torch.Tensor,
    *,
    validate: bool = False,
) -> torch.Tensor:
    """out[r] = (A[r] * sfa[r]) @ (B[g] * sfb[g])^T for every row r with g = m_indices[r] >= 0.

    Args:
        a = (A e4m3 [M_total, K], sfa float32 [M_total, ceil(K/128)]): the experts' rows back to back, each
            expert's segment padded to get_m_alignment_for_contiguous_layout() rows (M_total is a multiple).
        b = (B e4m3 [G, N, K], sfb float32 [G, ceil(N/128), ceil(K/128)]).
        m_indices: int32 [M_total] on A's device, the expert of each row, -1 for padding rows. Rows whose
            index is -1 (or any value outside [0, G)) are written as zeros; M-blocks that start with such a
            row are padding throughout (segments are aligned) and issue no loads or MMA. Read on the GPU only
            (capturable); the kernel never reads out of bounds, whatever the values.
        out: [M_total, N] bfloat16 or float32, written and returned.
        validate: check m_indices first with deepgemm.check_grouped_layout (reads it on the host: a
            synchronisation, not capturable; for debugging and untrusted routing).
    A, B and out follow fp8_gemm_nt's row rules (K % 16 == 0, unit stride along K, rows 16-byte aligned); B's
    experts are stacked row after row (B.view(G * N, K) is valid).

    How the kernel reads m_indices (the CPU path computes the same): it takes each M-block's expert from the
    block's first row, so row r is computed with e = m_indices[first row of r's 128-row segment] (of its 64-row
    half with the block_m 64 tiles small M_total gets) when both e and m_indices[r] are in [0, G), and is written
    as zeros otherwise. Where each segment holds one expert's rows, padding anywhere but at the start of the
    segment or of a half with rows after it, this is m_indices[r] on every tile. Two experts in a segment, or a
    -1 at such a start, give rows the wrong expert or zeros, depending on the tile: deepgemm.check_grouped_layout
    (or validate=True) refuses such layouts.

    Raises:
        TypeError: `a` or `b` is not a pair of tensors, or a dtype is wrong (A, B not float8_e4m3fn, scales not
            float32, `out` not bfloat16/float32, `m_indices` not int32).
        ValueError: a shape, device or layout rule is broken, on every path: M_total not a multiple of 128,
            K % 16 != 0, a scale, `out` or `m_indices` shape, rows not unit-stride or 16-byte aligned,
            `m_indices` not contiguous, tensors on two devices, `out` overlapping itself or another argument.
        deepgemm.NotDifferentiableError: an argument requires grad while grad mode is on.
        deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError: the first call of a shape could not
            compile, cache or load its kernel (kernel path).
        deepgemm.GraphCaptureError: that first call happens while a CUDA graph is being captured.
        deepgemm.GroupedLayoutError (a ValueError): validate=True and m_indices breaks the layout's rules.

    Example::

        tokens, align = [200, 0, 56], deepgemm.get_m_alignment_for_contiguous_layout()
        sizes = [-(-t // align) * align for t in tokens]            # [256, 0, 128]: segments padded to 128 rows
        m_indices = torch.cat([torch.tensor([g] * t + [-1] * (s - t), dtype=torch.int32)
                               for g, (t, s) in enumerate(zip(tokens, sizes))]).cuda()
        x = torch.randn(sum(sizes), 7168, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(3, 4096, 7168, device="cuda", dtype=torch.bfloat16)
        q, sf = deepgemm.quantize_per_block(w.view(3 * 4096, 7168))  # 128-row blocks never span two experts
        b = (q.view(3, 4096, 7168), sf.view(3, 4096 // 128, 7168 // 128))
        out = torch.empty(sum(sizes), 4096, device="cuda", dtype=torch.bfloat16)
        deepgemm.m_grouped_fp8_gemm_nt_contiguous(deepgemm.quantize_per_token_group(x), b, out, m_indices)
    """
    if not validate and _launch_if_ready(_CONTIGUOUS_FORM, a, b, out, m_indices):
        return out
    a_q, sfa, b_q, sfb, out = check_contiguous(a, b, out, m_indices, psum_form=False)
    if validate:
        check_layout_values(f"{_CONTIGUOUS_WHERE} (validate=True)", num_groups=b_q.shape[0], m_indices=m_indices)
    _check_memory(_CONTIGUOUS_WHERE, a_q, sfa, b_q, sfb, out, "m_indices", m_indices)
    return _run_contiguous(_CONTIGUOUS_WHERE, a_q, sfa, b_q, sfb, out, m_indices, psum_form=False)


def m_grouped_fp8_gemm_nt_contiguous_psum(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    psum: torch.Tensor,
    *,
    validate: bool = False,
) -> torch.Tensor:
    """The contiguous layout described by cumulative row ends instead of a per-row index.

    Rows that belong to no expert (alignment gaps, rows past psum[G - 1]) are written as zeros; M-blocks
    entirely outside every expert issue no loads or MMA.

    Args:
        a / b / out: as for m_grouped_fp8_gemm_nt_contiguous (A [M_total, K], B [G, N, K], out [M_total, N]).
        psum: int32 [G] on A's device; psum[g] is the end row (exclusive) of expert g's valid rows, and expert
            g starts at the next multiple of get_m_alignment_for_contiguous_layout() at or after psum[g - 1]
            (0 for g = 0). An expert with no tokens has psum[g] == psum[g - 1]. psum must not decrease and
            its values are read on the GPU only (capturable; the host never synchronises on it).
        validate: check psum first with deepgemm.check_grouped_layout (reads it on the host: a synchronisation,
            not capturable).

    How the kernel reads any psum (the CPU path computes the same, on every tile): each end is clamped to
    [0, M_total]; row r belongs to the first expert g whose end is past r, if r >= align_up(max(psum[0..g-1]),
    128) (0 for g = 0), and is written as zeros otherwise. So a negative end gives its expert no rows, an end past
    M_total stops at M_total, a decreasing psum gives the expert at the decrease no rows (starts never move
    back), and an end inside the previous expert's alignment gap gives its expert no rows.

    Raises:
        TypeError, ValueError, deepgemm.NotDifferentiableError, deepgemm.CompileError, deepgemm.CacheError,
            deepgemm.LockTimeoutError, deepgemm.GraphCaptureError: as m_grouped_fp8_gemm_nt_contiguous, with
            `psum` (int32 [G], contiguous) in place of `m_indices`.
        deepgemm.GroupedLayoutError (a ValueError): validate=True and psum breaks the layout's rules (negative,
            past M_total, decreasing, or an end inside the previous expert's alignment gap).

    Example::

        # 200, 0 and 56 tokens: expert 0 has rows [0, 200), expert 1 none, expert 2 rows [256, 312)
        psum = torch.tensor([200, 256, 312], dtype=torch.int32, device="cuda")
        x = torch.randn(384, 7168, device="cuda", dtype=torch.bfloat16)       # M_total: a multiple of 128
        w = torch.randn(3, 4096, 7168, device="cuda", dtype=torch.bfloat16)
        q, sf = deepgemm.quantize_per_block(w.view(3 * 4096, 7168))
        b = (q.view(3, 4096, 7168), sf.view(3, 4096 // 128, 7168 // 128))
        out = torch.empty(384, 4096, device="cuda", dtype=torch.bfloat16)
        deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(deepgemm.quantize_per_token_group(x), b, out, psum)
    """
    if not validate and _launch_if_ready(_PSUM_FORM, a, b, out, psum):
        return out
    a_q, sfa, b_q, sfb, out = check_contiguous(a, b, out, psum, psum_form=True)
    if validate:
        check_layout_values(f"{_PSUM_WHERE} (validate=True)", num_groups=b_q.shape[0], psum=psum,
                            m_total=a_q.shape[0])
    _check_memory(_PSUM_WHERE, a_q, sfa, b_q, sfb, out, "psum", psum)
    return _run_contiguous(_PSUM_WHERE, a_q, sfa, b_q, sfb, out, psum, psum_form=True)


_CONTIGUOUS_WHERE = "m_grouped_fp8_gemm_nt_contiguous"
_PSUM_WHERE = "m_grouped_fp8_gemm_nt_contiguous_psum"


def check_contiguous(a: object, b: object, out: object, grouping: object, *, psum_form: bool
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The metadata rules of both contiguous forms (shared with the custom ops' fake kernels)."""
    where = _PSUM_WHERE if psum_form else _CONTIGUOUS_WHERE
    a_q, sfa, b_q, sfb, out_t = _check_contiguous(a, b, out, where)
    if psum_form:
        check_grouping(grouping, "psum", where, a_q, b_q.shape[0], "one cumulative end row per expert")
    else:
        check_grouping(grouping, "m_indices", where, a_q, a_q.shape[0], "one expert index per row of A")
    # The kernel's layout rules, on every path (the reference path could take more, the kernel cannot).
    (m_total, k), (groups, n, _) = a_q.shape, b_q.shape
    require_k_multiple_of_16(k, "a[0]", where)
    require_tma_strides(a_q, "a[0]", where)
    require_stacked_strides(b_q, "b[0]", where)
    require_tma_strides(out_t, "out", where)
    require_output(out_t, "out", where)
    require_row_count(m_total, "'a[0]' (M_total)", where)
    require_row_count(groups * n, "'b[0]' (G * N)", where)
    require_row_count(k, "'a[0]' (K)", where)
    refuse_grad(where, **{"a[0]": a_q, "a[1]": sfa, "b[0]": b_q, "b[1]": sfb, "out": out_t})
    return a_q, sfa, b_q, sfb, out_t


def check_grouping(grouping: object, name: str, where: str, a_q: torch.Tensor, length: int, rule: str
                   ) -> torch.Tensor:
    """A contiguous int32 vector of `length` on A's device (m_indices, psum, masked_m), returned."""
    tensor = require_tensor(grouping, name, where)
    require_dtype(tensor, name, where, (torch.int32,))
    require_shape(tensor, name, where, (length,), rule)
    require_same_device(where, a=a_q, **{name: tensor})
    if not tensor.is_contiguous():
        raise ValueError(f"{where}: '{name}' must be contiguous")
    return tensor


def _check_contiguous(a: object, b: object, out: object, where: str
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    a_q, sfa = require_pair(a, "a", where)
    require_dtype(a_q, "a[0]", where, (FP8,))
    require_rank(a_q, "a[0]", where, 2)
    m_total, k = a_q.shape
    b_q, sfb, _, n = _check_grouped_b(b, where, k)
    require_dtype(sfa, "a[1]", where, (torch.float32,))
    require_shape(sfa, "a[1]", where, (m_total, ceil_div(k, 128)), "[M_total, ceil(K/128)]")
    out_tensor = _check_out(out, where, (m_total, n))
    if m_total % CONTIGUOUS_M_ALIGNMENT:
        raise ValueError(f"{where}: 'a[0]' has M_total={m_total} rows; expert segments are padded to "
                         f"{CONTIGUOUS_M_ALIGNMENT} rows, so M_total must be a multiple of {CONTIGUOUS_M_ALIGNMENT}")
    require_same_device(where, a=a_q, sfa=sfa, b=b_q, sfb=sfb, out=out_tensor)
    return a_q, sfa, b_q, sfb, out_tensor


def _run_contiguous(where: str, a_q: torch.Tensor, sfa: torch.Tensor, b_q: torch.Tensor, sfb: torch.Tensor,
                    out: torch.Tensor, grouping: torch.Tensor, psum_form: bool) -> torch.Tensor:
    (m_total, k), (groups, n, _) = a_q.shape, b_q.shape
    if m_total == 0 or n == 0:
        return out
    if k == 0 or groups == 0:
        return out.zero_()
    if a_q.is_meta:  # no values: the output's metadata is the result
        return out
    if backend_for(a_q) == "reference":
        if psum_form:  # the psum form reads the same for every tile: a well-formed per-row layout
            m_indices, lookup = m_indices_from_psum(grouping, m_total, CONTIGUOUS_M_ALIGNMENT), CONTIGUOUS_M_ALIGNMENT
        else:
            m_indices, lookup = grouping, _kernel_lookup(grouping, groups, n, k, out.dtype)
        out.copy_(m_grouped_contiguous_reference(a_q, sfa, b_q, sfb, m_indices.to(a_q.device), lookup_rows=lookup))
        return out
    kind = GemmKind.GROUPED_CONTIGUOUS_PSUM if psum_form else GemmKind.GROUPED_CONTIGUOUS
    plan = get_grouped_plan(a_q.device.index, kind, Geometry(rows=m_total, groups=groups), n, k, out.dtype, m_total)
    a_rows, sfa_tma, sfb_rows = tma_rows(a_q), to_mn_major_tma_aligned(sfa), sfb.contiguous()
    args = plan.packed_args(a_rows, sfa_tma, b_q, sfb_rows, out, grouping)
    plan.launch_packed(args)
    if a_rows is a_q and sfa_tma is sfa and sfb_rows is sfb:
        form = _PSUM_FORM if psum_form else _CONTIGUOUS_FORM
        remember(_ready, _metadata_key(form, a_q, sfa, b_q, sfb, out, grouping), plan, args)
    return out


def _kernel_lookup(m_indices: torch.Tensor, groups: int, n: int, k: int, out_dtype: torch.dtype) -> int:
    """Rows per expert lookup (reference.contiguous_row_experts) with which the kernel would read this m_indices:
    128, or 64 where the tile rule picks block_m 64 (small M_total). The two read alike except for layouts that
    check_grouped_layout rejects; only for those is the tile rule asked (for the planning SM count: the current
    GPU's, or an H100/H200's without one), so the reference path then gives the kernel's result on that GPU."""
    per_segment = contiguous_row_experts(m_indices, groups, CONTIGUOUS_M_ALIGNMENT)
    if torch.equal(per_segment, contiguous_row_experts(m_indices, groups, CONTIGUOUS_M_ALIGNMENT // 2)):
        return CONTIGUOUS_M_ALIGNMENT
    return _kernel_lookup_rows(m_indices.numel(), groups, n, k, out_dtype, planning_sm_count())


@functools.lru_cache(maxsize=256)
def _kernel_lookup_rows(m_total: int, groups: int, n: int, k: int, out_dtype: torch.dtype, num_sms: int) -> int:
    """Rows per m_indices lookup of the contiguous kernel get_grouped_plan would build: its block_m, at most 128
    (block_m 256 looks up each 128-row half)."""
    spec = grouped_spec(GemmKind.GROUPED_CONTIGUOUS, Geometry(rows=m_total, groups=groups), n, k, out_dtype, m_total,
                        num_sms)
    return min(spec.config.block_m, CONTIGUOUS_M_ALIGNMENT)


def _masked_sfa_layout(sfa: torch.Tensor) -> torch.Tensor:
    """[G, max_m, K/128] scales the masked kernel reads in place (masked_sfa_strides: M contiguous, the other strides
    multiples of 16 bytes), as given: M-major per group (strides (K/128 * s, 1, s)) or a view of one M-major
    [G * max_m, K/128] tensor, as quantize_per_token_group returns for A viewed as [G * max_m, K] (strides
    (max_m, 1, s)). Anything else is copied into the per-group form."""
    if masked_sfa_strides(sfa) is not None:
        return sfa
    groups, max_m, k_groups = sfa.shape
    storage = torch.empty((groups, k_groups, align_up(max(max_m, 1), 4)), dtype=torch.float32, device=sfa.device)
    view = storage[:, :, :max_m]
    view.copy_(sfa.transpose(1, 2))
    return view.transpose(1, 2)


def m_grouped_fp8_gemm_nt_masked(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    masked_m: torch.Tensor,
    expected_m: int,
    *,
    validate: bool = False,
) -> torch.Tensor:
    """out[g, :masked_m[g]] = (A[g] * sfa[g]) @ (B[g] * sfb[g])^T for each expert g.

    Args:
        a = (A e4m3 [G, max_m, K], sfa float32 [G, max_m, ceil(K/128)]); max_m must be a multiple of 64. Scales
            with M contiguous (M-major per group, or quantize_per_token_group(A.view(G * max_m, K))[1] viewed as
            [G, max_m, ceil(K/128)]) are read in place; other layouts are copied on every call.
        b = (B e4m3 [G, N, K], sfb float32 [G, ceil(N/128), ceil(K/128)]).
        out: [G, max_m, N] bfloat16 or float32, written and returned.
        masked_m: int32 [G] on the GPU. The host never reads it, so the call can be captured in a CUDA graph
            and replayed with new counts. Rows at or past masked_m[g] in the last 64-row block of a group
            are overwritten with unspecified values; rows in blocks entirely past masked_m[g] are untouched.
            Any value is read as clamped to [0, max_m] (a negative count: no rows; past max_m: all of them), on
            the kernel and the CPU path alike (the CPU path leaves every row past the count untouched).
        expected_m: the typical masked_m, used only to choose the tile configuration.
        validate: check masked_m first with deepgemm.check_grouped_layout (each count in [0, max_m]; reads it
            on the host: a synchronisation, not capturable).
    A, B and out are stacked row after row (each views as [G * rows, cols]) with fp8_gemm_nt's row rules
    (K % 16 == 0 and K > 0, unit stride along K, rows 16-byte aligned).

    Raises:
        TypeError: `a` or `b` is not a pair of tensors, or a dtype is wrong (A, B not float8_e4m3fn, scales not
            float32, `out` not bfloat16/float32, `masked_m` not int32).
        ValueError: a shape, device or layout rule is broken, on every path: G differs between A and B, max_m
            not a multiple of 64, K == 0 or K % 16 != 0, a scale, `out` or `masked_m` shape, groups not stacked
            or rows not 16-byte aligned, `masked_m` not contiguous, `expected_m` not a positive int, tensors on
            two devices, `out` overlapping itself or another argument.
        deepgemm.NotDifferentiableError: an argument requires grad while grad mode is on.
        deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError: the first call of a shape could not
            compile, cache or load its kernel (kernel path).
        deepgemm.GraphCaptureError: that first call happens while a CUDA graph is being captured.
        deepgemm.GroupedLayoutError (a ValueError): validate=True and a count is outside [0, max_m].

    Example::

        x = torch.randn(4, 256, 7168, device="cuda", dtype=torch.bfloat16)           # [G, max_m, K]
        q, sf = deepgemm.quantize_per_token_group(x.view(4 * 256, 7168))
        a = (q.view(4, 256, 7168), sf.view(4, 256, -1))                               # M-major scales, in place
        w = torch.randn(4, 4096, 7168, device="cuda", dtype=torch.bfloat16)
        qw, sfw = deepgemm.quantize_per_block(w.view(4 * 4096, 7168))
        b = (qw.view(4, 4096, 7168), sfw.view(4, 4096 // 128, 7168 // 128))
        masked_m = torch.tensor([256, 17, 0, 130], dtype=torch.int32, device="cuda")
        out = torch.empty(4, 256, 4096, device="cuda", dtype=torch.bfloat16)
        deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected_m=128)   # out[g, :masked_m[g]]
    """
    if not validate and _launch_if_ready(_masked_form(expected_m), a, b, out, masked_m):
        return out
    a_q, sfa, b_q, sfb, out = check_masked(a, b, out, masked_m, expected_m)
    if validate:
        check_layout_values(f"{_MASKED_WHERE} (validate=True)", num_groups=b_q.shape[0], masked_m=masked_m,
                            max_m=a_q.shape[1])
    _check_memory(_MASKED_WHERE, a_q, sfa, b_q, sfb, out, "masked_m", masked_m)
    return _run_masked(a_q, sfa, b_q, sfb, out, masked_m, expected_m)


_MASKED_WHERE = "m_grouped_fp8_gemm_nt_masked"


def check_masked(a: object, b: object, out: object, masked_m: object, expected_m: object
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The metadata rules of the masked form (shared with the custom ops' fake kernels)."""
    where = _MASKED_WHERE
    a_q, sfa = require_pair(a, "a", where)
    require_dtype(a_q, "a[0]", where, (FP8,))
    require_rank(a_q, "a[0]", where, 3)
    groups_a, max_m, k = a_q.shape
    b_q, sfb, groups, n = _check_grouped_b(b, where, k)
    if groups_a != groups:
        raise ValueError(f"{where}: 'a[0]' has {groups_a} groups but 'b[0]' has {groups}; they must match")
    require_dtype(sfa, "a[1]", where, (torch.float32,))
    require_shape(sfa, "a[1]", where, (groups, max_m, ceil_div(k, 128)), "[G, max_m, ceil(K/128)]")
    out_t = _check_out(out, where, (groups, max_m, n))
    masked_t = require_tensor(masked_m, "masked_m", where)
    require_dtype(masked_t, "masked_m", where, (torch.int32,))
    require_shape(masked_t, "masked_m", where, (groups,), "one row count per expert")
    if isinstance(expected_m, bool) or not isinstance(expected_m, int) or expected_m <= 0:
        raise ValueError(f"{where}: 'expected_m' must be a positive int (a hint for the tile choice), got {expected_m!r}")
    if max_m % MASKED_M_ALIGNMENT:
        raise ValueError(f"{where}: 'a[0]' has max_m={max_m}; it must be a multiple of {MASKED_M_ALIGNMENT} "
                         "so a 64-row output block never crosses into the next expert")
    require_same_device(where, a=a_q, sfa=sfa, b=b_q, sfb=sfb, out=out_t, masked_m=masked_t)
    # The kernel's layout rules, on every path (the reference path could take more, the kernel cannot).
    if k == 0:
        raise ValueError(f"{where}: 'a[0]' has K=0; the masked form needs K > 0 (the host never reads masked_m, so "
                         "it cannot zero the selected rows without a kernel)")
    require_k_multiple_of_16(k, "a[0]", where)
    require_stacked_strides(a_q, "a[0]", where)
    require_stacked_strides(b_q, "b[0]", where)
    require_output(out_t, "out", where)  # (first: its message names the real problem of a broadcast out)
    require_stacked_strides(out_t, "out", where)
    if not masked_t.is_contiguous():
        raise ValueError(f"{where}: 'masked_m' must be contiguous")
    require_row_count(groups * max_m, "'a[0]' (G * max_m)", where)
    require_row_count(groups * n, "'b[0]' (G * N)", where)
    require_row_count(k, "'a[0]' (K)", where)
    refuse_grad(where, **{"a[0]": a_q, "a[1]": sfa, "b[0]": b_q, "b[1]": sfb, "out": out_t})
    return a_q, sfa, b_q, sfb, out_t


def _run_masked(a_q: torch.Tensor, sfa: torch.Tensor, b_q: torch.Tensor, sfb: torch.Tensor, out: torch.Tensor,
                masked_m: torch.Tensor, expected_m: int) -> torch.Tensor:
    (groups, max_m, k), n = a_q.shape, b_q.shape[1]
    if groups == 0 or max_m == 0 or n == 0:
        return out
    if a_q.is_meta:  # no values: the output's metadata is the result
        return out
    if backend_for(a_q) == "reference":
        result = m_grouped_masked_reference(a_q, sfa, b_q, sfb, masked_m)
        rows = torch.arange(max_m, device=out.device)[None, :] < masked_m.to(out.device)[:, None]
        out[rows] = result[rows].to(out.dtype)
        return out
    geometry = Geometry(rows=groups * max_m, groups=groups, max_m=max_m, tiles_known=False)
    plan = get_grouped_plan(a_q.device.index, GemmKind.GROUPED_MASKED, geometry, n, k, out.dtype, expected_m)
    sfa_tma, sfb_rows = _masked_sfa_layout(sfa), sfb.contiguous()
    args = plan.packed_args(a_q, sfa_tma, b_q, sfb_rows, out, masked_m)
    plan.launch_packed(args)
    if sfa_tma is sfa and sfb_rows is sfb:
        remember(_ready, _metadata_key(_masked_form(expected_m), a_q, sfa, b_q, sfb, out, masked_m), plan, args)
    return out
