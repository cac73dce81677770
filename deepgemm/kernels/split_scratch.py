"""Scratch memory of split- and stream-tail launches: FP32 partial slots and zeroed arrival counters.

A split launch needs a slot of FP32 partials per split unit and a counter per (tail tile, math warpgroup).
The kernel leaves every counter it touched at zero (the last arrival, or the waiting head, resets it), so
counters need zeroing once, not per launch:
- eager launches share one workspace and one counter buffer per (device, stream): launches on a stream run
  in order. The buffers grow to the largest plan seen and are then reused, so a warm eager call allocates
  nothing and launches no memset.
- a launch captured in a CUDA graph takes its counters from a per-device arena zeroed when a split plan is
  built (before any capture), a slice no other launch or graph ever uses (a replay of one graph never
  overlaps another replay of it), so the graph needs no memset node (measured ~1.6 us per replay on the H200);
  its workspace comes from the graph's own pool (written before it is read in every launch). If the arena is
  spent, the counters come from the pool too, zeroed by a memset the graph replays.
"""

from __future__ import annotations

import threading

import torch

# Counters per arena: 1 MiB, enough for ~650 captured launches of the widest split grid (132 CTAs x 3 warpgroups).
ARENA_COUNTERS = 1 << 18


class SplitScratch:
    """Per-(device, stream) workspace and counters for eager launches, and never-reused zeroed counters for
    captured ones."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._arenas: dict[int, list[torch.Tensor]] = {}  # every arena ever made stays alive (graphs use slices)
        self._arena_used: dict[int, int] = {}  # counters handed out of the device's newest arena
        self._lock = threading.Lock()

    def get(self, device_index: int, stream: int, workspace_floats: int, counters: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(workspace, counters) with at least these sizes, for a launch on `stream` (the current stream of
        `device_index`): ready in stream order, counters at zero."""
        if torch.cuda.is_current_stream_capturing():
            device = torch.device("cuda", device_index)
            workspace = torch.empty(workspace_floats, dtype=torch.float32, device=device)  # the graph's pool
            slice_ = self._take_captured_counters(device_index, counters)
            if slice_ is None:
                slice_ = torch.zeros(counters, dtype=torch.int32, device=device)
            return workspace, slice_
        key = (device_index, stream)
        entry = self._buffers.get(key)
        if entry is None or entry[0].numel() < workspace_floats or entry[1].numel() < counters:
            with self._lock:
                entry = self._buffers.get(key)
                if entry is None or entry[0].numel() < workspace_floats or entry[1].numel() < counters:
                    if entry is not None:  # grow to cover both the old and the new need
                        workspace_floats = max(workspace_floats, entry[0].numel())
                        counters = max(counters, entry[1].numel())
                    device = torch.device("cuda", device_index)
                    entry = self._buffers[key] = (torch.empty(workspace_floats, dtype=torch.float32, device=device),
                                                  torch.zeros(counters, dtype=torch.int32, device=device))
        return entry

    def prepare_captures(self, device_index: int) -> None:
        """Make sure the device has a zeroed counter arena with room left, outside any capture (a split plan
        calls this when it is built). Synchronizes the current stream when it makes one, so the zeros are in
        memory before any graph on any stream reads them."""
        if torch.cuda.is_current_stream_capturing():
            return  # (a plan built during a capture: its captured launches zero their own counters)
        with self._lock:
            arenas = self._arenas.get(device_index)
            if arenas and self._arena_used[device_index] < ARENA_COUNTERS // 2:
                return
            with torch.cuda.device(device_index):
                arena = torch.zeros(ARENA_COUNTERS, dtype=torch.int32, device=torch.device("cuda", device_index))
                torch.cuda.current_stream(device_index).synchronize()
            self._arenas.setdefault(device_index, []).append(arena)
            self._arena_used[device_index] = 0

    def _take_captured_counters(self, device_index: int, counters: int) -> torch.Tensor | None:
        with self._lock:
            arenas = self._arenas.get(device_index)
            used = self._arena_used.get(device_index, 0)
            if not arenas or used + counters > ARENA_COUNTERS:
                return None
            self._arena_used[device_index] = used + counters
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


split_scratch = SplitScratch()
