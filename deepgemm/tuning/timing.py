"""GPU timing: CUDA-graph replay between CUDA events, with the L2 cache flushed before every sample."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

import numpy as np

FLUSH_BYTES = 256 * 1024 * 1024  # several times the 50-60 MB L2 of an H100/H200

# How the L2 is flushed before each sample: "zero" writes the buffer (the stored tables' method and DeepGEMM's; the
# ~50 MB of dirty lines it leaves are written back during the timed kernel), "read" reads it (clean lines, as a
# model's earlier weight reads leave them; decode GEMMs then take 9-15% less time on an H200).
FlushMode = Literal["zero", "read"]
FLUSH_MODES: tuple[FlushMode, ...] = ("zero", "read")

# Without a flush, a spin of this many SM cycles (~100 us, no memory traffic: L2 stays as the last sample left it)
# runs ahead of each start event, so the host has queued the replay before the GPU reaches it. Otherwise a sample of a
# short kernel measures the host's launch gap (an empty kernel read 9.6 us unflushed against 4.0 flushed on an H100).
HOLD_CYCLES = 200_000


@dataclass(frozen=True)
class Timing:
    """Per-call times in microseconds over ``len(samples_us)`` samples."""

    median_us: float
    min_us: float
    p10_us: float
    p90_us: float
    samples_us: tuple[float, ...]
    graph: bool = True  # replayed from a CUDA graph (False: launched eagerly)

    @classmethod
    def from_samples(cls, samples_us: Sequence[float], *, graph: bool = True) -> Timing:
        if not samples_us:
            raise ValueError("no timing samples")
        values = np.asarray(samples_us, dtype=np.float64)
        p10, median, p90 = np.percentile(values, [10, 50, 90])
        return cls(float(median), float(values.min()), float(p10), float(p90), tuple(float(v) for v in values), graph)

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative width of the middle 80 % of samples."""
        return (self.p90_us - self.p10_us) / self.median_us if self.median_us else 0.0


def bench_gpu(fn: Callable[[], Any], *, iters: int = 30, warmup: int = 5, flush_l2: bool = True,
              use_graph: bool = True, flush_mode: FlushMode = "zero") -> Timing:
    """Time ``fn`` on the current CUDA device.

    ``warmup`` eager calls first (they also trigger any JIT compilation), then ``fn`` is captured in a
    CUDA graph (if that fails, e.g. for an op that cannot be captured, it is launched eagerly and
    ``Timing.graph`` is False). Each of the ``iters`` samples flushes L2 through a 256 MiB buffer (``flush_mode``:
    zeroing it, or reading it), then records a start event, replays, and records an end event; ``flush_l2=False``
    runs none, and holds the GPU in a memory-free spin (HOLD_CYCLES) before each start event instead.
    """
    return bench_gpu_interleaved([fn], iters=iters, warmup=warmup, flush_l2=flush_l2, use_graph=use_graph,
                                 flush_mode=flush_mode)[0]


def bench_gpu_interleaved(fns: Sequence[Callable[[], Any]], *, iters: int = 30, warmup: int = 5, flush_l2: bool = True,
                          use_graph: bool = True, flush_mode: FlushMode = "zero") -> list[Timing]:
    """Time several functions in rounds: each round takes one sample of every function (L2 flushed before
    each, as in ``bench_gpu``), starting with a different one each round.

    Under a power cap the SM clock depends on what ran just before, so timing implementations one after
    another favours whichever follows the lighter one; interleaved, they share the same conditions.
    """
    import torch

    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    flush = l2_flush(flush_mode) if flush_l2 else None  # (an unknown mode is refused before any warm-up call)
    launches: list[Callable[[], Any]] = []
    graphs = []
    for fn in fns:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        graph = _capture(fn) if use_graph else None
        graphs.append(graph)
        launches.append(graph.replay if graph is not None else fn)
        launches[-1]()
    count = len(launches)
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
              for _ in range(count)]
    for sample in range(iters):
        for offset in range(count):
            which = (sample + offset) % count
            start, end = events[which][sample]
            if flush is not None:
                flush()
            else:
                torch.cuda._sleep(HOLD_CYCLES)  # the GPU busy while the host queues the sample (HOLD_CYCLES)
            start.record()
            launches[which]()
            end.record()
    torch.cuda.synchronize()
    return [Timing.from_samples([start.elapsed_time(end) * 1e3 for start, end in events[i]], graph=graphs[i] is not None)
            for i in range(count)]


def _capture(fn: Callable[[], Any]) -> Any | None:
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # libraries set up workspaces on first use in a stream
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception:  # noqa: BLE001 - any capture failure falls back to eager launches
        torch.cuda.synchronize()
        return None
    return graph


def l2_flush(mode: FlushMode) -> Callable[[], Any]:
    """The flush of `mode` (FLUSH_MODES) on the current CUDA device."""
    import torch

    if mode not in FLUSH_MODES:
        raise ValueError(f"flush mode must be one of {', '.join(FLUSH_MODES)}, got {mode!r}")
    buffer = _flush_buffer(torch.cuda.current_device())
    return buffer.zero_ if mode == "zero" else buffer.max  # (max: one pass over the buffer, its result dropped)


@cache
def _flush_buffer(device: int) -> Any:
    import torch

    return torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device)
