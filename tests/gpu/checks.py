"""Inputs and float64 checks shared by the random-shape, misaligned and threaded GPU tests (and nothing else: the
older modules keep their own copies). Every check compares with deepgemm.reference in float64 through
tests.helpers.assert_close_to_reference; outputs are NaN-poisoned by the callers before the launch."""

from __future__ import annotations

import torch

import deepgemm
from deepgemm.reference import (
    dequantize_per_token_group,
    m_grouped_contiguous_reference,
    m_grouped_masked_reference,
)
from tests.helpers import assert_close_to_reference, random_activations, random_grouped_weights

FP8 = torch.float8_e4m3fn
ALIGN = 128  # rows each expert's segment is padded to in the contiguous layout
MASKED_BLOCK = 64  # rows of a masked output block: blocks entirely past masked_m[g] stay untouched


def max_diff_for(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 1e-3


def nan_like_out(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device = "cuda") -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def padded_rows(count: int) -> int:
    return -(-count // ALIGN) * ALIGN


# ---------------------------------------------------------------- contiguous (m_indices and psum forms)


def contiguous_layout(counts: list[int] | tuple[int, ...], extra_padding_segments: int = 0) -> torch.Tensor:
    """int32 m_indices on the CPU: expert g's `counts[g]` rows, each segment padded to 128 rows with -1, then
    `extra_padding_segments` segments of padding only."""
    indices: list[int] = []
    for group, count in enumerate(counts):
        indices += [group] * count + [-1] * (padded_rows(count) - count)
    indices += [-1] * (ALIGN * extra_padding_segments)
    return torch.tensor(indices, dtype=torch.int32)


def psum_of(counts: list[int] | tuple[int, ...]) -> torch.Tensor:
    """int32 cumulative valid-row ends of the same layout (what the psum form takes), on the CPU."""
    ends, start = [], 0
    for count in counts:
        ends.append(start + count)
        start += padded_rows(count)
    return torch.tensor(ends, dtype=torch.int32)


def poison_padding(a: tuple[torch.Tensor, torch.Tensor], m_indices: torch.Tensor) -> None:
    """Padding rows of A hold FP8 NaNs (0x7F) and NaN scales: none may reach a valid output row."""
    pad = (m_indices < 0).to(a[0].device)
    a[0].view(torch.uint8)[pad] = 0x7F
    a[1][pad] = float("nan")


def check_contiguous(out: torch.Tensor, a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor],
                     m_indices: torch.Tensor, max_diff: float) -> None:
    """Padding rows exactly zero; every expert's rows against float64 (padding rows of A zeroed for the reference,
    so a reference that computes whole blocks cannot pick up their NaNs)."""
    device = out.device
    indices = m_indices.to(device)
    valid = indices >= 0
    assert (out[~valid] == 0).all(), "padding rows (m_indices < 0, or past psum) must be written as zeros"
    a_clean = (a[0].clone(), a[1].clone())
    a_clean[0].view(torch.uint8)[~valid] = 0
    a_clean[1][~valid] = 0
    ref = m_grouped_contiguous_reference(a_clean[0], a_clean[1], b[0], b[1], indices, torch.float64)
    ref_abs = m_grouped_contiguous_reference(a_clean[0].float().abs(), a_clean[1].abs(), b[0].float().abs(),
                                             b[1].abs(), indices, torch.float64)
    for group in range(b[0].shape[0]):
        rows = indices == group
        if rows.any():
            try:
                assert_close_to_reference(out[rows], ref[rows], ref_abs[rows], max_diff)
            except AssertionError as error:
                raise AssertionError(f"expert {group}: {error}") from None


# ---------------------------------------------------------------- masked


def masked_operands(groups: int, max_m: int, n: int, k: int, seed: int, device: str | torch.device = "cuda"):
    """A [G, max_m, K] (scales: a view of one M-major [G * max_m, K/128] tensor, read in place) and B [G, N, K]."""
    a2d = random_activations(groups * max_m, k, device, seed)
    a = (a2d[0].view(groups, max_m, k), a2d[1].reshape(groups, max_m, -1))
    return a, random_grouped_weights(groups, n, k, device, seed + 1)


def check_masked(out: torch.Tensor, a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor],
                 counts: list[int] | tuple[int, ...], max_diff: float) -> None:
    """The first counts[g] rows of each group against float64; rows in 64-row blocks past them still NaN."""
    masked_m = torch.tensor(list(counts), dtype=torch.int32)
    ref = m_grouped_masked_reference(a[0], a[1], b[0], b[1], masked_m, torch.float64)
    ref_abs = m_grouped_masked_reference(a[0].float().abs(), a[1].abs(), b[0].float().abs(), b[1].abs(), masked_m,
                                         torch.float64)
    for group, count in enumerate(counts):
        if count:
            try:
                assert_close_to_reference(out[group, :count], ref[group, :count], ref_abs[group, :count], max_diff)
            except AssertionError as error:
                raise AssertionError(f"group {group} ({count} rows): {error}") from None
        untouched_from = -(-count // MASKED_BLOCK) * MASKED_BLOCK
        assert out[group, untouched_from:].isnan().all(), \
            f"group {group}: rows in blocks past masked_m={count} must stay untouched"


# ---------------------------------------------------------------- k-grouped


def kgrouped_references(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor], ks: list[int],
                        c: torch.Tensor | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    a64 = dequantize_per_token_group(a[0], a[1], 128, torch.float64)
    b64 = dequantize_per_token_group(b[0], b[1], 128, torch.float64)
    refs, abs_refs, begin = [], [], 0
    for group, k in enumerate(ks):
        seg = slice(begin, begin + k)
        ref = a64[:, seg] @ b64[:, seg].t()
        ref_abs = a64[:, seg].abs() @ b64[:, seg].abs().t()
        if c is not None:
            ref = ref + c[group].double()
            ref_abs = ref_abs + c[group].double().abs()
        refs.append(ref)
        abs_refs.append(ref_abs)
        begin += k
    return refs, abs_refs


def check_kgrouped(out: torch.Tensor, a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor],
                   ks: list[int], c: torch.Tensor | None) -> None:
    """out[g] against float64 (C added); a group with no tokens is exactly C (or zeros)."""
    refs, abs_refs = kgrouped_references(a, b, ks, c)
    for group, k in enumerate(ks):
        if k == 0:
            expected = c[group] if c is not None else torch.zeros_like(out[group])
            assert torch.equal(out[group], expected), f"group {group} has no tokens: out must be C (or zero)"
        else:
            try:
                assert_close_to_reference(out[group], refs[group], abs_refs[group], max_diff=1e-5)
            except AssertionError as error:
                raise AssertionError(f"group {group} ({k} tokens): {error}") from None


