"""The values of the grouped GEMMs' grouping tensors (m_indices, psum, masked_m) against the layouts' rules.

The GEMMs never read these values on the host (the kernels read them on the GPU, so calls stay capturable and
free of synchronisation), and they define what the kernel does with any value (see their docstrings). What breaks
a rule is then not an error but a silently different result. `check_grouped_layout` is the check users call
explicitly, once per batch (it copies the tensor to the host: one synchronisation), or through a grouped GEMM's
`validate=True`. It raises deepgemm.GroupedLayoutError (a ValueError) naming the tensor, the first offending
entry and the rule. A layout that passes gives the same output on every tile configuration and on the CPU.
"""

from __future__ import annotations

import torch

from deepgemm.api.validation import require_tensor
from deepgemm.errors import GraphCaptureError, GroupedLayoutError
from deepgemm.jit.runtime import stream_capturing
from deepgemm.reference import CONTIGUOUS_SEGMENT_ROWS
from deepgemm.utils import align_up

SEGMENT = CONTIGUOUS_SEGMENT_ROWS  # rows each expert's segment is padded to (contiguous forms)
HALF = SEGMENT // 2  # rows of a block_m 64 tile: the kernel's finest lookup of m_indices
_WHERE = "check_grouped_layout"


def check_grouped_layout(*, num_groups: int, m_indices: torch.Tensor | None = None, psum: torch.Tensor | None = None,
                         m_total: int | None = None, masked_m: torch.Tensor | None = None,
                         max_m: int | None = None) -> None:
    """Check the values of one grouping tensor against its layout's rules (pass exactly one of m_indices, psum and
    masked_m); raise deepgemm.GroupedLayoutError naming the tensor, its first offending entry and the rule.

    The grouped GEMMs never read these values on the host, and compute something defined for any value (their
    docstrings say what), so a broken rule is no error there but a silently different result. This check reads the
    tensor on the host (a device synchronisation): call it once per batch while debugging or on untrusted routing,
    not per launch, or pass validate=True to the GEMM. A layout that passes computes the same output with every
    tile configuration and on the CPU reference path.

    Args:
        num_groups: G, the experts in B ([G, N, K]).
        m_indices: for m_grouped_fp8_gemm_nt_contiguous, int32 [M_total]: M_total a multiple of 128; every entry
            an expert in [0, G) or -1; each 128-row segment holds rows of one expert, padding rows anywhere except
            first in the segment (unless all of it is padding) or first in its second 64-row half when rows of the
            expert follow (block_m 64 tiles look the expert up there).
        psum: for m_grouped_fp8_gemm_nt_contiguous_psum, int32 [G]: 0 <= psum[0], non-decreasing, psum[G - 1] <=
            m_total; each psum[g] is psum[g - 1] or at least align_up(psum[g - 1], 128) (psum holds end rows in
            the padded layout: a cumulative token count fails as soon as a count is not a multiple of 128).
        m_total: the rows of A; needed with psum; with m_indices, if given, it must be len(m_indices).
        masked_m: for m_grouped_fp8_gemm_nt_masked, int32 [G], each count in [0, max_m].
        max_m: the rows per expert of A; needed with masked_m.

    Raises:
        deepgemm.GroupedLayoutError: a value breaks its layout's rule (a ValueError; `argument` and `index` name
            the tensor and the entry).
        TypeError: not exactly one grouping tensor, one that is not an int32 tensor, or a missing m_total / max_m.
        ValueError: a grouping tensor that is not 1-D or has the wrong length; a negative count argument.
        deepgemm.GraphCaptureError: the tensor's device is capturing a CUDA graph (no synchronisation possible).

    Example::

        deepgemm.check_grouped_layout(num_groups=b[0].shape[0], m_indices=m_indices)
        deepgemm.check_grouped_layout(num_groups=len(psum), psum=psum, m_total=a[0].shape[0])
        deepgemm.check_grouped_layout(num_groups=len(masked_m), masked_m=masked_m, max_m=a[0].shape[1])
    """
    check_layout_values(_WHERE, num_groups=num_groups, m_indices=m_indices, psum=psum, m_total=m_total,
                        masked_m=masked_m, max_m=max_m)


