"""Reference math: dequantize, then multiply in float32 (or float64 for tests).

This is the path CPU tensors and non-Hopper GPUs take, and the yardstick of the GPU tests. The
quantizers here produce bit-identical results to the GPU kernels (same scale rule, IEEE division,
round-to-nearest-even into e4m3).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from deepgemm.utils import ceil_div

E4M3_MAX = 448.0
FLOAT32_MIN = torch.finfo(torch.float32).tiny


def fp8_scale(amax: torch.Tensor) -> torch.Tensor:
    """max(amax / 448, FLT_MIN): all-zero groups get a tiny positive scale, never 0, NaN or Inf. The divisor is a
    tensor on amax's device: torch divides a CUDA tensor by a Python scalar as a product with its reciprocal, which
    differs from the kernels' IEEE division in the last bit of some scales."""
    return torch.clamp(amax / amax.new_full((), E4M3_MAX), min=FLOAT32_MIN)


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


def silu_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """x [M, 2K] = [gate | up] -> silu(gate) * up [M, K] in float32, the kernel's formula g / (1 + e^-g) * u (its
    exp may differ from torch's in the last bit, so the quantized results agree to within an e4m3 rounding step)."""
    gate, up = x.float().chunk(2, dim=1)
    return gate / (1.0 + torch.exp(-gate)) * up


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


# Rows of one aligned segment of the contiguous layout (get_m_alignment_for_contiguous_layout()).
CONTIGUOUS_SEGMENT_ROWS = 128