# ---------------------------------------------------------------- operands drawn on the GPU


def cuda_operands(m: int, n: int, k: int, generator: torch.Generator):
    """Like tests.helpers.random_operands, drawn on the current CUDA stream from `generator` (no host work)."""
    x = torch.randn(m, k, device="cuda", generator=generator)
    x = x * torch.exp(torch.randn(m, 1, device="cuda", generator=generator))
    w = torch.randn(n, k, device="cuda", generator=generator)
    w = w * torch.exp(0.5 * torch.randn(n, 1, device="cuda", generator=generator))
    return deepgemm.quantize_per_token_group(x.bfloat16()), deepgemm.quantize_per_block(w.bfloat16())


def cuda_activations(rows: int, k: int, generator: torch.Generator):
    x = torch.randn(rows, k, device="cuda", generator=generator)
    x = x * torch.exp(torch.randn(rows, 1, device="cuda", generator=generator))
    return deepgemm.quantize_per_token_group(x.bfloat16())


def cuda_grouped_weights(groups: int, n: int, k: int, generator: torch.Generator):
    w = torch.randn(groups, n, k, device="cuda", generator=generator)
    w = w * torch.exp(0.5 * torch.randn(groups, n, 1, device="cuda", generator=generator))
    parts = [deepgemm.quantize_per_block(w[g].bfloat16()) for g in range(groups)]
    return torch.stack([q for q, _ in parts]), torch.stack([s for _, s in parts])
