"""Reference math: dequantize, then multiply in float32 (or float64 for tests).

This is the path CPU tensors and non-Hopper GPUs take, and the yardstick of the GPU tests. The
quantizers here produce bit-identical results to the GPU kernels (same scale rule, IEEE division,
round-to-nearest-even into e4m3).
"""

from __future__ import annotations

import torch

from deepgemm.utils import ceil_div

E4M3_MAX = 448.0
FLOAT32_MIN = torch.finfo(torch.float32).tiny


def fp8_scale(amax: torch.Tensor) -> torch.Tensor:
    """max(amax / 448, FLT_MIN): all-zero groups get a tiny positive scale, never 0, NaN or Inf."""
    return torch.clamp(amax / E4M3_MAX, min=FLOAT32_MIN)


def _pad_to(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, cols - x.shape[1], 0, rows - x.shape[0]))


def quantize_per_token_group_reference(x: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q e4m3 [M, K], sf [M, ceil(K/g)] float32, row-major)."""
    m, k = x.shape
    groups = ceil_div(k, group_size)
    padded = _pad_to(x.float(), m, groups * group_size).view(m, groups, group_size)
    scale = fp8_scale(padded.abs().amax(dim=2))
    q = (padded / scale.unsqueeze(2)).view(m, groups * group_size)[:, :k].to(torch.float8_e4m3fn)
    return q.contiguous(), scale


def quantize_per_block_reference(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q e4m3 [N, K], sf [ceil(N/b), ceil(K/b)] float32)."""
    n, k = w.shape
    nb, kb = ceil_div(n, block), ceil_div(k, block)
    padded = _pad_to(w.float(), nb * block, kb * block).view(nb, block, kb, block)
    scale = fp8_scale(padded.abs().amax(dim=(1, 3)))
    q = (padded / scale[:, None, :, None]).view(nb * block, kb * block)[:n, :k].to(torch.float8_e4m3fn)
    return q.contiguous(), scale


def dequantize_per_token_group(q: torch.Tensor, sf: torch.Tensor, group_size: int = 128,
                               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    k = q.shape[1]
    return q.to(dtype) * sf.to(dtype).repeat_interleave(group_size, dim=1)[:, :k]


def dequantize_per_block(q: torch.Tensor, sf: torch.Tensor, block: int = 128,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    n, k = q.shape
    expanded = sf.to(dtype).repeat_interleave(block, dim=0).repeat_interleave(block, dim=1)
    return q.to(dtype) * expanded[:n, :k]


def fp8_gemm_nt_reference(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                          compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(A * sfa) @ (B * sfb)^T in `compute_dtype` (float32 for the fallback, float64 for tests)."""
    a_deq = dequantize_per_token_group(a, sfa, 128, compute_dtype)
    b_deq = dequantize_per_block(b, sfb, 128, compute_dtype)
    return a_deq @ b_deq.t()


def m_grouped_contiguous_reference(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                                   m_indices: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows of group g (m_indices == g) times B[g]; rows with any other index (padding, -1) are zero."""
    out = torch.zeros((a.shape[0], b.shape[1]), dtype=compute_dtype, device=a.device)
    for group in range(b.shape[0]):
        rows = (m_indices == group).nonzero().flatten()
        if rows.numel():
            out[rows] = fp8_gemm_nt_reference(a[rows], sfa[rows], b[group], sfb[group], compute_dtype)
    return out


def k_grouped_reference(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, ks: list[int],
                        c: torch.Tensor | None, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """out[g] = c[g] + (A[:, seg g] * sfa) @ (B[:, seg g] * sfb)^T over the groups' K segments (1x128 scales on both)."""
    m, n = a.shape[0], b.shape[0]
    out = torch.zeros((len(ks), m, n), dtype=compute_dtype, device=a.device)
    if c is not None:
        out += c.to(compute_dtype)
    begin = 0
    for group, k in enumerate(ks):
        if k:
            cols, scale_cols = slice(begin, begin + k), slice(begin // 128, (begin + k) // 128)
            out[group] += fp8_gemm_nt_reference_1d1d(a[:, cols], sfa[:, scale_cols], b[:, cols], sfb[:, scale_cols],
                                                     compute_dtype)
        begin += k
    return out


def fp8_gemm_nt_reference_1d1d(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                               compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(A * sfa) @ (B * sfb)^T with 1x128 scales on both operands."""
    return dequantize_per_token_group(a, sfa, 128, compute_dtype) @ dequantize_per_token_group(b, sfb, 128, compute_dtype).t()


def m_indices_from_psum(psum: torch.Tensor, m_total: int, alignment: int = 128) -> torch.Tensor:
    """Per-row expert indices of the psum form: group g owns rows [align_up(psum[g-1]), psum[g]), -1 elsewhere.

    Mirrors the kernel's reading of an invalid (decreasing) psum: a group never starts before an earlier end.
    """
    indices = torch.full((m_total,), -1, dtype=torch.int32)
    previous_end = 0
    for group, end in enumerate(psum.tolist()):
        end = max(0, min(int(end), m_total))
        start = -(-previous_end // alignment) * alignment
        if end > start:
            indices[start:end] = group
        previous_end = max(previous_end, end)
    return indices.to(psum.device)


def m_grouped_masked_reference(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                               masked_m: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The first masked_m[g] rows of A[g] times B[g]; the remaining rows are zero."""
    groups, max_m, _ = a.shape
    out = torch.zeros((groups, max_m, b.shape[1]), dtype=compute_dtype, device=a.device)
    for group, count in enumerate(masked_m.tolist()):
        count = max(0, min(int(count), max_m))
        if count:
            out[group, :count] = fp8_gemm_nt_reference(a[group, :count], sfa[group, :count], b[group], sfb[group],
                                                       compute_dtype)
    return out