def check_layout_values(where: str, *, num_groups: int, m_indices: torch.Tensor | None = None,
                        psum: torch.Tensor | None = None, m_total: int | None = None,
                        masked_m: torch.Tensor | None = None, max_m: int | None = None) -> None:
    """check_grouped_layout with the caller's name in the messages (the GEMMs' validate=True)."""
    given = [name for name, value in (("m_indices", m_indices), ("psum", psum), ("masked_m", masked_m))
             if value is not None]
    if len(given) != 1:
        raise TypeError(f"{where}: pass exactly one of 'm_indices', 'psum' or 'masked_m', got "
                        f"{', '.join(repr(name) for name in given) or 'none'}")
    groups = _count(num_groups, "num_groups", where)
    if m_indices is not None:
        _unused(where, "m_indices", max_m=max_m)
        values = _host_values(m_indices, "m_indices", where)
        if m_total is not None and _count(m_total, "m_total", where) != values.numel():
            raise ValueError(f"{where}: 'm_total' is {m_total} but 'm_indices' has {values.numel()} rows")
        _check_m_indices(values, groups, where)
    elif psum is not None:
        _unused(where, "psum", max_m=max_m)
        if m_total is None:
            raise TypeError(f"{where}: 'psum' needs 'm_total' (the rows of A) to check its ends against")
        _check_psum(_host_values(psum, "psum", where, groups), groups, _count(m_total, "m_total", where), where)
    else:
        assert masked_m is not None
        _unused(where, "masked_m", m_total=m_total)
        if max_m is None:
            raise TypeError(f"{where}: 'masked_m' needs 'max_m' (the rows per expert of A) to check its counts against")
        _check_masked_m(_host_values(masked_m, "masked_m", where, groups), _count(max_m, "max_m", where), where)


