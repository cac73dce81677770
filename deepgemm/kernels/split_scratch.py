"""Scratch memory of split- and stream-tail launches: FP32 partial slots and zeroed arrival counters.

A split launch needs a slot of FP32 partials per split unit and a counter per (tail tile, math warpgroup).
The kernel leaves every counter it touched at zero (the last arrival, or the waiting head, resets it), so
one zeroed buffer serves every later launch on the same stream: launches on one stream run in order, and
each (device, stream) has its own buffers. They grow to the largest plan seen and are then reused, so a
warm eager call allocates nothing and launches no memset.

During CUDA-graph capture every launch gets fresh buffers from the graph's private pool instead (and the
captured memset re-zeroes the counters on each replay): a cached buffer could be freed by a later growth
while the graph still points at it.
"""

from __future__ import annotations

import threading

import torch


class SplitScratch:
    """Per-(device, stream) workspace and counters, grown on demand."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._lock = threading.Lock()

    def get(self, device_index: int, stream: int, workspace_floats: int, counters: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(workspace, counters) with at least these sizes, for a launch on `stream` (the current stream of
        `device_index`): allocated and zeroed on that stream, so they are ready in stream order."""
        if torch.cuda.is_current_stream_capturing():
            return self._allocate(device_index, workspace_floats, counters)
        key = (device_index, stream)
        entry = self._buffers.get(key)
        if entry is None or entry[0].numel() < workspace_floats or entry[1].numel() < counters:
            with self._lock:
                entry = self._buffers.get(key)
                if entry is None or entry[0].numel() < workspace_floats or entry[1].numel() < counters:
                    if entry is not None:  # grow to cover both the old and the new need
                        workspace_floats = max(workspace_floats, entry[0].numel())
                        counters = max(counters, entry[1].numel())
                    entry = self._buffers[key] = self._allocate(device_index, workspace_floats, counters)
        return entry

    @staticmethod
    def _allocate(device_index: int, workspace_floats: int, counters: int) -> tuple[torch.Tensor, torch.Tensor]:
        device = torch.device("cuda", device_index)
        return (torch.empty(workspace_floats, dtype=torch.float32, device=device),
                torch.zeros(counters, dtype=torch.int32, device=device))

    def clear(self) -> None:
        """Drop every cached buffer (tests; the caching allocator reuses them in stream order)."""
        with self._lock:
            self._buffers.clear()


split_scratch = SplitScratch()
