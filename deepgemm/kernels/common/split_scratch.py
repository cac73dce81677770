"""Scratch memory of split- and stream-tail launches (FP8 split / stream tails, BF16 split-K): FP32 partial slots
and zeroed arrival counters, the launch arguments that point at them, and the range count that sizes them
(split_tail_ranges, the host mirror of SplitTailTileScheduler).

A split launch needs a slot of FP32 partials per split unit and a counter per (tail tile, math warpgroup).
The kernel leaves every counter it touched at zero (the last arrival, or the waiting head, resets it), so
counters need zeroing once, not per launch:
- eager launches share one workspace and one counter buffer per (device, stream): launches on a stream run
  in order. The buffers grow to the largest plan seen and are then reused, so a warm eager call allocates
  nothing and launches no memset. At most MAX_STREAMS buffer pairs are kept per device (least recently used
  first out: a dropped pair goes back to torch's caching allocator, which reuses it in that stream's order).
- a launch captured in a CUDA graph takes its counters from a per-device arena, zeroed by an eager launch
  before (on a side stream, waited for), a slice no other launch or graph ever uses (a replay of one graph
  never overlaps another replay of it), so the graph needs no memset node (measured ~1.6 us per replay on the
  H200); its workspace comes from the graph's own pool (written before it is read in every launch). Without
  room in the arena (no eager split launch yet on that device, or many captures since), the counters come from
  the pool too, zeroed by a memset the graph replays.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import torch

from deepgemm.jit.args import PackedArgs
from deepgemm.jit.runtime import stream_capturing

MAX_SPLITS = 8  # mirrors SplitTailTileScheduler::kMaxSplits


def split_tail_ranges(tiles: int, grid: int, k_blocks: int) -> int:
    """K ranges per tail tile of a split-tail launch (1: nothing splits); mirrors SplitTailTileScheduler:
    the tiles of a last wave that fills at most half of the grid are cut into min(grid / tail, 8, K blocks)."""
    tail = tiles % grid
    if tail == 0 or 2 * tail > grid:
        return 1
    return min(grid // tail, MAX_SPLITS, k_blocks)

# Counters per arena: 1 MiB, enough for ~650 captured launches of the widest split grid (132 CTAs x 3 warpgroups);
# an eager split launch makes a new one once half of it is handed out.
ARENA_COUNTERS = 1 << 18
MAX_STREAMS = 8  # eager buffer pairs kept per device


def _empty_floats(device_index: int, count: int) -> torch.Tensor:
    return torch.empty(count, dtype=torch.float32, device=torch.device("cuda", device_index))


def _zero_counters(device_index: int, count: int) -> torch.Tensor:
    return torch.zeros(count, dtype=torch.int32, device=torch.device("cuda", device_index))


def _zeroed_arena(device_index: int) -> torch.Tensor:
    """ARENA_COUNTERS zeros, written on a side stream and waited for (only that memset, not the caller's
    stream): any graph, on any stream, may read them afterwards."""
    with torch.cuda.device(device_index):
        side = torch.cuda.Stream(device_index)
        with torch.cuda.stream(side):
            arena = torch.zeros(ARENA_COUNTERS, dtype=torch.int32, device=torch.device("cuda", device_index))
            done = torch.cuda.Event()
            done.record(side)
        done.synchronize()
    return arena


class SplitScratch:
    """Per-(device, stream) workspace and counters for eager launches, and never-reused zeroed counters for
    captured ones."""

    def __init__(self) -> None:
        self._buffers: OrderedDict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._arenas: dict[int, list[torch.Tensor]] = {}  # every arena ever made stays alive (graphs use slices)
        self._arena_used: dict[int, int] = {}  # counters handed out of the device's newest arena
        self._lock = threading.Lock()
        # Bumped whenever an eager pair is made or dropped, or the arena changes: a caller that saw the same
        # generation before and after get() may reuse that pair without calling get() again until it moves.
        self.generation = 0

    def get(self, device_index: int, stream: int, workspace_floats: int, counters: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(workspace, counters) with at least these sizes, for a launch on `stream`, which must be the current
        stream of `device_index` (new buffers are allocated on it): ready in stream order, counters at zero."""
        if stream_capturing(device_index):
            workspace = _empty_floats(device_index, workspace_floats)  # the graph's pool
            slice_ = self._take_captured_counters(device_index, counters)
            if slice_ is None:
                slice_ = _zero_counters(device_index, counters)
            return workspace, slice_
        key = (device_index, stream)
        with self._lock:
            entry = self._buffers.get(key)
            if entry is None or entry[0].numel() < workspace_floats or entry[1].numel() < counters:
                if entry is not None:  # grow to cover both the old and the new need
                    workspace_floats = max(workspace_floats, entry[0].numel())
                    counters = max(counters, entry[1].numel())
                entry = self._buffers[key] = (_empty_floats(device_index, workspace_floats),
                                              _zero_counters(device_index, counters))
                self.generation += 1
                same_device = [k for k in self._buffers if k[0] == device_index]
                for stale in same_device[:-MAX_STREAMS]:  # least recently used first
                    del self._buffers[stale]
            self._buffers.move_to_end(key)
            refill = self._arena_used.get(device_index, ARENA_COUNTERS) > ARENA_COUNTERS // 2
        if refill:
            arena = _zeroed_arena(device_index)  # outside the lock: it waits for the GPU
            with self._lock:
                self._arenas.setdefault(device_index, []).append(arena)
                self._arena_used[device_index] = 0
                self.generation += 1
        return entry

    def _take_captured_counters(self, device_index: int, counters: int) -> torch.Tensor | None:
        with self._lock:
            arenas = self._arenas.get(device_index)
            used = self._arena_used.get(device_index, 0)
            if not arenas or used + counters > ARENA_COUNTERS:
                return None
            self._arena_used[device_index] = used + counters
            self.generation += 1  # the next eager launch checks whether the arena needs a refill
            return arenas[-1][used:used + counters]

    def captured_counters_left(self, device_index: int) -> int:
        """Counters the device's newest arena can still hand to captured launches (tests, diagnostics)."""
        with self._lock:
            return ARENA_COUNTERS - self._arena_used[device_index] if device_index in self._arenas else 0

    def clear(self) -> None:
        """Drop the eager buffers (tests; the caching allocator reuses them in stream order). Arenas stay:
        captured graphs may still use them."""
        with self._lock:
            self._buffers.clear()
            self.generation += 1


