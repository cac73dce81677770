"""The split-tail scratch bookkeeping (deepgemm/kernels/common/split_scratch.py), with CPU tensors standing in for
device memory: per-stream reuse and growth, the per-device cap, and the arena slices of captured launches."""

from __future__ import annotations

import pytest
import torch

from deepgemm.kernels.common import split_scratch as module


@pytest.fixture
def scratch(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    state = {"capturing": False, "arenas": 0}

    def arena(device_index: int) -> torch.Tensor:
        state["arenas"] += 1
        return torch.zeros(module.ARENA_COUNTERS, dtype=torch.int32)

    monkeypatch.setattr(module, "_empty_floats", lambda device_index, count: torch.full((count,), float("nan")))
    monkeypatch.setattr(module, "_zero_counters", lambda device_index, count: torch.zeros(count, dtype=torch.int32))
    monkeypatch.setattr(module, "_zeroed_arena", arena)
    monkeypatch.setattr(module, "stream_capturing", lambda device_index: state["capturing"])
    return module.SplitScratch(), state


def test_eager_launches_on_a_stream_reuse_one_pair_that_grows(scratch) -> None:  # noqa: ANN001
    cache, state = scratch
    first = cache.get(0, 7, 100, 10)
    assert cache.get(0, 7, 50, 5) == first  # the same tensors: nothing allocated, nothing zeroed again
    grown = cache.get(0, 7, 80, 20)  # more counters: a new pair covering both needs
    assert grown[0].numel() == 100 and grown[1].numel() == 20 and not (grown[1] != 0).any()
    assert cache.get(0, 8, 10, 1)[0].data_ptr() != grown[0].data_ptr()  # another stream, its own pair
    assert cache.get(1, 7, 10, 1)[0].data_ptr() != grown[0].data_ptr()  # another device too
    assert state["arenas"] == 2  # the first eager launch on each device zeroes an arena for captures


def test_at_most_max_streams_pairs_per_device_least_recently_used_out(scratch) -> None:  # noqa: ANN001
    cache, _ = scratch
    pairs = {stream: cache.get(0, stream, 10, 1) for stream in range(module.MAX_STREAMS)}
    cache.get(0, 0, 10, 1)  # stream 0 is now the most recently used
    cache.get(0, 100, 10, 1)  # one more stream: stream 1, the least recently used, goes
    assert cache.get(0, 0, 10, 1) == pairs[0]
    assert cache.get(0, 1, 10, 1)[0].data_ptr() != pairs[1][0].data_ptr()
    assert len([key for key in cache._buffers if key[0] == 0]) == module.MAX_STREAMS
    cache.get(1, 5, 10, 1)  # other devices do not count against device 0
    assert len(cache._buffers) == module.MAX_STREAMS + 1


def test_captured_launches_get_slices_of_their_own_or_zero_in_the_graph(scratch) -> None:  # noqa: ANN001
    cache, state = scratch
    eager = cache.get(0, 7, 100, 10)
    state["capturing"] = True
    left = cache.captured_counters_left(0)
    workspace_a, counters_a = cache.get(0, 7, 100, 10)
    workspace_b, counters_b = cache.get(0, 7, 100, 10)
    assert cache.captured_counters_left(0) == left - 20
    assert workspace_a.data_ptr() not in (workspace_b.data_ptr(), eager[0].data_ptr())  # the graph's own pool
    arena = cache._arenas[0][-1]
    for slice_ in (counters_a, counters_b):  # zeroed slices of the arena, disjoint, never the eager counters
        assert slice_.numel() == 10 and not (slice_ != 0).any()
        assert arena.data_ptr() <= slice_.data_ptr() < arena.data_ptr() + arena.numel() * 4
    assert counters_a.data_ptr() + 40 <= counters_b.data_ptr() and counters_a.data_ptr() != eager[1].data_ptr()
    cache._arena_used[0] = module.ARENA_COUNTERS - 5  # too little room left: zeroed counters from the pool
    _, fallback = cache.get(0, 7, 100, 10)
    assert not (arena.data_ptr() <= fallback.data_ptr() < arena.data_ptr() + arena.numel() * 4)
    assert cache.captured_counters_left(0) == 5
    state["capturing"] = False
    cache.get(0, 7, 100, 10)  # an eager launch with the arena more than half used makes a new one
    assert state["arenas"] == 2 and cache.captured_counters_left(0) == module.ARENA_COUNTERS
    assert len(cache._arenas[0]) == 2  # the old one stays: captured graphs still point into it


def test_no_arena_before_an_eager_launch(scratch) -> None:  # noqa: ANN001
    cache, state = scratch
    state["capturing"] = True
    _, counters = cache.get(0, 7, 10, 4)  # a plan first launched under capture: memset path
    assert counters.numel() == 4 and state["arenas"] == 0 and cache.captured_counters_left(0) == 0


def test_generation_moves_whenever_a_pair_or_the_arena_changes(scratch) -> None:  # noqa: ANN001
    """Plans reuse their last eager pointers while the generation holds: it must move on every change."""
    cache, state = scratch
    before = cache.generation
    first = cache.get(0, 7, 100, 10)  # a new pair and a fresh arena
    settled = cache.generation
    assert settled > before
    assert cache.get(0, 7, 50, 5) == first and cache.generation == settled  # reuse: nothing moved
    cache.get(0, 7, 200, 10)  # grown: the old pair is dropped
    assert cache.generation > settled
    settled = cache.generation
    for stream in range(100, 100 + module.MAX_STREAMS):  # other streams push stream 7's pair out
        cache.get(0, stream, 10, 1)
    assert cache.generation > settled
    settled = cache.generation
    state["capturing"] = True
    cache.get(0, 7, 10, 1)  # a captured launch takes an arena slice
    assert cache.generation > settled
    settled = cache.generation
    state["capturing"] = False
    cache.clear()
    assert cache.generation > settled