def _count(value: object, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: '{name}' must be a non-negative int, got {value!r}")
    return value


def _unused(where: str, form: str, **extra: int | None) -> None:
    for name, value in extra.items():
        if value is not None:
            raise TypeError(f"{where}: '{name}' does not apply to '{form}'")


def _host_values(tensor: object, name: str, where: str, length: int | None = None) -> torch.Tensor:
    """The int32 vector's values as int64 on the host (one copy; refused under graph capture on its device)."""
    t = require_tensor(tensor, name, where)
    if t.dtype != torch.int32:
        raise TypeError(f"{where}: '{name}' must have dtype torch.int32, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{where}: '{name}' must be 1-D, got shape {tuple(t.shape)}")
    if length is not None and t.numel() != length:
        raise ValueError(f"{where}: '{name}' must have one entry per expert ({length}), got {t.numel()}")
    if t.is_meta:
        raise ValueError(f"{where}: '{name}' is on the meta device, which holds no values to check")
    if t.is_cuda and stream_capturing(t.device.index if t.device.index is not None else torch.cuda.current_device()):
        raise GraphCaptureError(f"{where}: reading '{name}' on the host needs a synchronisation, which a CUDA graph "
                                "being captured cannot hold; check the layout before capturing (or outside the graph)")
    return t.detach().to("cpu", torch.int64)


def _first(mask: torch.Tensor) -> int | None:
    """The first True position of a flattened mask, or None."""
    hits = mask.reshape(-1).nonzero()
    return int(hits[0]) if hits.numel() else None


def _rows(segment: int) -> str:
    return f"rows {segment * SEGMENT}-{segment * SEGMENT + SEGMENT - 1}"


def _check_m_indices(values: torch.Tensor, groups: int, where: str) -> None:
    rows = values.numel()
    if rows % SEGMENT:
        raise GroupedLayoutError(f"{where}: 'm_indices' has {rows} rows; every expert's segment is padded to "
                                 f"{SEGMENT} rows, so its length (M_total) must be a multiple of {SEGMENT}",
                                 "m_indices")
    row = _first((values < -1) | (values >= groups))
    if row is not None:
        raise GroupedLayoutError(
            f"{where}: 'm_indices'[{row}] = {int(values[row])}: an entry must be an expert in [0, {groups}) or -1 "
            f"(padding); the kernel writes a row with any other value as zeros", "m_indices", row)
    segments = values.view(-1, SEGMENT)
    first = segments[:, :1]
    valid = segments >= 0
    row = _first(valid & (segments != first))
    if row is not None:
        segment, expert, head = row // SEGMENT, int(values[row]), int(values[row // SEGMENT * SEGMENT])
        if head < 0:
            raise GroupedLayoutError(
                f"{where}: 'm_indices'[{row}] = {expert} but its 128-row segment ({_rows(segment)}) starts with -1: "
                "the kernel reads a segment's expert at its first row, so it would write the whole segment as "
                "zeros; put each expert's rows first in its segment, then the padding", "m_indices", row)
        raise GroupedLayoutError(
            f"{where}: 'm_indices'[{row}] = {expert} but its 128-row segment ({_rows(segment)}) starts with expert "
            f"{head}: one segment holds one expert (the kernel would compute row {row} with expert {head}); pad each "
            f"expert's rows to a multiple of {SEGMENT}", "m_indices", row)
    # A -1 at the start of a segment's second half with rows of the expert after it: block_m 64 tiles take that
    # half as padding (zeros), block_m 128 / 256 tiles compute those rows, so the output would depend on the tile.
    halves = segments[:, HALF:]
    gap = _first((halves[:, 0] < 0) & (halves[:, 1:] >= 0).any(dim=1))
    if gap is not None:
        segment, row = gap, gap * SEGMENT + HALF
        raise GroupedLayoutError(
            f"{where}: 'm_indices'[{row}] = -1 starts the second 64-row half of its segment ({_rows(segment)}) but "
            "later rows of that half hold its expert: the kernel's 64-row tiles look the expert up at a half's "
            "first row and would write the half as zeros, 128-row tiles would compute them; put padding after the "
            "expert's rows", "m_indices", row)


def _check_psum(values: torch.Tensor, groups: int, m_total: int, where: str) -> None:
    if groups == 0:
        return
    expert = _first(values < 0)
    if expert is not None:
        raise GroupedLayoutError(
            f"{where}: 'psum'[{expert}] = {int(values[expert])} is negative; psum holds each expert's end row "
            f"(exclusive) in [0, M_total = {m_total}] (the kernel clamps it to 0: no rows)", "psum", expert)
    expert = _first(values > m_total)
    if expert is not None:
        raise GroupedLayoutError(
            f"{where}: 'psum'[{expert}] = {int(values[expert])} is past M_total = {m_total} (the rows of A); the "
            f"kernel would clip it to {m_total}", "psum", expert)
    previous, current = values[:-1], values[1:]
    expert = _first(current < previous)
    if expert is not None:
        g = expert + 1
        raise GroupedLayoutError(
            f"{where}: 'psum' decreases at expert {g} (psum[{g - 1}] = {int(values[g - 1])}, psum[{g}] = "
            f"{int(values[g])}); psum must not decrease (the kernel never moves a start back: expert {g} would get "
            "no rows and the next expert would start after the largest end so far)", "psum", g)
    starts = (previous + SEGMENT - 1) // SEGMENT * SEGMENT
    expert = _first((current > previous) & (current < starts))
    if expert is not None:
        g = expert + 1
        start = align_up(int(values[g - 1]), SEGMENT)
        raise GroupedLayoutError(
            f"{where}: 'psum'[{g}] = {int(values[g])} ends inside expert {g - 1}'s alignment padding: expert {g} "
            f"starts at row {start} (psum[{g - 1}] = {int(values[g - 1])} rounded up to {SEGMENT}), so it would get "
            f"no rows; psum[g] is the end row of expert g in the padded layout (its start plus its count), not a "
            f"cumulative token count; an expert without rows has psum[g] = psum[g - 1] (or its start)", "psum", g)


def _check_masked_m(values: torch.Tensor, max_m: int, where: str) -> None:
    expert = _first(values < 0)
    if expert is not None:
        raise GroupedLayoutError(
            f"{where}: 'masked_m'[{expert}] = {int(values[expert])} is negative; each count must be in [0, max_m = "
            f"{max_m}] (the kernel reads a negative count as 0: no rows)", "masked_m", expert)
    expert = _first(values > max_m)
    if expert is not None:
        raise GroupedLayoutError(
            f"{where}: 'masked_m'[{expert}] = {int(values[expert])} is past max_m = {max_m} (the rows per expert "
            f"of A); each count must be in [0, {max_m}] (the kernel would clamp it to {max_m})", "masked_m", expert)
