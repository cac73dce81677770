"""Split and stream tails (the last partial wave's tiles cut along K, summed through an FP32 workspace) on sm_90."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_close_to_reference, random_operands, reference_abs_fp64, reference_fp64

pytestmark = pytest.mark.gpu

# (m, n, k, block_m, block_n, sms, out dtype); every case has a tail of at most half a grid, so it splits.
CASES = [
    (4096, 2112, 7168, 128, 128, 132, torch.bfloat16),  # 544 tiles: 16 tail tiles x 8 ranges of 7 K blocks
    (4096, 2112, 7168, 256, 128, 132, torch.bfloat16),  # 272 tiles: 8 x 8, two waves per warpgroup
    (300, 2112, 7296, 256, 128, 30, torch.float32),  # 34 tiles: 4 x 7 uneven ranges; M tail of 44 rows
    (1000, 2056, 7296, 128, 104, 50, torch.bfloat16),  # 160 tiles: 10 x 5; straddling scale blocks, N tail
    (129, 7168, 2048, 64, 112, 60, torch.bfloat16),  # 192 tiles: 12 x 5; one math warpgroup
    (4097, 136, 256, 128, 64, 40, torch.float32),  # 99 tiles: 19 x 2 ranges of one K block
    (64, 2112, 7168, 64, 128, 132, torch.bfloat16),  # decode: 17 tiles on 132 CTAs, split-K into 7
    (1, 4096, 7168, 64, 128, 132, torch.bfloat16),  # 32 tiles x 4; one row
    (4096, 1024, 7168, 192, 128, 132, torch.bfloat16),  # 176 tiles: 44 x 3; three math warpgroups
    (4097, 1000, 7296, 192, 128, 132, torch.float32),  # 176 tiles: 44 x 3; 65-row last block, N tail
]


# Stream tail: (m, n, k, block_m, block_n, sms, out dtype); every case has a tail of more than half a grid.
STREAM_CASES = [
    (4096, 4096, 7168, 256, 128, 132, torch.bfloat16),  # 512 tiles: 116 tail tiles, 49.2 K blocks per CTA
    (1024, 1024, 7168, 256, 128, 12, torch.float32),  # 32 tiles: 8 x 56 K blocks over 12 CTAs
    (300, 2112, 7296, 256, 128, 20, torch.float32),  # 34 tiles: M tail of 44 rows (one warpgroup idle)
    (1000, 2056, 4224, 128, 104, 60, torch.bfloat16),  # 160 tiles: 40 tail tiles of 33 K blocks, straddling, N tail
    (2000, 1024, 7296, 192, 128, 50, torch.bfloat16),  # 88 tiles: three math warpgroups, 80-row last block
    (129, 7168, 2048, 64, 112, 120, torch.bfloat16),  # 192 tiles: 72 heads of 12 K blocks; one math warpgroup (no loader)
    (64, 2112, 7168, 64, 128, 24, torch.bfloat16),  # 17 tiles on 24 CTAs: every tile is a tail tile
]


def finite_rows(m: int, block_m: int) -> int:
    """Rows of a tile's first math warpgroup whose partials are sure to be finite. That warpgroup always has rows
    (the others may not); a partial last M-block loads A only for its rows (dense_last_box_rows), so the
    partials of the rows past M come from stale shared memory: any bits."""
    last_block_rows = m - (-(-m // block_m) - 1) * block_m
    return min(last_block_rows, 64)


def split_plan(m: int, n: int, k: int, block_m: int, block_n: int, sms: int, out_dtype: torch.dtype,
               stream: bool = False):  # noqa: ANN201
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan

    config = make_config(m, n, k, block_m, block_n, sms, 4 if out_dtype == torch.float32 else 2, cluster_m=1,
                         split_tail=not stream, stream_tail=stream)
    return get_plan(0, m, n, k, out_dtype, config)


def run(plan, a, b, out_dtype: torch.dtype) -> torch.Tensor:  # noqa: ANN001
    m, n = a[0].shape[0], b[0].shape[0]
    out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
    plan.launch(a[0], a[1], b[0], b[1], out)
    return out


def check_launches(plan, m: int, n: int, k: int, out_dtype: torch.dtype,  # noqa: ANN001
                   monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Two inputs against float64, then each again twice, alternating (a K range that read another launch's
    partials would show): bitwise equal. Returns the first launch's workspace (poisoned with NaN before it)
    and arrival counters."""
    buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
    make_buffers = plan.split_buffers

    def poisoned_buffers(stream: int) -> tuple[torch.Tensor, torch.Tensor]:
        workspace, counters = make_buffers(stream)
        workspace.fill_(float("nan"))
        buffers.append((workspace, counters))
        return workspace, counters

    monkeypatch.setattr(plan, "split_buffers", poisoned_buffers)
    inputs = [random_operands(m, n, k, "cuda"), random_operands(m, n, k, "cuda")]
    firsts = []
    for a, b in inputs:
        out = run(plan, a, b, out_dtype)
        assert_close_to_reference(out, reference_fp64(a, b), reference_abs_fp64(a, b),
                                  max_diff=1e-5 if out_dtype == torch.float32 else 1e-3)
        firsts.append(out)
    for _ in range(2):
        for (a, b), first in zip(inputs, firsts):
            assert torch.equal(run(plan, a, b, out_dtype), first), "the tail must sum its K ranges in a fixed order"
    torch.cuda.synchronize()
    return buffers[0]


