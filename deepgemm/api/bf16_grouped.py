"""MoE grouped BF16 GEMMs: M-grouped contiguous (m_indices or psum) and masked forms (NT), and the k-grouped TN form
for expert weight gradients. The M-grouped forms share the FP8 siblings' layouts, grouping semantics and CUDA-graph
behaviour; only the operands are plain BF16 tensors instead of (e4m3, scales) pairs."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from deepgemm.api.backend import backend_for
from deepgemm.api.grouped import (
    CONTIGUOUS_M_ALIGNMENT,
    MASKED_M_ALIGNMENT,
    check_grouping,
)
from deepgemm.api.grouped_layout import check_layout_values
from deepgemm.api.kgrouped import (
    K_ALIGNMENT,
    _offsets,
    check_k_grouped_outputs,
    check_ks,
)
from deepgemm.api.layout import tma_rows
from deepgemm.api.ready_launches import remember
from deepgemm.api.validation import (
    MAX_ROWS,
    refuse_grad_for,
    require_aligned,
    require_dtype,
    require_no_overlap,
    require_output,
    require_rank,
    require_row_count,
    require_same_device,
    require_shape,
    require_stacked_strides,
    require_tensor,
    require_tma_strides,
)
from deepgemm.kernels.common.device import planning_sm_count
from deepgemm.kernels.common.kind import GemmKind
from deepgemm.kernels.sm90_bf16_gemm.plan import (
    Bf16Geometry,
    get_bf16_grouped_plan,
    grouped_spec,
)
from deepgemm.reference import (
    contiguous_row_experts,
    k_grouped_bf16_reference,
    m_grouped_bf16_contiguous_reference,
    m_grouped_bf16_masked_reference,
    m_indices_from_psum,
)
from deepgemm.utils import next_power_of_2

BF16 = torch.bfloat16
OUT_DTYPES = (torch.bfloat16, torch.float32)
_CONTIGUOUS_WHERE = "m_grouped_bf16_gemm_nt_contiguous"
_PSUM_WHERE = "m_grouped_bf16_gemm_nt_contiguous_psum"
_MASKED_WHERE = "m_grouped_bf16_gemm_nt_masked"
_KGROUPED_WHERE = "k_grouped_bf16_gemm_tn_contiguous"
_KS_RULE = "the k-grouped layouts' segment alignment, as in the FP8 form"
_NOT_DIFFERENTIABLE = ("the grouped BF16 GEMMs have no backward (they write into `out`); call them under "
                       "torch.no_grad(), or use bf16_gemm_* per expert for autograd")

# Launch-ready work (deepgemm.api.ready_launches): metadata key -> (plan, packed arguments); grouping tensors are
# keyed by pointer, their contents are read by the kernel.
_ready: dict[tuple, tuple] = {}


def _key(form: object, *tensors: torch.Tensor) -> tuple:
    return (form, *((t.data_ptr(), t.shape, t.stride(), t.dtype) for t in tensors))


def _launch_if_ready(form: object, a: object, b: object, out: object, grouping: object) -> bool:
    """Launch with one dictionary lookup if this argument set passed validation before (anything unusual falls
    through to the checked path)."""
    try:
        ready = _ready.get(_key(form, a, b, out, grouping))  # type: ignore[arg-type]
    except (AttributeError, TypeError, RuntimeError):
        return False
    if ready is None or (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad  # type: ignore[attr-defined]
                                                      or out.requires_grad)):  # type: ignore[attr-defined]
        return False
    ready[0].launch_packed(ready[1])
    return True


def _masked_bucket(expected_m: int, max_m: int) -> int:
    """The expected rows the masked tile is chosen for: the next power of two (at most max_m), so a serving loop's
    changing hint builds a handful of plans, not one per value."""
    return min(next_power_of_2(expected_m), max(max_m, 1))


def _check_operands(a: object, b: object, out: object, where: str, a_rank: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A [rows, K] (masked [G, max_m, K]) and B [G, N, K] BF16 with one K, out BF16/FP32 of A's rows by N."""
    a_t = require_tensor(a, "a", where)
    b_t = require_tensor(b, "b", where)
    require_dtype(a_t, "a", where, (BF16,))
    require_dtype(b_t, "b", where, (BF16,))
    require_rank(a_t, "a", where, a_rank)
    require_rank(b_t, "b", where, 3)
    k = a_t.shape[-1]
    groups, n, k_b = b_t.shape
    if k_b != k:
        raise ValueError(f"{where}: 'a' has K={k} but 'b' ([G, N, K]) has K={k_b}; they must match")
    out_t = require_tensor(out, "out", where)
    require_dtype(out_t, "out", where, OUT_DTYPES)
    require_shape(out_t, "out", where, (*a_t.shape[:-1], n), "A's rows by N")
    if n % 8:
        raise ValueError(f"{where}: N={n} (from 'b' [G, N, K]) must be a multiple of 8: the output's rows are "
                         "written in 16-byte TMA units")
    if k % 8:
        raise ValueError(f"{where}: 'a' has K={k}; K must be a multiple of 8 (each BF16 row must span whole 16-byte "
                         "TMA units)")
    require_stacked_strides(b_t, "b", where)
    require_row_count(groups * n, "'b' (G * N)", where)
    require_row_count(k, "'a' (K)", where)
    return a_t, b_t, out_t


