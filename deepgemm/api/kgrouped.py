"""K-grouped FP8 GEMM for the MoE expert weight gradient (Wgrad): groups split the K (token) dimension."""

from __future__ import annotations

import operator
import threading
from collections.abc import Iterable, Sequence

import torch

from deepgemm.api.backend import backend_for
from deepgemm.api.layout import to_mn_major_tma_aligned
from deepgemm.api.validation import (
    require_dtype,
    require_pair,
    require_rank,
    require_row_count,
    require_same_device,
    require_shape,
    require_tensor,
)
from deepgemm.reference import k_grouped_reference

FP8 = torch.float8_e4m3fn
K_ALIGNMENT = 128

_offsets: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}
_offsets_lock = threading.Lock()


def _check_ks(ks: object, where: str) -> tuple[int, ...]:
    if isinstance(ks, torch.Tensor):
        if ks.is_cuda:
            raise TypeError(f"{where}: 'ks' must be host values (a list of ints or a CPU tensor); a CUDA tensor would "
                            "force a device synchronisation")
        if ks.dim() != 1 or ks.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{where}: 'ks' must be a 1-D int32/int64 tensor, got {ks.dtype} {tuple(ks.shape)}")
        ks = ks.tolist()
    if isinstance(ks, (str, bytes)) or not isinstance(ks, Iterable):
        raise TypeError(f"{where}: 'ks' must be a sequence of ints (tokens per group), got {type(ks).__name__}")
    values = []
    for g, value in enumerate(ks):
        try:
            k = operator.index(value)  # ints and numpy integers, never floats
        except TypeError:
            raise TypeError(f"{where}: 'ks[{g}]' must be an int, got {type(value).__name__}") from None
        if isinstance(value, bool):
            raise TypeError(f"{where}: 'ks[{g}]' must be an int, got bool")
        if k < 0 or k % K_ALIGNMENT:
            raise ValueError(f"{where}: 'ks[{g}]'={k} must be a non-negative multiple of {K_ALIGNMENT} "
                             "(each group's token segment holds whole 1x128 scale blocks)")
        values.append(k)
    return tuple(values)


def _device_offsets(device: torch.device, ks: tuple[int, ...]) -> torch.Tensor:
    """int32 [G + 1] cumulative K offsets on the device, uploaded once per (device, ks) (capturable afterwards)."""
    key = (device.index if device.index is not None else torch.cuda.current_device(), ks)
    offsets = _offsets.get(key)
    if offsets is None:
        from deepgemm.jit.runtime import refuse_during_capture

        refuse_during_capture(f"k_grouped_fp8_gemm_tn_contiguous with ks={list(ks)[:8]}... (upload of its offsets)")
        cumulative = [0]
        for k in ks:
            cumulative.append(cumulative[-1] + k)
        with _offsets_lock:
            if len(_offsets) >= 1024:
                _offsets.clear()
            offsets = _offsets.setdefault(key, torch.tensor(cumulative, dtype=torch.int32).to(device))
    return offsets


def k_grouped_fp8_gemm_tn_contiguous(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    out: torch.Tensor,
    ks: Sequence[int] | torch.Tensor,
    c: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[g] = c[g] + A_g^T B_g for every group g, FP32, with 1x128 scales on both operands (1D1D).

    The groups' token segments lie back to back along the K dimension: group g owns tokens
    [sum(ks[:g]), sum(ks[:g + 1])). For the expert weight gradient dW_g = dY_g^T X_g, pass the
    activations transposed so tokens are contiguous (what the tensor cores read):
    a = (A e4m3 [M, K_total], sfa float32 [M, K_total/128]) = quantize_per_token_group(dY.t()) and
    b = (B e4m3 [N, K_total], sfb float32 [N, K_total/128]) = quantize_per_token_group(X.t()), so A_g^T B_g
    is A[:, seg g] @ B[:, seg g]^T scaled per row and 128-token block on both sides.
    ks: tokens per group (host ints, each a multiple of 128, summing to K_total; 0 is allowed: that
        group's output is c[g], or zeros). The offsets are uploaded once per distinct ks, so a call can be
        captured in a CUDA graph after it has run once with the same ks.
    out: float32 [G, M, N], contiguous, written and returned. c: None or float32 [G, M, N], contiguous;
        it may be `out` itself (accumulate in place).
    """
    where = "k_grouped_fp8_gemm_tn_contiguous"
    a_q, sfa = require_pair(a, "a", where)
    b_q, sfb = require_pair(b, "b", where)
    for name, t in (("a[0]", a_q), ("b[0]", b_q)):
        require_dtype(t, name, where, (FP8,))
        require_rank(t, name, where, 2)
    (m, k_total), (n, k_b) = a_q.shape, b_q.shape
    if k_b != k_total:
        raise ValueError(f"{where}: 'a[0]' has K_total={k_total} tokens but 'b[0]' has {k_b}; they must match")
    if k_total % K_ALIGNMENT:
        raise ValueError(f"{where}: K_total={k_total} must be a multiple of {K_ALIGNMENT}")
    for name, t, rows in (("a[1]", sfa, m), ("b[1]", sfb, n)):
        require_dtype(t, name, where, (torch.float32,))
        require_shape(t, name, where, (rows, k_total // K_ALIGNMENT), "one scale per row and 128 tokens")
    sizes = _check_ks(ks, where)
    if sum(sizes) != k_total:
        raise ValueError(f"{where}: 'ks' sums to {sum(sizes)} tokens but the operands hold K_total={k_total}")
    groups = len(sizes)
    out_t = require_tensor(out, "out", where)
    require_dtype(out_t, "out", where, (torch.float32,))
    require_shape(out_t, "out", where, (groups, m, n), "[G, M, N] (one FP32 gradient per group)")
    tensors = {"a": a_q, "sfa": sfa, "b": b_q, "sfb": sfb, "out": out_t}
    if c is not None:
        c_t = require_tensor(c, "c", where)
        require_dtype(c_t, "c", where, (torch.float32,))
        require_shape(c_t, "c", where, (groups, m, n), "the same [G, M, N] as out")
        tensors["c"] = c_t
    require_same_device(where, **tensors)
    if groups == 0 or m == 0 or n == 0:
        return out_t
    if backend_for(a_q) == "reference":
        out_t.copy_(k_grouped_reference(a_q, sfa, b_q, sfb, list(sizes), c))
        return out_t
    for name, maybe in (("out", out_t), ("c", c)):
        if maybe is not None and not maybe.is_contiguous():
            raise ValueError(f"{where}: '{name}' must be contiguous (rows of each group are stored back to back)")
    for name, t in (("a[0]", a_q), ("b[0]", b_q)):
        if t.shape[0] > 1 and (t.stride(1) != 1 or (t.stride(0) % 16) or t.data_ptr() % 16):
            raise ValueError(f"{where}: '{name}' rows must be contiguous, 16-byte aligned and a multiple of 16 bytes "
                             f"apart (TMA rule), got strides {t.stride()}")
    require_row_count(max(m, n, k_total // K_ALIGNMENT), "max(M, N, K_total / 128)", where)
    if k_total == 0:
        return out_t.copy_(c) if c is not None else out_t.zero_()
    from deepgemm.kernels.kgrouped import get_kgrouped_plan

    plan = get_kgrouped_plan(a_q.device.index, m, n)
    plan.launch(a_q, to_mn_major_tma_aligned(sfa), b_q, to_mn_major_tma_aligned(sfb),
                _device_offsets(a_q.device, sizes), groups, out_t, c)
    return out_t