@pytest.mark.parametrize("m,n,k,block_m,block_n,sms,out_dtype", CASES, ids=lambda v: str(v))
def test_split_tail_matches_float64_and_repeats_bitwise(m: int, n: int, k: int, block_m: int, block_n: int, sms: int,
                                                        out_dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = split_plan(m, n, k, block_m, block_n, sms, out_dtype)
    splits = plan.split_count()
    assert splits > 1 and plan.grid == sms
    tail = -(-m // block_m) * -(-n // block_n) % plan.grid
    workspace, counters = check_launches(plan, m, n, k, out_dtype, monkeypatch)
    # The device really splits: every K range of the tail wrote its slot, and the counters are back at zero.
    warpgroups = plan.spec.config.num_math_warpgroups  # one partial each per slot
    slots = workspace[: tail * splits * block_m * block_n].view(tail * splits, warpgroups, -1)
    assert (slots[:, 0].isfinite().sum(-1) >= finite_rows(m, block_m) * block_n).all()
    assert (counters == 0).all()


@pytest.mark.parametrize("m,n,k,block_m,block_n,sms,out_dtype", STREAM_CASES, ids=lambda v: str(v))
def test_stream_tail_matches_float64_and_repeats_bitwise(m: int, n: int, k: int, block_m: int, block_n: int, sms: int,
                                                         out_dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = split_plan(m, n, k, block_m, block_n, sms, out_dtype, stream=True)
    assert plan.split_count() > 1 and plan.grid == sms
    tail = -(-m // block_m) * -(-n // block_n) % sms  # tail tiles: each one's end leaves a partial in its slot
    workspace, counters = check_launches(plan, m, n, k, out_dtype, monkeypatch)
    warpgroups = plan.spec.config.num_math_warpgroups
    slots = workspace[: sms * block_m * block_n].view(sms, warpgroups, -1)  # (the stream's buffer may be larger)
    # Every tail tile's end left its first math warpgroup's partial.
    assert (slots[:tail, 0].isfinite().sum(-1) >= finite_rows(m, block_m) * block_n).all()
    assert (counters == 0).all()  # every head saw its tile's end arrive and reset the count


def test_split_scratch_is_reused_per_stream_and_fresh_under_capture() -> None:
    """Warm eager launches on one stream share one zeroed workspace (no allocation, no memset), which grows
    for a bigger plan; plans of both tail kinds take turns on it. Captured launches take zeroed counters of
    their own from the arena (no memset node), or, with the arena spent, zero fresh ones in the graph."""
    from deepgemm.jit.runtime import current_raw_stream
    from deepgemm.kernels.common import split_scratch as scratch_module
    from deepgemm.kernels.common.split_scratch import split_scratch

    split_scratch.clear()
    small = split_plan(129, 7168, 2048, 64, 112, 60, torch.bfloat16)  # one math warpgroup
    big = split_plan(4096, 4096, 7168, 256, 128, 132, torch.bfloat16, stream=True)
    stream = current_raw_stream(0)
    first = small.split_buffers(stream)
    assert small.split_buffers(stream)[0].data_ptr() == first[0].data_ptr()
    grown = big.split_buffers(stream)
    assert grown[0].numel() >= 132 * 256 * 128 and grown[0].numel() >= first[0].numel()
    assert small.split_buffers(stream)[0].data_ptr() == grown[0].data_ptr()  # the grown buffer serves both

    cases = [(small, 129, 7168, 2048), (big, 4096, 4096, 7168)]
    inputs = [(random_operands(m, n, k, "cuda"), m, n, k) for _, m, n, k in cases]
    for _ in range(3):  # alternate the plans on the shared buffers: each leaves the counters at zero
        for (plan, *_), ((a, b), m, n, k) in zip(cases, inputs):
            out = run(plan, a, b, torch.bfloat16)
            assert_close_to_reference(out, reference_fp64(a, b), reference_abs_fp64(a, b))
    torch.cuda.synchronize()
    assert (grown[1] == 0).all()

    def capture(plan, a, b, out):  # noqa: ANN001, ANN202
        seen: list[torch.Tensor] = []
        make_buffers = plan.split_buffers

        def record(stream_: int) -> tuple[torch.Tensor, torch.Tensor]:
            buffers = make_buffers(stream_)
            seen.append(buffers[1])
            return buffers

        graph = torch.cuda.CUDAGraph()
        plan.split_buffers = record
        try:
            with torch.cuda.graph(graph):
                plan.launch(a[0], a[1], b[0], b[1], out)
        finally:
            del plan.split_buffers
        return graph, seen[0]

    (a, b), m, n, k = inputs[0]
    expected = run(small, a, b, torch.bfloat16)
    counters = small.grid * small.spec.config.num_math_warpgroups
    left = split_scratch.captured_counters_left(0)
    outs = [torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(3)]
    graph0, counters0 = capture(small, a, b, outs[0])
    graph1, counters1 = capture(small, a, b, outs[1])
    assert split_scratch.captured_counters_left(0) == left - 2 * counters  # two slices of the arena
    assert len({counters0.data_ptr(), counters1.data_ptr(), grown[1].data_ptr()}) == 3
    # An arena with no room left: the captured launch zeroes counters from the graph's pool instead.
    used = split_scratch._arena_used[0]
    split_scratch._arena_used[0] = scratch_module.ARENA_COUNTERS
    try:
        graph2, counters2 = capture(small, a, b, outs[2])
    finally:
        split_scratch._arena_used[0] = used
    arena = split_scratch._arenas[0][-1]
    assert not arena.data_ptr() <= counters2.data_ptr() < arena.data_ptr() + arena.numel() * 4
    assert split_scratch.captured_counters_left(0) == left - 2 * counters
    for _ in range(3):  # replays of all three and eager launches interleaved: none disturbs another's counters
        for graph, out in zip((graph0, graph1, graph2), outs):
            out.fill_(float("nan"))
            graph.replay()
            assert torch.equal(out, expected)
        assert torch.equal(run(small, a, b, torch.bfloat16), expected)
    torch.cuda.synchronize()
    assert (counters0 == 0).all() and (counters1 == 0).all()


@pytest.mark.parametrize("stream", [False, True], ids=["split", "stream"])
def test_split_tail_graph_replay_and_two_streams(stream: bool) -> None:
    m, n, k = (4096, 4096, 7168) if stream else (4096, 2112, 7168)
    plan = split_plan(m, n, k, 256 if stream else 128, 128, 132, torch.bfloat16, stream=stream)
    assert plan.split_count() > 1
    inputs = [random_operands(m, n, k, "cuda") for _ in range(2)]
    expected = [run(plan, a, b, torch.bfloat16) for a, b in inputs]
    torch.cuda.synchronize()

    # Captured on torch.cuda.graph's own stream (its first use), replayed with new input contents.
    a_live = (inputs[0][0][0].clone(), inputs[0][0][1].clone())
    b_live = (inputs[0][1][0].clone(), inputs[0][1][1].clone())
    out = torch.full_like(expected[0], float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.launch(a_live[0], a_live[1], b_live[0], b_live[1], out)
    for round_ in range(4):
        (a, b), want = inputs[round_ % 2], expected[round_ % 2]
        for live, new in zip(a_live + b_live, a + b):
            live.copy_(new)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)

    # The same plan on two streams at once, with different inputs: each launch has its own partials.
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    pairs = []
    for stream in streams:  # (each stream's pair is allocated on that stream, as a launch on it would)
        with torch.cuda.stream(stream):
            pairs.append(plan.split_buffers(stream.cuda_stream))
    assert pairs[0][0].data_ptr() != pairs[1][0].data_ptr() and pairs[0][1].data_ptr() != pairs[1][1].data_ptr()
    for _ in range(5):
        outs = [torch.full_like(expected[0], float("nan")) for _ in streams]
        for stream, (a, b), target in zip(streams, inputs, outs):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                plan.launch(a[0], a[1], b[0], b[1], target)
                target.record_stream(stream)
        for stream in streams:
            torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        for target, want in zip(outs, expected):
            assert torch.equal(target, want)
