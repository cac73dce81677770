"""K-grouped FP8 GEMM (MoE expert Wgrad, 1D1D scales) on an sm_90 GPU against float64."""

from __future__ import annotations

import random

import pytest
import torch

import deepgemm
from deepgemm.reference import dequantize_per_token_group
from tests.helpers import assert_close_to_reference

pytestmark = pytest.mark.gpu


def operands(m: int, n: int, k_total: int, seed: int):
    """dY^T and X^T quantized along tokens, with per-row and per-token magnitudes."""
    gen = torch.Generator().manual_seed(seed)
    dy = torch.randn(m, k_total, generator=gen) * torch.exp(torch.randn(m, 1, generator=gen))
    x = torch.randn(n, k_total, generator=gen) * torch.exp(torch.randn(1, k_total, generator=gen) * 0.5)
    a = deepgemm.quantize_per_token_group(dy.cuda().bfloat16())
    b = deepgemm.quantize_per_token_group(x.cuda().bfloat16())
    return a, b


def references(a, b, ks: list[int], c: torch.Tensor | None):
    a64 = dequantize_per_token_group(a[0], a[1], 128, torch.float64)
    b64 = dequantize_per_token_group(b[0], b[1], 128, torch.float64)
    refs, abs_refs, begin = [], [], 0
    for g, k in enumerate(ks):
        seg = slice(begin, begin + k)
        ref = a64[:, seg] @ b64[:, seg].t()
        ref_abs = a64[:, seg].abs() @ b64[:, seg].abs().t()
        if c is not None:
            ref = ref + c[g].double()
            ref_abs = ref_abs + c[g].double().abs()
        refs.append(ref)
        abs_refs.append(ref_abs)
        begin += k
    return refs, abs_refs


CASES = [
    (4096, 7168, [512, 1024, 0, 384]),
    (7168, 2048, [2048, 1024]),
    (4100, 2056, [128, 640, 256, 0, 128]),
    (100, 36, [128, 0, 256]),
    (129, 7, [384]),
    (64, 4096, [0, 0, 128]),
    (1100, 2728, [256, 0, 384]),  # 18 N-blocks: bands of 8 M-blocks, the last band one M-block (kgrouped_group_rows)
]


@pytest.mark.parametrize("m,n,ks", CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("accumulate", [False, True])
def test_k_grouped_against_float64(m: int, n: int, ks: list[int], accumulate: bool) -> None:
    a, b = operands(m, n, sum(ks), seed=m + n + len(ks))
    c = torch.randn(len(ks), m, n, device="cuda") if accumulate else None
    out = torch.full((len(ks), m, n), float("nan"), device="cuda")
    result = deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, out, ks, c=c)
    assert result is out
    refs, abs_refs = references(a, b, ks, c)
    for g, k in enumerate(ks):
        if k == 0:
            expected = c[g] if c is not None else torch.zeros_like(out[g])
            assert torch.equal(out[g], expected), f"group {g} has no tokens: out must be C (or zero)"
        else:
            assert_close_to_reference(out[g], refs[g], abs_refs[g], max_diff=1e-5)
    again = torch.full_like(out, float("nan"))
    deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, again, ks, c=c)
    assert torch.equal(out, again), "two calls on the same inputs differ"


def test_k_grouped_in_place_accumulate_random_groups() -> None:
    rng = random.Random(5)
    for trial in range(3):
        groups = rng.choice([1, 8, 32])
        ks = [128 * rng.choice([0, 0, 1, 2, 5]) for _ in range(groups)]
        if sum(ks) == 0:
            ks[0] = 128
        m, n = rng.choice([(256, 512), (384, 136), (1000, 256)])
        a, b = operands(m, n, sum(ks), seed=trial)
        acc = torch.randn(groups, m, n, device="cuda")
        start = acc.clone()
        deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, acc, ks, c=acc)
        refs, abs_refs = references(a, b, ks, start)
        for g in range(groups):
            assert_close_to_reference(acc[g], refs[g], abs_refs[g], max_diff=1e-5)


