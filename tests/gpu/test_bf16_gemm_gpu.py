"""BF16 GEMM on the H200 in all four layouts against a float64 reference: the DeepSeek-V3 shapes, odd shapes in each
layout's non-contiguous dimensions, BF16 and FP32 out, with and without C (and C as out), NaN-poisoned outputs,
bitwise repeats, CUDA-graph replay, and the backward against float64 gradients. Every test asserts our kernel ran."""

from __future__ import annotations

import itertools

import pytest
import torch

import deepgemm
from deepgemm.reference import bf16_gemm_reference
from tests.helpers import assert_bf16_graph_replays, bf16_layout_operands, check_bf16_gemm

pytestmark = pytest.mark.gpu

ENTRY = "deepgemm_bf16_gemm"
LAYOUTS = ("nt", "nn", "tn", "tt")
DEEPSEEK_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
FUNCTIONS = {layout: getattr(deepgemm, f"bf16_gemm_{layout}") for layout in LAYOUTS}


def run(layout: str, m: int, n: int, k: int, out_dtype: torch.dtype, c_dtype: torch.dtype | None, guard) -> None:
    a, b = bf16_layout_operands(layout, m, n, k)
    c = None if c_dtype is None else torch.randn(m, n, device="cuda").to(c_dtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
    before = guard.launches(ENTRY)
    FUNCTIONS[layout](a, b, out, c=c)
    torch.cuda.synchronize()
    assert guard.launches(ENTRY) == before + (1 if m * n * k else 0)
    check_bf16_gemm(out, bf16_gemm_reference(a, b, layout, c, torch.float64), f"{layout} {m}x{n}x{k} out={out_dtype} c={c_dtype}")


@pytest.mark.quick
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [64, 4096])
def test_deepseek_shapes(layout: str, m: int, seed: int, gpu_guard) -> None:
    for n, k in DEEPSEEK_NK:
        run(layout, m, n, k, torch.bfloat16, None, gpu_guard)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_deepseek_shapes_m128(layout: str, seed: int, gpu_guard) -> None:
    for n, k in DEEPSEEK_NK:
        run(layout, 128, n, k, torch.bfloat16, None, gpu_guard)


def odd_ms(layout: str) -> list[int]:
    return [1, 7, 65, 129, 1000, 4097] if layout[0] == "n" else [8, 72, 1000, 4104]


@pytest.mark.quick
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n,k", [(8, 72), (136, 8), (2056, 7296), (136, 72)])
def test_odd_shapes(layout: str, n: int, k: int, seed: int, gpu_guard) -> None:
    for m in odd_ms(layout):
        run(layout, m, n, k, torch.bfloat16, None, gpu_guard)


@pytest.mark.quick
@pytest.mark.parametrize("layout", ["nt", "nn"])
def test_last_m_block_box(layout: str, seed: int, gpu_guard) -> None:
    """A K-major A's partial last M-block is loaded in a box of its rows rounded up to 8 (dense_last_box_rows), the
    rest of the stage left stale: forced tiles where that box is 8 rows (M below one block, M one past a block), ends
    inside the first math warpgroup (the second has no rows) or inside the second; with C into FP32 and split-K."""
    from deepgemm.kernels.common.layout import dense_last_box_rows
    from deepgemm.kernels.sm90_bf16_gemm.cost_model import make_config
    from deepgemm.kernels.sm90_bf16_gemm.plan import bf16_problem, get_bf16_plan

    n, k = 2056, 1024
    cases = [(1, 64, False), (9, 64, True), (65, 64, False), (40, 128, False), (200, 128, False), (100, 128, True)]
    for (m, block_m, split), (out_dtype, c_dtype) in itertools.product(cases, [(torch.bfloat16, None),
                                                                              (torch.float32, torch.float32)]):
        assert dense_last_box_rows(block_m, m) < block_m
        config = make_config(bf16_problem(m, n, k, layout, out_dtype, c_dtype, 132), block_m, 64, split_k=split)
        plan = get_bf16_plan(0, m, n, k, layout, out_dtype, c_dtype, config)
        assert plan.splits > 1 if split else plan.splits == 1, plan.spec.label()
        for _ in range(2):  # the second launch finds the first one's tiles in shared memory past the box
            a, b = bf16_layout_operands(layout, m, n, k)
            c = None if c_dtype is None else torch.randn(m, n, device="cuda").to(c_dtype)
            out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
            before = gpu_guard.launches(ENTRY)
            plan.launch(a, b, out, c)
            torch.cuda.synchronize()
            assert gpu_guard.launches(ENTRY) == before + 1
            check_bf16_gemm(out, bf16_gemm_reference(a, b, layout, c, torch.float64), f"{plan.spec.label()} m={m}")


