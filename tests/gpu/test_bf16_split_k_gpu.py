"""BF16 split-K (dense decode sizes: K ranges of the few tiles on the idle SMs, FP32 partials reduced in range
order) on the H200 against float64: the cost model's split picks through the public functions in every layout,
forced split builds at the edges (a math warpgroup with no rows, N and K tails, ranges of one K block, C as out),
NaN-poisoned outputs and workspaces, bitwise repeats, counters back at zero, CUDA-graph replay. Every test checks
that the plan really splits."""

from __future__ import annotations

import pytest
import torch

import deepgemm
from deepgemm.kernels.common.device import sm_count
from deepgemm.kernels.sm90_bf16_gemm.cost_model import make_config
from deepgemm.kernels.sm90_bf16_gemm.plan import bf16_problem, get_bf16_plan
from deepgemm.reference import bf16_gemm_reference
from tests.helpers import assert_bf16_graph_replays, bf16_layout_operands, check_bf16_gemm

pytestmark = pytest.mark.gpu

ENTRY = "deepgemm_bf16_gemm"
LAYOUTS = ("nt", "nn", "tn", "tt")
FUNCTIONS = {layout: getattr(deepgemm, f"bf16_gemm_{layout}") for layout in LAYOUTS}


# Decode shapes where the cost model picks a split-K build on the H200's 132 SMs: K-major B (nt, tt) widens narrow
# picks (with an MN-major A also where the plain grid is full: 16 x 4096 x 14336); an MN-major B (nn, tn: 64-column
# tiles at least) splits where 64-wide tiles leave 3/4 of the SMs idle.
MODEL_SPLITS = {"t": [(1, 2112, 7168), (64, 2112, 7168), (128, 2112, 7168), (16, 1536, 7168)],
                "n": [(1, 2112, 7168), (64, 2112, 7168)]}
MN_MAJOR_A_SPLITS = {"t": [(16, 4096, 14336)], "n": []}


def model_splits(layout: str) -> list[tuple[int, int, int]]:
    """The layout's split shapes (an MN-major A needs M % 8 == 0)."""
    if layout[0] == "n":
        return MODEL_SPLITS[layout[1]]
    return [s for s in MODEL_SPLITS[layout[1]] + MN_MAJOR_A_SPLITS[layout[1]] if s[0] % 8 == 0]


@pytest.mark.quick
@pytest.mark.parametrize("layout", LAYOUTS)
def test_model_split_picks_against_float64(layout: str, seed: int, gpu_guard) -> None:
    assert model_splits(layout)
    for m, n, k in model_splits(layout):
        plan = get_bf16_plan(0, m, n, k, layout, torch.bfloat16, None)
        assert plan.spec.config.split_k and plan.splits > 1, f"{m}x{n}x{k}: {plan.spec.label()} does not split"
        a, b = bf16_layout_operands(layout, m, n, k)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        before = gpu_guard.launches(ENTRY)
        FUNCTIONS[layout](a, b, out)
        torch.cuda.synchronize()
        assert gpu_guard.launches(ENTRY) == before + 1
        check_bf16_gemm(out, bf16_gemm_reference(a, b, layout, None, torch.float64), f"{layout} {m}x{n}x{k} {plan.spec.label()}")
        for _ in range(2):  # a fixed summation order: the same bits whichever range arrives last
            assert torch.equal(FUNCTIONS[layout](a, b), out)


# Forced split builds: (layout, m, n, k, block_m, block_n, out dtype, C dtype, C as out).
FORCED = [
    ("nt", 50, 2112, 7168, 128, 64, torch.float32, torch.float32, False),  # second warpgroup has no rows
    ("nt", 7, 136, 200, 64, 64, torch.bfloat16, None, False),             # N and K tails, ranges of one K block
    ("nn", 65, 2056, 7296, 128, 128, torch.bfloat16, torch.bfloat16, True),  # C as out (in place)
    ("tn", 72, 4096, 7168, 128, 128, torch.float32, torch.bfloat16, False),
    ("tt", 8, 2048, 4104, 64, 128, torch.bfloat16, torch.float32, False),
]