def check_bf16_contiguous(a: object, b: object, out: object, grouping: object, *, psum_form: bool
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The metadata rules of both contiguous forms (shared with the custom ops' fake kernels)."""
    where = _PSUM_WHERE if psum_form else _CONTIGUOUS_WHERE
    a_t, b_t, out_t = _check_operands(a, b, out, where, 2)
    m_total, groups = a_t.shape[0], b_t.shape[0]
    if psum_form:
        grouping_t = check_grouping(grouping, "psum", where, a_t, groups, "one cumulative end row per expert")
    else:
        grouping_t = check_grouping(grouping, "m_indices", where, a_t, m_total, "one expert index per row of A")
    if m_total % CONTIGUOUS_M_ALIGNMENT:
        raise ValueError(f"{where}: 'a' has M_total={m_total} rows; expert segments are padded to "
                         f"{CONTIGUOUS_M_ALIGNMENT} rows, so M_total must be a multiple of {CONTIGUOUS_M_ALIGNMENT}")
    require_same_device(where, a=a_t, b=b_t, out=out_t)
    require_tma_strides(a_t, "a", where)
    require_tma_strides(out_t, "out", where)
    require_output(out_t, "out", where)
    require_row_count(m_total, "'a' (M_total)", where)
    refuse_grad_for(where, _NOT_DIFFERENTIABLE, dict(a=a_t, b=b_t, out=out_t))
    return a_t, b_t, out_t, grouping_t


def _check_memory(where: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, grouping_name: str,
                  grouping: torch.Tensor, c: torch.Tensor | None = None) -> None:
    """The rules that read data pointers: 16-byte aligned bases, `out` sharing no memory with another argument (nor
    with `c` unless it is `out`: the in-place form)."""
    require_aligned(a, "a", where)
    require_aligned(b, "b", where)
    require_aligned(out, "out", where)
    in_place = c is not None and c.data_ptr() == out.data_ptr() and c.shape == out.shape and c.stride() == out.stride()
    if c is not None:
        require_aligned(c, "c", where)
    require_no_overlap(where, "out", out, (("a", a), ("b", b), (grouping_name, grouping),
                                           ("c", None if in_place else c)))


def m_grouped_bf16_gemm_nt_contiguous(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, m_indices: torch.Tensor,
                                      *, validate: bool = False) -> torch.Tensor:
    """out[r] = A[r] @ B[g]^T for every row r with g = m_indices[r] >= 0 (BF16 in, FP32 accumulation).

    Args:
        a: bfloat16 [M_total, K], the experts' rows back to back, each expert's segment padded to
            get_m_alignment_for_contiguous_layout() rows (M_total is a multiple); unit stride along K, K % 8 == 0,
            rows 16-byte aligned.
        b: bfloat16 [G, N, K], experts stacked row after row (B.view(G * N, K) is valid); N % 8 == 0.
        out: [M_total, N] bfloat16 or float32, written and returned.
        m_indices: int32 [M_total] on A's device, the expert of each row, -1 for padding rows; read on the GPU only
            (capturable). Rows are read exactly as m_grouped_fp8_gemm_nt_contiguous reads them: each M-block's
            expert is its first row's, rows whose index is outside [0, G) are written as zeros, blocks that start
            with such a row issue no loads.
        validate: check m_indices first with deepgemm.check_grouped_layout (a host synchronisation).

    Raises:
        TypeError: an argument is not a tensor or has the wrong dtype (A, B not bfloat16, `out` not
            bfloat16/float32, `m_indices` not int32).
        ValueError: a shape, device or layout rule is broken, on every path: M_total not a multiple of 128, K or N
            not a multiple of 8, rows not unit-stride or 16-byte aligned, experts not stacked, `m_indices` not
            contiguous, tensors on two devices, `out` overlapping itself or another argument.
        deepgemm.NotDifferentiableError: an argument requires grad while grad mode is on (the grouped forms have
            no backward).
        deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError: the first call of a shape could not
            compile, cache or load its kernel (kernel path).
        deepgemm.GraphCaptureError: that first call happens while a CUDA graph is being captured.
        deepgemm.GroupedLayoutError (a ValueError): validate=True and m_indices breaks the layout's rules.

    Example::

        tokens, align = [200, 0, 56], deepgemm.get_m_alignment_for_contiguous_layout()
        sizes = [-(-t // align) * align for t in tokens]            # [256, 0, 128]
        m_indices = torch.cat([torch.tensor([g] * t + [-1] * (s - t), dtype=torch.int32)
                               for g, (t, s) in enumerate(zip(tokens, sizes))]).cuda()
        x = torch.randn(sum(sizes), 7168, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(3, 4096, 7168, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(sum(sizes), 4096, device="cuda", dtype=torch.bfloat16)
        deepgemm.m_grouped_bf16_gemm_nt_contiguous(x, w, out, m_indices)
    """
    if not validate and _launch_if_ready("contiguous", a, b, out, m_indices):
        return out
    a_t, b_t, out_t, grouping = check_bf16_contiguous(a, b, out, m_indices, psum_form=False)
    if validate:
        check_layout_values(f"{_CONTIGUOUS_WHERE} (validate=True)", num_groups=b_t.shape[0], m_indices=grouping)
    _check_memory(_CONTIGUOUS_WHERE, a_t, b_t, out_t, "m_indices", grouping)
    return _run_contiguous(a_t, b_t, out_t, grouping, psum_form=False)


def m_grouped_bf16_gemm_nt_contiguous_psum(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, psum: torch.Tensor,
                                           *, validate: bool = False) -> torch.Tensor:
    """m_grouped_bf16_gemm_nt_contiguous with the layout given as cumulative end rows instead of per-row indices.

    Args:
        a: bfloat16 [M_total, K], as in m_grouped_bf16_gemm_nt_contiguous (M_total a multiple of 128).
        b: bfloat16 [G, N, K], stacked; N % 8 == 0.
        out: [M_total, N] bfloat16 or float32, written and returned.
        psum: int32 [G] on A's device, contiguous: psum[g] is the end row (exclusive) of expert g's valid rows;
            expert g starts at align_up(psum[g - 1], 128) (psum[-1] = 0); rows in no expert's range are written as
            zeros. Read on the GPU only (capturable), exactly as m_grouped_fp8_gemm_nt_contiguous_psum reads it.
        validate: check psum first with deepgemm.check_grouped_layout (a host synchronisation).

    Raises:
        TypeError, ValueError, deepgemm.NotDifferentiableError, deepgemm.CompileError, deepgemm.CacheError,
        deepgemm.LockTimeoutError, deepgemm.GraphCaptureError, deepgemm.GroupedLayoutError: as
            m_grouped_bf16_gemm_nt_contiguous, with `psum` ([G], one end row per expert) for `m_indices`.

    Example::

        tokens = [200, 0, 56]
        psum = torch.tensor([200, 256, 312], dtype=torch.int32, device="cuda")  # expert 2 starts at row 256
        x = torch.randn(384, 7168, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(3, 4096, 7168, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(384, 4096, device="cuda", dtype=torch.bfloat16)
        deepgemm.m_grouped_bf16_gemm_nt_contiguous_psum(x, w, out, psum)
    """
    if not validate and _launch_if_ready("psum", a, b, out, psum):
        return out
    a_t, b_t, out_t, grouping = check_bf16_contiguous(a, b, out, psum, psum_form=True)
    if validate:
        check_layout_values(f"{_PSUM_WHERE} (validate=True)", num_groups=b_t.shape[0], psum=grouping,
                            m_total=a_t.shape[0])
    _check_memory(_PSUM_WHERE, a_t, b_t, out_t, "psum", grouping)
    return _run_contiguous(a_t, b_t, out_t, grouping, psum_form=True)


def _run_contiguous(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, grouping: torch.Tensor, psum_form: bool
                    ) -> torch.Tensor:
    (m_total, k), (groups, n, _) = a.shape, b.shape
    if m_total == 0 or n == 0:
        return out
    if k == 0 or groups == 0:
        return out.zero_()
    if a.is_meta:  # no values: the output's metadata is the result
        return out
    if backend_for(a) == "reference":
        if psum_form:
            m_indices, lookup = m_indices_from_psum(grouping, m_total, CONTIGUOUS_M_ALIGNMENT), CONTIGUOUS_M_ALIGNMENT
        else:
            m_indices, lookup = grouping, _kernel_lookup(grouping, groups, n, k, out.dtype)
        out.copy_(m_grouped_bf16_contiguous_reference(a, b, m_indices.to(a.device), lookup_rows=lookup))
        return out
    kind = GemmKind.GROUPED_CONTIGUOUS_PSUM if psum_form else GemmKind.GROUPED_CONTIGUOUS
    plan = get_bf16_grouped_plan(a.device.index, kind, Bf16Geometry(m_total, groups), n, k, out.dtype, None, 0)
    a_rows = tma_rows(a)  # (a broadcast A is copied: TMA walks rows by a positive stride)
    args = plan.packed_args(a_rows, b, out, None, grouping)
    plan.launch_packed(args)
    if a_rows is a:
        remember(_ready, _key("psum" if psum_form else "contiguous", a, b, out, grouping), plan, args)
    return out


def _kernel_lookup(m_indices: torch.Tensor, groups: int, n: int, k: int, out_dtype: torch.dtype) -> int:
    """Rows per m_indices lookup the kernel would use (its block_m): only asked for layouts where 64 and 128 differ,
    which check_grouped_layout rejects (the FP8 form's rule)."""
    per_segment = contiguous_row_experts(m_indices, groups, CONTIGUOUS_M_ALIGNMENT)
    if torch.equal(per_segment, contiguous_row_experts(m_indices, groups, CONTIGUOUS_M_ALIGNMENT // 2)):
        return CONTIGUOUS_M_ALIGNMENT
    return _kernel_block_m(m_indices.numel(), groups, n, k, out_dtype, planning_sm_count())


@functools.lru_cache(maxsize=256)
def _kernel_block_m(m_total: int, groups: int, n: int, k: int, out_dtype: torch.dtype, num_sms: int) -> int:
    spec = grouped_spec(GemmKind.GROUPED_CONTIGUOUS, Bf16Geometry(m_total, groups), n, k, out_dtype, None, 0, num_sms)
    return spec.config.block_m


def check_bf16_masked(a: object, b: object, out: object, masked_m: object, expected_m: object
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The metadata rules of the masked form (shared with the custom ops' fake kernels)."""
    where = _MASKED_WHERE
    a_t, b_t, out_t = _check_operands(a, b, out, where, 3)
    groups_a, max_m, k = a_t.shape
    groups = b_t.shape[0]
    if groups_a != groups:
        raise ValueError(f"{where}: 'a' has {groups_a} groups but 'b' has {groups}; they must match")
    masked_t = check_grouping(masked_m, "masked_m", where, a_t, groups, "one row count per expert")
    if isinstance(expected_m, bool) or not isinstance(expected_m, int) or expected_m <= 0:
        raise ValueError(f"{where}: 'expected_m' must be a positive int (a hint for the tile choice), got {expected_m!r}")
    if max_m % MASKED_M_ALIGNMENT:
        raise ValueError(f"{where}: 'a' has max_m={max_m}; it must be a multiple of {MASKED_M_ALIGNMENT} so a 64-row "
                         "output block never crosses into the next expert")
    if k == 0:
        raise ValueError(f"{where}: 'a' has K=0; the masked form needs K > 0 (the host never reads masked_m, so it "
                         "cannot zero the selected rows without a kernel)")
    require_same_device(where, a=a_t, b=b_t, out=out_t)
    require_stacked_strides(a_t, "a", where)
    require_output(out_t, "out", where)  # (first: its message names the real problem of a broadcast out)
    require_stacked_strides(out_t, "out", where)
    require_row_count(groups * max_m, "'a' (G * max_m)", where)
    refuse_grad_for(where, _NOT_DIFFERENTIABLE, dict(a=a_t, b=b_t, out=out_t))
    return a_t, b_t, out_t, masked_t


def m_grouped_bf16_gemm_nt_masked(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, masked_m: torch.Tensor,
                                  expected_m: int, *, validate: bool = False) -> torch.Tensor:
    """out[g, :masked_m[g]] = A[g, :masked_m[g]] @ B[g]^T for each expert g (BF16 in, FP32 accumulation).

    Args:
        a: bfloat16 [G, max_m, K] (max_m a multiple of 64), groups stacked row after row; K % 8 == 0, K > 0.
        b: bfloat16 [G, N, K], stacked; N % 8 == 0.
        out: [G, max_m, N] bfloat16 or float32, stacked; written and returned.
        masked_m: int32 [G] on the GPU, never read by the host (the call can be captured and replayed with new
            counts); as in m_grouped_fp8_gemm_nt_masked, a count is read as clamped to [0, max_m], rows past it in
            a group's last 64-row block get unspecified values and later blocks are untouched.
        expected_m: the typical masked_m, used only to choose the tile (bucketed to a power of two).
        validate: check masked_m first with deepgemm.check_grouped_layout (a host synchronisation).

    Raises:
        TypeError: an argument is not a tensor or has the wrong dtype.
        ValueError: a shape, device or layout rule is broken, on every path: G differs between A and B, max_m not a
            multiple of 64, K == 0, K or N not a multiple of 8, groups not stacked or rows not 16-byte aligned,
            `masked_m` not contiguous, `expected_m` not a positive int, tensors on two devices, `out` overlapping
            itself or another argument.
        deepgemm.NotDifferentiableError, deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError,
        deepgemm.GraphCaptureError, deepgemm.GroupedLayoutError: as m_grouped_bf16_gemm_nt_contiguous.

    Example::

        x = torch.randn(4, 256, 7168, device="cuda", dtype=torch.bfloat16)   # [G, max_m, K]
        w = torch.randn(4, 4096, 7168, device="cuda", dtype=torch.bfloat16)
        masked_m = torch.tensor([256, 17, 0, 130], dtype=torch.int32, device="cuda")
        out = torch.empty(4, 256, 4096, device="cuda", dtype=torch.bfloat16)
        deepgemm.m_grouped_bf16_gemm_nt_masked(x, w, out, masked_m, expected_m=128)
    """
    form = ("masked", type(expected_m), expected_m)
    if not validate and _launch_if_ready(form, a, b, out, masked_m):
        return out
    a_t, b_t, out_t, masked_t = check_bf16_masked(a, b, out, masked_m, expected_m)
    if validate:
        check_layout_values(f"{_MASKED_WHERE} (validate=True)", num_groups=b_t.shape[0], masked_m=masked_t,
                            max_m=a_t.shape[1])
    _check_memory(_MASKED_WHERE, a_t, b_t, out_t, "masked_m", masked_t)
    (groups, max_m, k), n = a_t.shape, b_t.shape[1]
    if groups == 0 or max_m == 0 or n == 0:
        return out_t
    if a_t.is_meta:  # no values: the output's metadata is the result
        return out_t
    if backend_for(a_t) == "reference":
        result = m_grouped_bf16_masked_reference(a_t, b_t, masked_t)
        rows = torch.arange(max_m, device=out_t.device)[None, :] < masked_t.to(out_t.device)[:, None]
        out_t[rows] = result[rows].to(out_t.dtype)
        return out_t
    geometry = Bf16Geometry(groups * max_m, groups, max_m)
    plan = get_bf16_grouped_plan(a_t.device.index, GemmKind.GROUPED_MASKED, geometry, n, k, out_t.dtype, None,
                                 _masked_bucket(expected_m, max_m))  # type: ignore[arg-type]
    args = plan.packed_args(a_t, b_t, out_t, None, masked_t)
    plan.launch_packed(args)
    remember(_ready, _key(form, a_t, b_t, out_t, masked_t), plan, args)
    return out_t


def check_bf16_k_grouped(a: object, b: object, out: object, ks: object, c: object
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, tuple[int, ...]]:
    """The metadata rules of the k-grouped form (shared with the custom ops' fake kernels); returns the validated
    ks."""
    where = _KGROUPED_WHERE
    a_t = require_tensor(a, "a", where)
    b_t = require_tensor(b, "b", where)
    require_dtype(a_t, "a", where, (BF16,))
    require_dtype(b_t, "b", where, (BF16,))
    require_rank(a_t, "a", where, 2)
    require_rank(b_t, "b", where, 2)
    (k_total, m), (k_b, n) = a_t.shape, b_t.shape
    if k_b != k_total:
        raise ValueError(f"{where}: 'a' ([K_total, M]) has K_total={k_total} tokens but 'b' ([K_total, N]) has {k_b}; "
                         "they must match")
    sizes = check_ks(ks, where, _KS_RULE)
    if sum(sizes) != k_total:
        raise ValueError(f"{where}: 'ks' sums to {sum(sizes)} tokens but the operands hold K_total={k_total}")
    out_t, c_t = check_k_grouped_outputs(out, c, (len(sizes), m, n), where, {"a": a_t, "b": b_t})
    for name, extent, what in (("a", m, "M"), ("b", n, "N")):
        if extent % 8:
            raise ValueError(f"{where}: '{name}' has {what}={extent}; {what} must be a multiple of 8 (its token rows "
                             "are read in 16-byte TMA units)")
        require_tma_strides(a_t if name == "a" else b_t, name, where)
    require_row_count(m, "'a' (M)", where)
    require_row_count(n, "'b' (N)", where)
    if k_total > MAX_ROWS:
        raise ValueError(f"{where}: 'a' has K_total={k_total} tokens, past the kernel's 32-bit K coordinates "
                         f"({MAX_ROWS})")
    refuse_grad_for(where, _NOT_DIFFERENTIABLE, dict(a=a_t, b=b_t, out=out_t, c=c_t))
    return a_t, b_t, out_t, c_t, sizes


def k_grouped_bf16_gemm_tn_contiguous(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
                                      ks: Sequence[int] | torch.Tensor, c: torch.Tensor | None = None) -> torch.Tensor:
    """out[g] = c[g] + A_g^T B_g for every group g, FP32, with token-major BF16 operands (the expert weight gradient
    dW_g = dY_g^T X_g from dY and X as the forward pass holds them: no transposed copy).

    Group g owns tokens [sum(ks[:g]), sum(ks[:g + 1])) of both operands.

    Args:
        a: bfloat16 [K_total, M] (dY), M contiguous: M % 8 == 0, rows 16-byte aligned.
        b: bfloat16 [K_total, N] (X), under A's rules.
        out: float32 [G, M, N], contiguous, written and returned.
        ks: tokens per group (host ints or a CPU int32/int64 tensor, each a multiple of 128, summing to K_total; 0
            is allowed: that group's output is c[g], or zeros). The offsets are uploaded once per distinct ks, so a
            call can be captured in a CUDA graph after it has run once with the same ks.
        c: None or float32 [G, M, N], contiguous; it may be `out` itself (accumulate in place).

    Raises:
        TypeError: an argument is not a tensor or has the wrong dtype (A, B not bfloat16, `out`, `c` not float32),
            or `ks` is not host ints.
        ValueError: a shape, device or layout rule is broken, on every path: A and B disagree on K_total, a `ks`
            entry not a multiple of 128 or `ks` not summing to K_total, M or N not a multiple of 8, rows not
            unit-stride or 16-byte aligned, `out` or `c` not contiguous or of the wrong shape, tensors on two
            devices, `out` sharing memory with an operand or with a `c` that is not `out`.
        deepgemm.NotDifferentiableError, deepgemm.CompileError, deepgemm.CacheError, deepgemm.LockTimeoutError:
            as m_grouped_bf16_gemm_nt_contiguous.
        deepgemm.GraphCaptureError: the first call of a shape, or the first call with a new `ks`, happens while a
            CUDA graph is being captured.

    Example::

        ks = [256, 0, 384]                                                    # tokens per expert
        dy = torch.randn(sum(ks), 4096, device="cuda", dtype=torch.bfloat16)  # [tokens, M]
        x = torch.randn(sum(ks), 7168, device="cuda", dtype=torch.bfloat16)   # [tokens, N]
        dw = torch.empty(len(ks), 4096, 7168, device="cuda", dtype=torch.float32)
        deepgemm.k_grouped_bf16_gemm_tn_contiguous(dy, x, dw, ks)             # dw[g] = dY_g^T X_g
        deepgemm.k_grouped_bf16_gemm_tn_contiguous(dy, x, dw, ks, c=dw)       # dw[g] += dY_g^T X_g
    """
    a_t, b_t, out_t, c_t, sizes = check_bf16_k_grouped(a, b, out, ks, c)
    require_aligned(a_t, "a", _KGROUPED_WHERE)
    require_aligned(b_t, "b", _KGROUPED_WHERE)
    require_aligned(out_t, "out", _KGROUPED_WHERE)
    in_place = c_t is not None and c_t.data_ptr() == out_t.data_ptr()
    if c_t is not None:
        require_aligned(c_t, "c", _KGROUPED_WHERE)
    require_no_overlap(_KGROUPED_WHERE, "out", out_t, (("a", a_t), ("b", b_t), ("c", None if in_place else c_t)))
    (k_total, m), n, groups = a_t.shape, b_t.shape[1], len(sizes)
    if groups == 0 or m == 0 or n == 0:
        return out_t
    if a_t.is_meta:  # no values: the output's metadata is the result
        return out_t
    if backend_for(a_t) == "reference":
        out_t.copy_(k_grouped_bf16_reference(a_t, b_t, list(sizes), c_t))
        return out_t
    if k_total == 0:
        return out_t.copy_(c_t) if c_t is not None else out_t.zero_()
    c_dtype = None if c_t is None else torch.float32
    # c = out: the kernel adds its tiles into out with reduce-add stores (C is never loaded into registers).
    plan = get_bf16_grouped_plan(a_t.device.index, GemmKind.K_GROUPED, Bf16Geometry(m, groups), n, 0, torch.float32,
                                 c_dtype, 0, in_place)
    plan.launch(tma_rows(a_t), tma_rows(b_t), out_t, None if in_place else c_t,
                _offsets.get(a_t.device, sizes, _KGROUPED_WHERE))
    return out_t


def clear_bf16_grouped_plans() -> None:
    """Forget the launch-ready argument sets and the reference path's memo of the tile rule."""
    _ready.clear()
    _kernel_block_m.cache_clear()


__all__ = [
    "K_ALIGNMENT",
    "check_bf16_contiguous",
    "check_bf16_k_grouped",
    "check_bf16_masked",
    "clear_bf16_grouped_plans",
    "k_grouped_bf16_gemm_tn_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous_psum",
    "m_grouped_bf16_gemm_nt_masked",
]