@pytest.mark.quick
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("out_dtype,c_dtype", [(torch.float32, None), (torch.float32, torch.float32),
                                               (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                               (torch.float32, torch.bfloat16)])
def test_out_and_addend_dtypes(layout: str, out_dtype: torch.dtype, c_dtype: torch.dtype | None, seed: int,
                               gpu_guard) -> None:
    for m, n, k in [(72, 136, 72), (1000, 2056, 1024), (4104, 4096, 512)]:
        run(layout, m, n, k, out_dtype, c_dtype, gpu_guard)


@pytest.mark.quick
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_place_accumulation(layout: str, dtype: torch.dtype, seed: int, gpu_guard) -> None:
    m, n, k = 1000, 2056, 1536
    acc = torch.randn(m, n, device="cuda").to(dtype)
    expected = acc.double()
    for _ in range(3):
        a, b = bf16_layout_operands(layout, m, n, k)
        expected = expected + bf16_gemm_reference(a, b, layout, None, torch.float64)
        FUNCTIONS[layout](a, b, acc, c=acc)
    torch.cuda.synchronize()
    limit = 2e-5 if dtype == torch.bfloat16 else 1e-8
    assert deepgemm.calc_diff(acc.double(), expected) < limit
    assert gpu_guard.launches(ENTRY) >= 3


@pytest.mark.quick
def test_new_output_dtype_follows_c(seed: int, gpu_guard) -> None:
    a, b = bf16_layout_operands("nt", 65, 136, 72)
    c = torch.randn(65, 136, device="cuda")
    out = deepgemm.bf16_gemm_nt(a, b, c=c)
    assert out.dtype == torch.float32
    check_bf16_gemm(out, bf16_gemm_reference(a, b, "nt", c, torch.float64), "nt new out, FP32 C")
    assert deepgemm.bf16_gemm_nt(a, b).dtype == torch.bfloat16


@pytest.mark.quick
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bitwise_repeatable(layout: str, seed: int, gpu_guard) -> None:
    a, b = bf16_layout_operands(layout, 4104, 7168, 2048)
    first = FUNCTIONS[layout](a, b)
    for _ in range(3):
        assert torch.equal(FUNCTIONS[layout](a, b), first)


@pytest.mark.quick
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("c_dtype", [None, torch.bfloat16, torch.float32])
def test_chunked_epilogue_matches_the_whole_tile_store(layout: str, c_dtype: torch.dtype | None, seed: int,
                                                      gpu_guard) -> None:
    """BF16 output stores in chunks where its whole staging buffer leaves 3 stages (cost_model.store_n_for): 128 x 256
    in 64-column chunks and, where B is K-major (block_n a multiple of 16), 128 x 224 in 32-column chunks, both at 4
    stages. Both forms compute the same tile sums, so they agree bit for bit, also on partial tiles: M ends inside a
    tile, and N = 2056 leaves a last tile of 8 (256) or 40 (224) columns, whose later chunks lie wholly past N."""
    import dataclasses

    from deepgemm.kernels.sm90_bf16_gemm.cost_model import make_config
    from deepgemm.kernels.sm90_bf16_gemm.plan import bf16_problem, get_bf16_plan
    from deepgemm.kernels.sm90_bf16_gemm.spec import b_mn_major

    tiles = [(256, 64)] + ([] if b_mn_major(layout) else [(224, 32)])
    shapes = [(4097 if layout[0] == "n" else 4104, 2056, 1024)] + ([(1000, 4096, 7168)] if c_dtype is None else [])
    for (m, n, k), (block_n, store_n) in itertools.product(shapes, tiles):
        a, b = bf16_layout_operands(layout, m, n, k)
        c = None if c_dtype is None else torch.randn(m, n, device="cuda").to(c_dtype)
        chunked = make_config(bf16_problem(m, n, k, layout, torch.bfloat16, c_dtype, 132), 128, block_n)
        assert (chunked.store_n, chunked.num_stages) == (store_n, 4), chunked
        whole = dataclasses.replace(chunked, store_n=0, num_stages=3)
        outs = []
        for config in (chunked, whole):
            plan = get_bf16_plan(0, m, n, k, layout, torch.bfloat16, c_dtype, config)
            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            before = gpu_guard.launches(ENTRY)
            plan.launch(a, b, out, c)
            torch.cuda.synchronize()
            assert gpu_guard.launches(ENTRY) == before + 1
            outs.append(out)
        label = f"{layout} {m}x{n}x{k} c={c_dtype} 128x{block_n} chunked"
        check_bf16_gemm(outs[0], bf16_gemm_reference(a, b, layout, c, torch.float64), label)
        assert torch.equal(outs[0], outs[1]), f"{label}: the chunked and whole-tile stores differ"


@pytest.mark.quick
@pytest.mark.parametrize("layout", ["nt", "tt"])
def test_balanced_grid_gives_every_cta_the_same_tiles(layout: str, seed: int, gpu_guard) -> None:
    """Dense unsplit plans with K >= 1024 launch the fewest CTAs that keep the wave count (4096 x 2112 in 128 x 176
    tiles: 384 tiles, 128 CTAs of three on 132 SMs); balanced_grid=False keeps one CTA per SM. Both compute the
    same, bit for bit, and match float64."""
    import dataclasses

    from deepgemm.kernels.sm90_bf16_gemm.cost_model import make_config
    from deepgemm.kernels.sm90_bf16_gemm.plan import bf16_problem, get_bf16_plan

    m, n, k = 4096, 2112, 1024
    a, b = bf16_layout_operands(layout, m, n, k)
    outs = []
    for balanced, sms, grid in ((True, 132, 128), (False, 132, 132), (True, 100, 96)):
        config = make_config(bf16_problem(m, n, k, layout, torch.bfloat16, None, sms), 128, 176)
        assert config.balanced_grid  # the default from K = 1024
        config = dataclasses.replace(config, balanced_grid=balanced)
        plan = get_bf16_plan(0, m, n, k, layout, torch.bfloat16, None, config)
        assert plan.grid == grid
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        plan.launch(a, b, out)
        outs.append(out)
    ref = bf16_gemm_reference(a, b, layout, compute_dtype=torch.float64)
    check_bf16_gemm(outs[0], ref, f"{layout} balanced grid")
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.mark.quick
@pytest.mark.parametrize("layout", LAYOUTS)
def test_warm_calls_without_out_write_every_new_output(layout: str, seed: int, gpu_guard,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls that allocate their output launch from a table keyed on the operands (the checked path runs for the
    first call only): repeated while the earlier outputs stay alive (a new pointer each) and again into NaN-poisoned
    blocks freed back to the allocator, every output is the full GEMM and every call one kernel launch."""
    from deepgemm.api import bf16 as bf16_api

    checked: list[str] = []
    real_checked = bf16_api._bf16_gemm_checked

    def counted(call_layout: str, *args: object) -> torch.Tensor:
        checked.append(call_layout)
        return real_checked(call_layout, *args)

    monkeypatch.setattr(bf16_api, "_bf16_gemm_checked", counted)
    a, b = bf16_layout_operands(layout, 136 if layout[0] == "t" else 129, 2056, 72)  # (tn/tt: M % 8 == 0)
    ref = bf16_gemm_reference(a, b, layout, None, torch.float64)
    before = gpu_guard.launches(ENTRY)
    kept = [FUNCTIONS[layout](a, b) for _ in range(4)]
    torch.cuda.synchronize()
    assert len({out.data_ptr() for out in kept}) == 4
    for i, out in enumerate(kept):
        check_bf16_gemm(out, ref, f"{layout} live output {i}")
        out.fill_(float("nan"))
    poisoned = {out.data_ptr() for out in kept}
    del out
    kept.clear()
    again = [FUNCTIONS[layout](a, b) for _ in range(4)]
    torch.cuda.synchronize()
    assert gpu_guard.launches(ENTRY) == before + 8
    # (at most the first call: an earlier test's entry for operands at the same addresses may serve it too)
    assert len(checked) <= 1, f"warm calls without out took the checked path {len(checked)} times"
    assert poisoned & {out.data_ptr() for out in again}, "no poisoned block was handed out again"
    for i, out in enumerate(again):
        check_bf16_gemm(out, ref, f"{layout} output {i} in a freed block")


@pytest.mark.quick
def test_empty_dimensions(seed: int, gpu_guard) -> None:
    a, b = bf16_layout_operands("nt", 0, 136, 72)
    assert deepgemm.bf16_gemm_nt(a, b).shape == (0, 136)
    a, b = bf16_layout_operands("nt", 16, 136, 0)
    c = torch.randn(16, 136, device="cuda")
    assert torch.equal(deepgemm.bf16_gemm_nt(a, b, c=c), c)
    assert not deepgemm.bf16_gemm_nt(a, b).any()


@pytest.mark.quick
@pytest.mark.parametrize("layout", LAYOUTS)
def test_misaligned_rows_raise(layout: str, gpu_guard) -> None:
    m, n, k = 72, 136, 72
    if layout[0] == "t":  # A [K, M]: M % 8 != 0 breaks its 16-byte rows
        a, b = bf16_layout_operands(layout, 71, n, k)
    else:  # A [M, K]: K % 8 != 0
        a, b = bf16_layout_operands(layout, m, n, 70)
    with pytest.raises(ValueError, match="'a'"):
        FUNCTIONS[layout](a, b)
    a, b = bf16_layout_operands(layout, m, 132, k)  # N % 8 != 0
    with pytest.raises(ValueError, match="N=132"):
        FUNCTIONS[layout](a, b)


@pytest.mark.quick
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cuda_graph_replay(layout: str, seed: int, gpu_guard) -> None:
    assert_bf16_graph_replays(layout, 129 if layout[0] == "n" else 136, 2056, 1024, 2)  # A [K, M]: M % 8 == 0
    assert gpu_guard.launches(ENTRY) >= 1


@pytest.mark.quick
@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_against_float64(layout: str, seed: int, gpu_guard) -> None:
    m, n, k = 1000, 2056, 1536
    a, b = bf16_layout_operands(layout, m, n, k)
    c = torch.randn(m, n, device="cuda")
    a.requires_grad_()
    b.requires_grad_()
    c.requires_grad_()
    out = FUNCTIONS[layout](a, b, c=c)
    grad = torch.randn_like(out)
    before = gpu_guard.launches(ENTRY)
    out.backward(grad)
    assert gpu_guard.launches(ENTRY) == before + 2  # dA and dB, each one of our GEMMs
    ref_a, ref_b, ref_c = (t.detach().double().requires_grad_() for t in (a, b, c))
    bf16_gemm_reference(ref_a, ref_b, layout, ref_c, torch.float64).backward(grad.to(torch.bfloat16).double())
    for name, got, want in (("a", a.grad, ref_a.grad), ("b", b.grad, ref_b.grad), ("c", c.grad, ref_c.grad)):
        assert got.shape == want.shape, name
        assert deepgemm.calc_diff(got.double(), want) < 2e-5, name
