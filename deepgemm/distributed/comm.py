"""The collectives the parallel layers issue, and the chunking that pipelines them with the GEMM.

Every collective is torch.distributed's own (NCCL on GPUs, gloo on CPUs), issued with `async_op=True`. On NCCL
each one runs on the process group's internal communication stream, ordered after the work already queued on the
issuing (compute) stream by an event, and `Work.wait()` makes the compute stream wait for it with another event:
that is the second stream and the events of the pipeline, with no transport or cross-GPU flag of ours. On gloo the
same calls run on gloo's worker threads; the chunking, the order and the results are the same.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist

# torch >= 2.13 names these *_single (the *_tensor names still work there, with a deprecation warning).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def chunk_bounds(rows: int, chunks: int) -> list[tuple[int, int]]:
    """(offset, size) of `min(chunks, rows)` consecutive, near-equal pieces of `rows` rows (the first `rows %
    pieces` one row longer); none for zero rows. The sizes need no alignment: the GEMM takes any M.

    Args:
        rows: the rows to split (an int; none or fewer give no pieces).
        chunks: the pieces wanted (the parallel layers' `chunks`).

    Raises:
        Nothing for ints (the layers validate `chunks` when they are built).

    Example::

        from deepgemm.distributed import chunk_bounds

        chunk_bounds(10, 3)      # [(0, 4), (4, 3), (7, 3)]
    """
    pieces = min(chunks, rows)
    if pieces <= 0:
        return []
    base, extra = divmod(rows, pieces)
    bounds, offset = [], 0
    for i in range(pieces):
        size = base + (1 if i < extra else 0)
        bounds.append((offset, size))
        offset += size
    return bounds


def _wire(t: torch.Tensor) -> torch.Tensor:
    """A view collectives can carry: FP8 travels as its bytes (gloo, and older NCCL, have no float8 types)."""
    return t.view(torch.uint8) if t.dtype.itemsize == 1 and t.is_floating_point() else t


def gather_rows_async(parts: Sequence[torch.Tensor], group: dist.ProcessGroup, tp_size: int
                      ) -> tuple[list[torch.Tensor], list[dist.Work]]:
    """Start all-gathers of each tensor's rows (dim 0) over `group`: rank r's rows land at [r*m, (r+1)*m).
    Returns the output tensors (valid once every work has been waited for) and the works."""
    outs: list[torch.Tensor] = []
    works: list[dist.Work] = []
    for part in parts:
        part = part.contiguous()
        out = torch.empty((tp_size * part.shape[0], *part.shape[1:]), dtype=part.dtype, device=part.device)
        work = _all_gather_single(_wire(out), _wire(part), group=group, async_op=True)
        assert work is not None
        outs.append(out)
        works.append(work)
    return outs, works


def gathered_chunks(parts: Sequence[torch.Tensor], chunks: int, group: dist.ProcessGroup, tp_size: int
                    ) -> Iterator[tuple[int, int, list[torch.Tensor]]]:
    """The sequence-parallel all-gather, pipelined: `parts` are this rank's rows of the operands (the FP8
    activations and their scales, or the high-precision activations), all with the same row count m. The rows are
    split into `chunks` pieces and every piece's all-gather is started at once (in order, so they run back to back
    on the communication stream); then, piece by piece, this waits for one and yields (offset, size, gathered),
    gathered being [tp_size * size, ...] with rank r's rows [offset, offset + size) at [r*size, (r+1)*size). The
    caller's GEMM on piece c runs while the pieces after it are still being gathered."""
    rows = parts[0].shape[0]
    bounds = chunk_bounds(rows, chunks)
    pending = [gather_rows_async([p[offset:offset + size] for p in parts], group, tp_size) for offset, size in bounds]
    for (offset, size), (outs, works) in zip(bounds, pending):
        for work in works:
            work.wait()
        yield offset, size, outs


def gather_columns(y: torch.Tensor, group: dist.ProcessGroup, tp_size: int) -> torch.Tensor:
    """[M, n] per rank -> [M, tp_size * n], rank r's columns at [r*n, (r+1)*n) (column-parallel gather_output)."""
    (outs,), (work,) = gather_rows_async([y], group, tp_size)
    work.wait()
    m, n = y.shape
    return outs.view(tp_size, m, n).permute(1, 0, 2).reshape(m, tp_size * n)


def all_reduce_async(t: torch.Tensor, group: dist.ProcessGroup) -> dist.Work:
    work = dist.all_reduce(t, group=group, async_op=True)
    assert work is not None
    return work


def reduce_scatter_async(out: torch.Tensor, t: torch.Tensor, group: dist.ProcessGroup) -> dist.Work:
    """Sum `t` [tp_size * m, ...] over the group, this rank keeping rows [rank*m, (rank+1)*m) in `out` [m, ...]."""
    work = _reduce_scatter_single(out, t, group=group, async_op=True)
    assert work is not None
    return work
