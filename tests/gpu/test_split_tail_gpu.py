"""Split tail (the last partial wave's tiles split along K, summed through an FP32 workspace) on sm_90."""

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
]


def expected_splits(tiles: int, grid: int, k_blocks: int) -> int:
    """The device scheduler's rule (SplitTailTileScheduler), to keep these cases meaningful."""
    tail = tiles % grid
    return min(grid // tail, 8, k_blocks) if tail and 2 * tail <= grid else 1


def split_plan(m: int, n: int, k: int, block_m: int, block_n: int, sms: int, out_dtype: torch.dtype):  # noqa: ANN201
    from deepgemm.configs.heuristics import make_config
    from deepgemm.kernels.fp8_gemm import get_plan

    config = make_config(m, n, k, block_m, block_n, sms, 4 if out_dtype == torch.float32 else 2, cluster_m=1,
                         split_tail=True)
    return get_plan(0, m, n, k, out_dtype, config)


@pytest.mark.parametrize("m,n,k,block_m,block_n,sms,out_dtype", CASES, ids=lambda v: str(v))
def test_split_tail_matches_float64_and_repeats_bitwise(m: int, n: int, k: int, block_m: int, block_n: int, sms: int,
                                                        out_dtype: torch.dtype) -> None:
    plan = split_plan(m, n, k, block_m, block_n, sms, out_dtype)
    tiles = -(-m // block_m) * -(-n // block_n)
    assert plan.grid == min(sms, tiles) and expected_splits(tiles, plan.grid, -(-k // 128)) > 1
    a, b = random_operands(m, n, k, "cuda")
    first = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
    plan.launch(a[0], a[1], b[0], b[1], first)
    assert_close_to_reference(first, reference_fp64(a, b), reference_abs_fp64(a, b),
                              max_diff=1e-5 if out_dtype == torch.float32 else 1e-3)
    for _ in range(3):  # the arrival counters must be back at zero after every launch
        again = torch.full_like(first, float("nan"))
        plan.launch(a[0], a[1], b[0], b[1], again)
        assert torch.equal(again, first), "the split tail must sum its K ranges in a fixed order"


def test_split_tail_graph_replay_and_two_streams() -> None:
    m, n, k = 4096, 2112, 7168
    plan = split_plan(m, n, k, 128, 128, 132, torch.bfloat16)
    a, b = random_operands(m, n, k, "cuda")
    expected = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    plan.launch(a[0], a[1], b[0], b[1], expected)
    torch.cuda.synchronize()

    out = torch.full_like(expected, float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan.launch(a[0], a[1], b[0], b[1], out)  # warm this stream's workspace before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.launch(a[0], a[1], b[0], b[1], out)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)

    # The same plan on two streams at once: each stream has its own partials and counters.
    outs = [torch.full_like(expected, float("nan")) for _ in range(2)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for _ in range(5):
        for stream, target in zip(streams, outs):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                plan.launch(a[0], a[1], b[0], b[1], target)
        for stream in streams:
            torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        for target in outs:
            assert torch.equal(target, expected)
