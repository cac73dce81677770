"""Unpipelined whole tiles at short K on sm_90 (one to sixteen K blocks, where the kernel once stored each wave
inside the next tile's K loop): forced tiles on small grids, so every CTA runs several tiles back to back, with M
and N tails, warpgroups past M, a second wave past M (dense tiles compute it from zero-filled rows and the store
clips it), one to three math warpgroups; outputs against float64, bitwise repeatable across alternating inputs
(a wave stored from another tile's or launch's registers would show) and under CUDA-graph replay."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_close_to_reference, random_operands, reference_abs_fp64, reference_fp64

pytestmark = pytest.mark.gpu

# (m, n, k, block_m, block_n, sms)
CASES = [
    (4096, 7168, 2048, 256, 128, 132),  # a DeepSeek-V3 shape: 896 tiles, 6.8 per CTA
    (300, 2112, 2048, 256, 128, 16),  # 34 tiles on 16 CTAs; last block row: 44 rows (one warpgroup, one wave)
    (1000, 1000, 128, 256, 128, 7),  # one K block (the first block is also the last); 232-row last block, N tail
    (520, 2048, 512, 256, 64, 9),  # four K blocks; 8-row last block row; block_n 64
    (1000, 2056, 640, 256, 128, 5),  # five K blocks; N tail of 8 columns
    (4097, 2112, 1536, 128, 192, 20),  # two math warpgroups of one wave, straddling scale blocks, a 1-row last block
    (2000, 1024, 640, 192, 128, 11),  # three math warpgroups; 80-row last block
    (777, 1024, 2048, 256, 32, 12),  # sixteen K blocks; block_n 32; 9-row last block row
]


def short_k_plan(m: int, n: int, k: int, block_m: int, block_n: int, sms: int):  # noqa: ANN201
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan

    config = make_config(m, n, k, block_m, block_n, sms, 2, cluster_m=1)
    assert not config.pipelined and not config.split_tail and not config.stream_tail and not config.chunked_store
    return get_plan(0, m, n, k, torch.bfloat16, config)


@pytest.mark.parametrize("m,n,k,block_m,block_n,sms", CASES, ids=lambda v: str(v))
def test_short_k_tiles_match_float64_and_repeat_bitwise(m: int, n: int, k: int, block_m: int, block_n: int,
                                                        sms: int) -> None:
    plan = short_k_plan(m, n, k, block_m, block_n, sms)
    inputs = [random_operands(m, n, k, "cuda"), random_operands(m, n, k, "cuda")]
    firsts = []
    for a, b in inputs:
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        plan.launch(a[0], a[1], b[0], b[1], out)
        assert_close_to_reference(out, reference_fp64(a, b), reference_abs_fp64(a, b), max_diff=1e-3)
        firsts.append(out)
    # Alternating inputs: a wave stored from a previous launch's (or tile's) registers would show.
    for (a, b), first in zip(inputs, firsts):
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        plan.launch(a[0], a[1], b[0], b[1], out)
        assert torch.equal(out, first)


def test_short_k_tiles_in_a_cuda_graph() -> None:
    m, n, k = 700, 1536, 1024
    plan = short_k_plan(m, n, k, 256, 128, 10)
    a, b = random_operands(m, n, k, "cuda")
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    plan.launch(a[0], a[1], b[0], b[1], out)
    torch.cuda.synchronize()
    expected = out.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.launch(a[0], a[1], b[0], b[1], out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)
    assert_close_to_reference(out, reference_fp64(a, b), reference_abs_fp64(a, b), max_diff=1e-3)