def partial_rows(block_n: int) -> torch.Tensor:
    """The tile row of each element of a math warpgroup's FP32 partial in a split-K workspace slot (split_reduction.cuh:
    16-byte vectors, thread-major: element (512 q + 4 t + r) is thread t's accumulator register 4 q + r, whose row is
    16 (t / 32) + (t % 32) / 4 + 8 (r / 2))."""
    e = torch.arange(64 * block_n, device="cuda")
    thread, r = (e % 512) // 4, e % 4
    return 16 * (thread // 32) + (thread % 32) // 4 + 8 * (r // 2)


def forced_plan(layout: str, m: int, n: int, k: int, block_m: int, block_n: int, out_dtype: torch.dtype,
                c_dtype: torch.dtype | None):  # noqa: ANN201
    problem = bf16_problem(m, n, k, layout, out_dtype, c_dtype, sm_count(0))
    config = make_config(problem, block_m, block_n, split_k=True)
    plan = get_bf16_plan(0, m, n, k, layout, out_dtype, c_dtype, config)
    assert plan.splits > 1 and plan.grid == sm_count(0), plan.spec.label()
    return plan


@pytest.mark.quick
@pytest.mark.parametrize("case", FORCED, ids=lambda c: f"{c[0]}-{c[1]}x{c[2]}x{c[3]}-bm{c[4]}bn{c[5]}")
def test_forced_split_builds(case: tuple, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    layout, m, n, k, block_m, block_n, out_dtype, c_dtype, c_is_out = case
    plan = forced_plan(layout, m, n, k, block_m, block_n, out_dtype, c_dtype)
    buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
    make_buffers = plan.split_buffers

    def poisoned(stream: int) -> tuple[torch.Tensor, torch.Tensor]:
        workspace, counters = make_buffers(stream)
        workspace.fill_(float("nan"))  # a range that read a slot nobody wrote would show
        buffers.append((workspace, counters))
        return workspace, counters

    monkeypatch.setattr(plan, "split_buffers", poisoned)
    results = []
    for _ in range(2):  # two inputs, then each again: no launch sees another's partials
        a, b = bf16_layout_operands(layout, m, n, k)
        c = None if c_dtype is None else torch.randn(m, n, device="cuda").to(c_dtype)
        ref = bf16_gemm_reference(a, b, layout, c, torch.float64)
        out = c.clone() if c_is_out else torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
        plan.launch(a, b, out, out if c_is_out else c)
        torch.cuda.synchronize()
        check_bf16_gemm(out, ref, f"{plan.spec.label()} m={m}")
        results.append((a, b, c, out))
    for a, b, c, first in results:
        again = c.clone() if c_is_out else torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
        plan.launch(a, b, again, again if c_is_out else c)
        assert torch.equal(again, first)
    torch.cuda.synchronize()
    workspace, counters = buffers[0]
    tiles = -(-m // block_m) * -(-n // block_n)
    slot = block_m * block_n
    written = workspace[: tiles * plan.splits * slot].view(tiles * plan.splits, slot)[:, : 64 * block_n]
    # Rows past M may hold anything: a K-major A's last M-block is loaded in a box of its rows (rounded up to 8), the
    # rows past it are stale shared memory. The first warpgroup's rows below M must be written.
    assert m <= block_m, "the cases are one M-block tall"
    assert written[:, partial_rows(block_n) < m].isfinite().all(), "every K range of every tile wrote its partial"
    assert (counters == 0).all(), "the last arrival of each tile resets its counter"


@pytest.mark.quick
@pytest.mark.parametrize("layout", ["nt", "tn"])
def test_split_graph_replay(layout: str, seed: int, gpu_guard) -> None:
    """Captured after an eager call (counters from the zeroed arena, no memset node): each replay on new data in
    the captured tensors matches float64."""
    for m, n, k in model_splits(layout)[-2:]:
        assert get_bf16_plan(0, m, n, k, layout, torch.bfloat16, None).splits > 1
        assert_bf16_graph_replays(layout, m, n, k, 3)
    assert gpu_guard.launches(ENTRY) >= 1


@pytest.mark.quick
def test_split_scratch_is_per_stream(seed: int) -> None:
    """Two streams running the same split plan at once use separate workspaces and counters."""
    m, n, k = 64, 2112, 7168
    plan = get_bf16_plan(0, m, n, k, "nt", torch.bfloat16, None)
    assert plan.splits > 1
    inputs = [bf16_layout_operands("nt", m, n, k) for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    outs = [torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    for _ in range(5):
        for (a, b), stream, out in zip(inputs, streams, outs):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                deepgemm.bf16_gemm_nt(a, b, out)
    torch.cuda.synchronize()
    for (a, b), out in zip(inputs, outs):
        check_bf16_gemm(out, bf16_gemm_reference(a, b, "nt", None, torch.float64), "two streams")