def test_k_grouped_cuda_graph_replay() -> None:
    m, n, ks = 512, 384, [256, 0, 128]
    a, b = operands(m, n, sum(ks), seed=11)
    out = torch.empty(len(ks), m, n, device="cuda")
    deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, out, ks)  # warm up: compile, load, upload offsets
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, out, ks)
    fresh_a, fresh_b = operands(m, n, sum(ks), seed=12)
    for dst, src in zip((*a, *b), (*fresh_a, *fresh_b)):
        dst.copy_(src)
    out.fill_(float("nan"))
    graph.replay()
    expected = torch.empty_like(out)
    deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, expected, ks)
    assert torch.equal(out, expected)
    with pytest.raises(deepgemm.GraphCaptureError, match="warm|eagerly"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, out, [128, 128, 128])  # new ks: offsets not uploaded


def test_k_grouped_new_ks_then_side_stream() -> None:
    """Offsets uploaded on one stream are waited for, and kept alive, when another stream uses them."""
    m, n, ks = 256, 256, [128, 384, 0]
    a, b = operands(m, n, sum(ks), seed=21)
    expected = deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, torch.full((len(ks), m, n), float("nan"), device="cuda"), ks)
    fresh_ks = [256, 256, 0]  # a new ks: uploaded on the default stream, then used at once on a side stream
    side = torch.cuda.Stream()
    torch.cuda.synchronize()  # inputs ready; the side stream is NOT ordered after the upload below
    first = deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, torch.full((len(ks), m, n), float("nan"), device="cuda"), fresh_ks)
    with torch.cuda.stream(side):
        again = deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, torch.full((len(ks), m, n), float("nan"), device="cuda"), fresh_ks)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(first, again) and not torch.equal(first, expected)  # NaN-poisoned: unwritten never equal
    refs, abs_refs = references(a, b, fresh_ks, None)
    for g in (0, 1):
        assert_close_to_reference(again[g], refs[g], abs_refs[g], max_diff=1e-5)


def test_k_grouped_in_place_adds_by_reduce_add_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    """C = out with N % 4 == 0 runs the in-place build (the products added into out by TMA reduce-add, C never
    read): against float64 from the starting out, with M and N tails (4100 rows, 2056 = 16 x 128 + 8 columns),
    16-column staging chunks (N = 36, 4) and a group without tokens (its out untouched), bitwise repeatable;
    N = 7 keeps the register stores with C loaded."""
    import deepgemm.api.kgrouped as api

    planned: list[tuple[int, int, bool]] = []
    real_plan = api.get_kgrouped_plan

    def spy(device: int, m: int, n: int, c_in_place: bool = False):  # noqa: ANN202
        planned.append((m, n, c_in_place))
        return real_plan(device, m, n, c_in_place)

    monkeypatch.setattr(api, "get_kgrouped_plan", spy)
    cases = ((4100, 2056, [128, 640, 0, 256], True), (100, 36, [128, 0, 256], True), (64, 4, [128], True),
             (129, 7, [256, 0], False))
    for m, n, ks, in_place in cases:
        a, b = operands(m, n, sum(ks), seed=m + n)
        start = torch.randn(len(ks), m, n, device="cuda")
        acc = start.clone()
        deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, acc, ks, c=acc)
        torch.cuda.synchronize()
        assert planned[-1] == (m, n, in_place)
        refs, abs_refs = references(a, b, ks, start)
        for g, k in enumerate(ks):
            if k == 0:
                assert torch.equal(acc[g], start[g]), f"group {g} has no tokens: out must stay as it was"
            else:
                assert_close_to_reference(acc[g], refs[g], abs_refs[g], max_diff=1e-5)
        again = start.clone()
        deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, again, ks, c=again)
        assert torch.equal(again, acc), "two in-place calls from the same out differ"