def contiguous_row_experts(m_indices: torch.Tensor, num_groups: int,
                           lookup_rows: int = CONTIGUOUS_SEGMENT_ROWS) -> torch.Tensor:
    """The expert each row of the contiguous layout is computed with, as the kernel reads `m_indices`; -1 where the
    row is written as zeros. int32, on m_indices' device, no host synchronisation.

    The kernel looks up one expert per chunk of `lookup_rows` rows (128 with block_m 128 or 256, 64 with block_m 64):
    the index at the chunk's first row. Row r is computed with that expert when both it and m_indices[r] are in
    [0, num_groups); otherwise row r is zero (-1, any other out-of-range value: padding). In a well-formed layout
    (each 128-row segment one expert's rows followed by -1) this is m_indices itself, for either lookup size.
    """
    rows = torch.arange(m_indices.numel(), device=m_indices.device)
    first = m_indices[rows // lookup_rows * lookup_rows]
    valid = (m_indices >= 0) & (m_indices < num_groups) & (first >= 0) & (first < num_groups)
    return torch.where(valid, first, torch.full_like(first, -1)).to(torch.int32)


def m_grouped_contiguous_reference(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                                   m_indices: torch.Tensor, compute_dtype: torch.dtype = torch.float32, *,
                                   lookup_rows: int = CONTIGUOUS_SEGMENT_ROWS) -> torch.Tensor:
    """Each row times B of the expert the kernel computes it with (contiguous_row_experts: for a well-formed layout
    m_indices[r]); rows it writes as zeros (padding, -1, out-of-range indices) are zero."""
    return _rows_by_expert(a.shape[0], b.shape[:2], m_indices, lookup_rows, compute_dtype, a.device,
                           lambda rows, g: fp8_gemm_nt_reference(a[rows], sfa[rows], b[g], sfb[g], compute_dtype))


def m_grouped_bf16_contiguous_reference(a: torch.Tensor, b: torch.Tensor, m_indices: torch.Tensor,
                                        compute_dtype: torch.dtype = torch.float32, *,
                                        lookup_rows: int = CONTIGUOUS_SEGMENT_ROWS) -> torch.Tensor:
    """m_grouped_contiguous_reference for BF16 operands (A [M_total, K], B [G, N, K])."""
    return _rows_by_expert(a.shape[0], b.shape[:2], m_indices, lookup_rows, compute_dtype, a.device,
                           lambda rows, g: a[rows].to(compute_dtype) @ b[g].to(compute_dtype).t())


def _rows_by_expert(rows_total: int, groups_n: torch.Size, m_indices: torch.Tensor, lookup_rows: int,
                    compute_dtype: torch.dtype, device: torch.device,
                    product: Callable[[torch.Tensor, int], torch.Tensor]) -> torch.Tensor:
    """[rows_total, N] with the rows of each expert g set to product(rows, g), zeros elsewhere."""
    groups, n = groups_n
    out = torch.zeros((rows_total, n), dtype=compute_dtype, device=device)
    experts = contiguous_row_experts(m_indices.to(device), groups, lookup_rows)
    for group in range(groups):
        rows = (experts == group).nonzero().flatten()
        if rows.numel():
            out[rows] = product(rows, group)
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


def m_indices_from_psum(psum: torch.Tensor, m_total: int, alignment: int = CONTIGUOUS_SEGMENT_ROWS) -> torch.Tensor:
    """Per-row expert indices of the psum form, as the kernel reads `psum` (int32 [m_total] on psum's device, -1
    where a row is written as zeros; no host synchronisation).

    With ends e[g] = psum[g] clamped to [0, m_total], row r belongs to the first expert g with e[g] > r, provided
    r >= align_up(max(e[0], ..., e[g - 1]), alignment) (0 for g = 0); otherwise (no such expert, or r inside the
    alignment gap) it is padding. For a non-decreasing psum: expert g owns rows [align_up(psum[g - 1]), psum[g]).
    A decreasing psum never moves a start backwards, and an expert whose end falls at or before an earlier one gets
    no rows. The kernel's forward-only cursor (ContiguousPsumTileScheduler) computes the same, for every block_m.
    """
    groups = psum.numel()
    rows = torch.arange(m_total, device=psum.device)
    if groups == 0:
        return torch.full((m_total,), -1, dtype=torch.int32, device=psum.device)
    reach = torch.cummax(psum.to(torch.int64).clamp(0, m_total), dim=0).values  # max(e[0..g])
    group = torch.searchsorted(reach, rows, right=True)  # the first g with e[g] > r (= the first with reach > r)
    before = torch.where(group > 0, reach[(group - 1).clamp(0, groups - 1)], torch.zeros_like(rows))
    start = (before + alignment - 1) // alignment * alignment
    valid = (group < groups) & (rows >= start)
    return torch.where(valid, group, torch.full_like(group, -1)).to(torch.int32)


def m_grouped_masked_reference(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                               masked_m: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The first masked_m[g] rows of A[g] times B[g], masked_m[g] clamped to [0, max_m] as the kernel clamps it (a
    negative count: no rows; past max_m: all of them); the remaining rows are zero."""
    return _masked_rows(a.shape[:2], b.shape[1], masked_m, compute_dtype, a.device,
                        lambda g, rows: fp8_gemm_nt_reference(a[g, :rows], sfa[g, :rows], b[g], sfb[g], compute_dtype))


def m_grouped_bf16_masked_reference(a: torch.Tensor, b: torch.Tensor, masked_m: torch.Tensor,
                                    compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """m_grouped_masked_reference for BF16 operands (A [G, max_m, K], B [G, N, K])."""
    return _masked_rows(a.shape[:2], b.shape[1], masked_m, compute_dtype, a.device,
                        lambda g, rows: a[g, :rows].to(compute_dtype) @ b[g].to(compute_dtype).t())


def _masked_rows(groups_max_m: torch.Size, n: int, masked_m: torch.Tensor, compute_dtype: torch.dtype,
                 device: torch.device, product: Callable[[int, int], torch.Tensor]) -> torch.Tensor:
    groups, max_m = groups_max_m
    out = torch.zeros((groups, max_m, n), dtype=compute_dtype, device=device)
    for group, count in enumerate(masked_m.tolist()):
        count = max(0, min(int(count), max_m))
        if count:
            out[group, :count] = product(group, count)
    return out


def k_grouped_bf16_reference(a: torch.Tensor, b: torch.Tensor, ks: list[int], c: torch.Tensor | None,
                             compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """out[g] = c[g] + A[seg g]^T @ B[seg g] with token-major A [K_total, M] and B [K_total, N]."""
    out = torch.zeros((len(ks), a.shape[1], b.shape[1]), dtype=compute_dtype, device=a.device)
    if c is not None:
        out += c.to(compute_dtype)
    begin = 0
    for group, k in enumerate(ks):
        if k:
            out[group] += a[begin:begin + k].to(compute_dtype).t() @ b[begin:begin + k].to(compute_dtype)
        begin += k
    return out


def bf16_gemm_reference(a: torch.Tensor, b: torch.Tensor, layout: str, c: torch.Tensor | None = None,
                        compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """D = C + A @ B^T of the BF16 GEMMs in `layout` ("nt", "nn", "tn", "tt"), in `compute_dtype`: A is given as
    [M, K] (first letter n) or [K, M] (t), B as [N, K] (second letter t) or [K, N] (n)."""
    x = a.to(compute_dtype) if layout[0] == "n" else a.to(compute_dtype).t()
    w = b.to(compute_dtype) if layout[1] == "t" else b.to(compute_dtype).t()
    d = x @ w.t()
    return d if c is None else d + c.to(compute_dtype)


def causal_keep(sq: int, n: int, device: torch.device) -> torch.Tensor:
    """[sq, n] bool: query i sees key j where j <= i + n - sq (the causal mask aligned to the bottom-right corner)."""
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(n, device=device).unsqueeze(0)
    return j <= i + (n - sq)


def softmax_reference(x: torch.Tensor, scale: float = 1.0, causal: bool = False,
                      compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """softmax(scale * x) over the last dimension in `compute_dtype`, rounded to x's dtype; causal: x viewed as
    [..., sq, n], masked columns (see causal_keep) give 0 and a row with every column masked is all zeros."""
    s = x.to(compute_dtype) * scale
    if not causal:
        return torch.softmax(s, dim=-1).to(x.dtype)
    keep = causal_keep(x.shape[-2], x.shape[-1], x.device)
    y = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1)
    return y.masked_fill(~keep.any(dim=-1, keepdim=True), 0.0).to(x.dtype)


def softmax_backward_reference(y: torch.Tensor, dy: torch.Tensor, scale: float = 1.0,
                               compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """dx = scale * y * (dy - sum(dy * y)) over the last dimension in `compute_dtype`, rounded to y's dtype."""
    y_, dy_ = y.to(compute_dtype), dy.to(compute_dtype)
    return (scale * y_ * (dy_ - (dy_ * y_).sum(dim=-1, keepdim=True))).to(y.dtype)


def rope_reference(x: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor, interleaved: bool = False,
                   inverse: bool = False, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x [tokens, heads, head_dim] rotated by the cos / sin rows of `cache` [P, R] at `positions` (see
    deepgemm.rope); features R.. pass through; a position outside [0, P) makes its rotated features NaN."""
    rotary = cache.shape[1]
    half = rotary // 2
    valid = (positions >= 0) & (positions < cache.shape[0])
    rows = cache[torch.where(valid, positions, 0).long()].to(compute_dtype)
    rows[~valid] = float("nan")
    cos, sin = rows[:, None, :half], rows[:, None, half:]
    if inverse:
        sin = -sin
    out = x.clone()
    r = x[..., :rotary].to(compute_dtype)
    if interleaved:
        x1, x2 = r[..., 0::2], r[..., 1::2]
    else:
        x1, x2 = r[..., :half], r[..., half:]
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    rotated = torch.stack((o1, o2), dim=-1).flatten(-2) if interleaved else torch.cat((o1, o2), dim=-1)
    out[..., :rotary] = rotated.to(x.dtype)
    return out