split_scratch = SplitScratch()


class SplitLaunchArgs:
    """A split plan's launch arguments with its scratch pointers, per stream: the last eager launch's, reused
    while the scratch generation holds (the tensors are held so that they outlive the launch); under capture,
    fresh ones every time. `workspace_arg` / `counters_arg`: the pointers' positions in the packed arguments."""

    _CAPACITY = 8

    def __init__(self, device_index: int, workspace_arg: int, counters_arg: int) -> None:
        self._device_index = device_index
        self._positions = (workspace_arg, counters_arg)
        self._entries: dict[int, tuple[int, PackedArgs, PackedArgs, torch.Tensor, torch.Tensor]] = {}

    def derive(self, args: PackedArgs, stream: int,
               buffers: Callable[[int], tuple[torch.Tensor, torch.Tensor]]) -> PackedArgs:
        """`args` with the workspace and counters `buffers(stream)` gives (split_scratch.get underneath)."""
        capturing = stream_capturing(self._device_index)
        if not capturing:
            cached = self._entries.get(stream)
            if cached is not None and cached[0] == split_scratch.generation and cached[1] is args:
                return cached[2]
        generation = split_scratch.generation
        workspace, counters = buffers(stream)
        workspace_arg, counters_arg = self._positions
        derived = args.with_pointers(workspace_arg, workspace.data_ptr(), counters_arg, counters.data_ptr())
        if not capturing and split_scratch.generation == generation:  # nothing moved while get() ran
            if len(self._entries) >= self._CAPACITY:
                self._entries.clear()
            self._entries[stream] = (generation, args, derived, workspace, counters)
        return derived