def test_k_grouped_default_band(monkeypatch: pytest.MonkeyPatch) -> None:
    """The public call runs the raster band kgrouped_group_rows gives (bands of 8 M-blocks from 17 N-blocks on, the
    last band short, the plain order below), in place and with C loaded, against float64."""
    import deepgemm.api.kgrouped as api

    real_plan = api.get_kgrouped_plan
    planned: list[str] = []

    def spy(device: int, m: int, n: int, c_in_place: bool = False):  # noqa: ANN202
        plan = real_plan(device, m, n, c_in_place)
        planned.append(plan.spec.label())
        return plan

    monkeypatch.setattr(api, "get_kgrouped_plan", spy)
    for m, n, ks, band in ((1100, 2728, [384, 128], " g8"), (300, 2728, [256], " g3"), (1100, 2560, [256], "")):
        a, b = operands(m, n, sum(ks), seed=m + n + 7)
        start = torch.randn(len(ks), m, n, device="cuda")
        refs, abs_refs = references(a, b, ks, start)
        acc = start.clone()
        deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, acc, ks, c=acc)
        assert planned[-1].endswith(band) and (band or " g" not in planned[-1]), planned[-1]
        out = torch.full_like(start, float("nan"))
        deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, out, ks, c=start)
        for g in range(len(ks)):
            assert_close_to_reference(acc[g], refs[g], abs_refs[g], max_diff=1e-5)
            assert_close_to_reference(out[g], refs[g], abs_refs[g], max_diff=1e-5)


@pytest.mark.parametrize("store_n,in_place,group_rows,block_n", [
    (0, False, 1, 128), (16, True, 1, 128), (16, False, 1, 128), (32, True, 1, 128), (32, False, 1, 128),
    (32, True, 4, 128), (16, True, 1, 144), (32, True, 1, 160), (32, True, 4, 160), (0, False, 1, 160),
    (16, False, 1, 144), (0, False, 1, 144), (16, True, 4, 144), (32, True, 8, 160),
])
def test_k_grouped_epilogue_builds(store_n: int, in_place: bool, group_rows: int, block_n: int,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every build dev/kgrouped_fp8_epilogue_ab.py times, forced through the public call: register stores at
    N % 4 == 0 (C loaded from out), 16- and 32-column TMA chunks with C loaded or added in place, a banded tile order
    (4 M-blocks, the last band shorter), 144- and 160-column tiles (scale products after the wait); each against
    float64 from the starting out, with M and N tails and a group without tokens."""
    import deepgemm.api.kgrouped as api

    real_plan = api.get_kgrouped_plan
    planned: list[str] = []

    def forced(device: int, m: int, n: int, c_in_place: bool = False):  # noqa: ANN202
        plan = real_plan(device, m, n, c_in_place, store_n, group_rows, block_n)
        planned.append(plan.spec.label())
        return plan

    monkeypatch.setattr(api, "get_kgrouped_plan", forced)
    monkeypatch.setattr(api, "tma_stores", lambda n: in_place)  # the API's in-place choice, forced
    # N tails whose last chunk is clipped: 2080 = 16 x 128 + 32 (the 16- and 32-column chunks of 128-wide tiles),
    # 2088 = 14 x 144 + 72 (16-column chunks), 2120 = 13 x 160 + 40 (32-column chunks)
    m, ks = 1100, [256, 0, 640]
    n = {144: 2088, 160: 2120}.get(block_n, 2080)
    a, b = operands(m, n, sum(ks), seed=store_n + in_place + group_rows + block_n)
    start = torch.randn(len(ks), m, n, device="cuda")
    acc = start.clone()
    deepgemm.k_grouped_fp8_gemm_tn_contiguous(a, b, acc, ks, c=acc)
    assert (" c=out" in planned[-1]) == in_place and (f" store{store_n}" in planned[-1]) == (store_n > 0)
    assert (f" g{group_rows}" in planned[-1]) == (group_rows > 1)
    assert f" bn{block_n} " in planned[-1]
    refs, abs_refs = references(a, b, ks, start)
    for g, k in enumerate(ks):
        if k == 0:
            assert torch.equal(acc[g], start[g])
        else:
            assert_close_to_reference(acc[g], refs[g], abs_refs[g], max_diff=1e-5)
