"""MoE grouped BF16 GEMMs on the H200 against float64 computed on the GPU: M-grouped contiguous (m_indices and psum
forms, ragged experts incl. an empty one and one of exactly 128 rows) and masked (counts 0, 1, 63, 64, 65, max_m,
BF16 and FP32 out), k-grouped (4 and 8 groups, empty and 128-token groups, with and without C, C as out, M = 136:
the 3-D store clips each group's tail block, so the next group and the memory past `out` are never written).
NaN-poisoned outputs, bitwise repeats, CUDA-graph replay with new grouping values. Every test asserts our kernel ran
(and the autouse gpu_guard fails any reference-path call on CUDA tensors)."""

from __future__ import annotations

import pytest
import torch

import deepgemm
from deepgemm.api import bf16_grouped as api
from deepgemm.kernels.common.device import sm_count
from deepgemm.kernels.common.kind import GemmKind
from deepgemm.kernels.sm90_bf16_gemm.plan import Bf16Geometry, grouped_spec

pytestmark = pytest.mark.gpu

ENTRY = "deepgemm_bf16_gemm"
BF16, FP32 = torch.bfloat16, torch.float32
ALIGN = 128  # rows each expert's segment is padded to (contiguous layout)
MASKED_BLOCK = 64  # rows of a masked output block: blocks entirely past masked_m[g] stay untouched
NAN = float("nan")

contiguous = deepgemm.m_grouped_bf16_gemm_nt_contiguous
contiguous_psum = deepgemm.m_grouped_bf16_gemm_nt_contiguous_psum
masked = deepgemm.m_grouped_bf16_gemm_nt_masked
k_grouped = deepgemm.k_grouped_bf16_gemm_tn_contiguous


def bf16(*shape: int) -> torch.Tensor:
    """Fresh BF16 values on the GPU (global generator: the `seed` fixture seeds and prints it)."""
    return torch.randn(shape, device="cuda").to(BF16)


def nan_out(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.full(shape, NAN, dtype=dtype, device="cuda")


def limit_for(dtype: torch.dtype) -> float:
    return 2e-5 if dtype == BF16 else 1e-8


def check(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """No NaN left (every element written) and calc_diff against float64 below the dense BF16 tests' limits."""
    assert out.shape == ref.shape, what
    assert not out.isnan().any(), f"{what}: NaN left in the output (an element was never written)"
    diff = deepgemm.calc_diff(out.double(), ref)
    limit = limit_for(out.dtype)
    assert diff < limit, f"{what}: calc_diff {diff:.3e} >= {limit:g}"


def padded(count: int) -> int:
    return -(-count // ALIGN) * ALIGN


def contiguous_layout(counts: list[int]) -> torch.Tensor:
    """int32 m_indices on the GPU: expert g's counts[g] rows, each segment padded to 128 rows with -1."""
    indices: list[int] = []
    for group, count in enumerate(counts):
        indices += [group] * count + [-1] * (padded(count) - count)
    return torch.tensor(indices, dtype=torch.int32, device="cuda")


def psum_of(counts: list[int]) -> torch.Tensor:
    ends, start = [], 0
    for count in counts:
        ends.append(start + count)
        start += padded(count)
    return torch.tensor(ends, dtype=torch.int32, device="cuda")


def tile(kind: GemmKind, geometry: Bf16Geometry, n: int, k: int, out_dtype: torch.dtype,
         c_dtype: torch.dtype | None = None, expected_m: int = 0) -> str:
    """The config the API plans for this launch on this GPU (for failure messages and coverage checks)."""
    return grouped_spec(kind, geometry, n, k, out_dtype, c_dtype, expected_m, sm_count(0)).config.label()


# ---------------------------------------------------------------- float64 yardsticks (on the GPU)


def contiguous_float64(a: torch.Tensor, b: torch.Tensor, m_indices: torch.Tensor) -> torch.Tensor:
    ref = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64, device="cuda")
    for g in range(b.shape[0]):
        rows = (m_indices == g).nonzero().flatten()
        if rows.numel():
            ref[rows] = a[rows].double() @ b[g].double().t()
    return ref


def masked_float64(a: torch.Tensor, b: torch.Tensor, g: int, count: int) -> torch.Tensor:
    return a[g, :count].double() @ b[g].double().t()


def k_grouped_float64(a: torch.Tensor, b: torch.Tensor, ks: list[int], c: torch.Tensor | None) -> torch.Tensor:
    ref = torch.zeros(len(ks), a.shape[1], b.shape[1], dtype=torch.float64, device="cuda")
    begin = 0
    for g, k in enumerate(ks):
        if k:
            ref[g] = a[begin:begin + k].double().t() @ b[begin:begin + k].double()
        begin += k
    return ref if c is None else ref + c.double()


# ---------------------------------------------------------------- contiguous (m_indices and psum)

# Ragged experts: one of 517 rows (a partial last block), an empty one, one of exactly 128 rows, one of 1000.
COUNTS = [517, 0, 128, 1000]


def check_contiguous(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, m_indices: torch.Tensor, what: str) -> None:
    valid = m_indices >= 0
    assert (out[~valid] == 0).all(), f"{what}: padding rows must be written as zeros"
    ref = contiguous_float64(a, b, m_indices)
    for g in range(b.shape[0]):
        rows = m_indices == g
        if rows.any():
            check(out[rows], ref[rows], f"{what} expert {g} ({int(rows.sum())} rows)")


@pytest.mark.parametrize("out_dtype", [BF16, FP32])
@pytest.mark.parametrize("n,k", [
    pytest.param(4096, 7168, marks=pytest.mark.quick),
    (7168, 2048),
    pytest.param(136, 72, marks=pytest.mark.quick),
])
def test_contiguous_against_float64_and_psum_bitwise(n: int, k: int, out_dtype: torch.dtype, seed: int,
                                                     gpu_guard) -> None:
    m_indices = contiguous_layout(COUNTS)
    m_total = m_indices.numel()
    a, b = bf16(m_total, k), bf16(len(COUNTS), n, k)
    a[m_indices < 0] = NAN  # padding rows of A must reach no output (blocks that mix rows and padding compute them)
    out = nan_out(m_total, n, dtype=out_dtype)
    what = f"contiguous n={n} k={k} out={out_dtype} " + tile(GemmKind.GROUPED_CONTIGUOUS,
                                                              Bf16Geometry(m_total, len(COUNTS)), n, k, out_dtype)
    before = gpu_guard.launches(ENTRY)
    assert contiguous(a, b, out, m_indices) is out
    by_psum = nan_out(m_total, n, dtype=out_dtype)
    assert contiguous_psum(a, b, by_psum, psum_of(COUNTS)) is by_psum
    torch.cuda.synchronize()
    assert gpu_guard.launches(ENTRY) == before + 2
    check_contiguous(out, a, b, m_indices, what)
    assert torch.equal(by_psum, out), f"{what}: the psum form differs from the m_indices form"


def test_contiguous_many_experts_at_block_boundaries(seed: int, gpu_guard) -> None:
    """Experts of 1, 63, 64, 65, 127, 128, 129, 255, 256 rows and empty ones between: every kind of tail of 64- and
    128-row tiles; an N tail and a K tail."""
    counts = [1, 0, 63, 64, 65, 127, 0, 128, 129, 255, 256, 0]
    n, k = 2056, 1096
    m_indices = contiguous_layout(counts)
    a, b = bf16(m_indices.numel(), k), bf16(len(counts), n, k)
    a[m_indices < 0] = NAN
    for out_dtype in (BF16, FP32):
        out = nan_out(m_indices.numel(), n, dtype=out_dtype)
        contiguous(a, b, out, m_indices)
        by_psum = nan_out(m_indices.numel(), n, dtype=out_dtype)
        contiguous_psum(a, b, by_psum, psum_of(counts))
        torch.cuda.synchronize()
        check_contiguous(out, a, b, m_indices, f"many experts out={out_dtype}")
        assert torch.equal(by_psum, out)
    assert gpu_guard.launches(ENTRY) >= 4


@pytest.mark.quick
def test_contiguous_psum_graph_replay_with_new_ends(seed: int, gpu_guard) -> None:
    """psum is read on the GPU: a captured launch replays with new ends (same M_total), matching the m_indices form."""
    layouts = [[517, 0, 128, 1000], [0, 1000, 517, 128], [128, 128, 128, 1400], [1, 1, 1, 1]]
    m_total = 1792
    assert all(sum(padded(c) for c in counts) <= m_total for counts in layouts)
    n, k = 4096, 2048
    a, b = bf16(m_total, k), bf16(4, n, k)
    psum = psum_of(layouts[0])
    out = torch.empty(m_total, n, dtype=BF16, device="cuda")
    contiguous_psum(a, b, out, psum)  # warm: compiled, loaded and launch-ready before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        contiguous_psum(a, b, out, psum)
    before = gpu_guard.launches(ENTRY)
    for counts in layouts:
        psum.copy_(psum_of(counts))
        out.fill_(NAN)
        graph.replay()
        m_indices = contiguous_layout(counts)
        m_indices = torch.cat([m_indices, torch.full((m_total - m_indices.numel(),), -1, dtype=torch.int32,
                                                     device="cuda")])
        expected = nan_out(m_total, n)
        contiguous(a, b, expected, m_indices)
        torch.cuda.synchronize()
        assert torch.equal(out, expected), f"replay with psum of {counts} differs from the m_indices form"
        check_contiguous(out, a, b, m_indices, f"psum replay {counts}")
    assert gpu_guard.launches(ENTRY) >= before + len(layouts)  # the eager m_indices calls (replays are not counted)


@pytest.mark.quick
@pytest.mark.parametrize("rows,n,k", [(128, 256, 7168), (64, 2112, 7168), (1, 512, 4096)])
def test_one_expert_at_decode_sizes(rows: int, n: int, k: int, seed: int, gpu_guard) -> None:
    """One expert with decode-sized rows: the planner took such a launch for a dense decode GEMM and picked a
    split-K tile, which the grouped kernels do not have (every call raised ValueError). Contiguous, psum and masked
    forms against float64."""
    count = min(rows, MASKED_BLOCK)  # the masked launch: one expert of max_m 64 holding `count` rows
    for kind, geometry, expected_m in ((GemmKind.GROUPED_CONTIGUOUS, Bf16Geometry(padded(rows), 1), 0),
                                       (GemmKind.GROUPED_MASKED, Bf16Geometry(MASKED_BLOCK, 1, MASKED_BLOCK),
                                        api._masked_bucket(count, MASKED_BLOCK))):
        assert not grouped_spec(kind, geometry, n, k, BF16, None, expected_m, sm_count(0)).config.split_k
    m_indices = contiguous_layout([rows])
    a, b = bf16(m_indices.numel(), k), bf16(1, n, k)
    before = gpu_guard.launches(ENTRY)
    out = nan_out(m_indices.numel(), n)
    contiguous(a, b, out, m_indices)
    by_psum = nan_out(m_indices.numel(), n)
    contiguous_psum(a, b, by_psum, psum_of([rows]))
    am = bf16(1, MASKED_BLOCK, k)
    out_masked = nan_out(1, am.shape[1], n)
    masked(am, b, out_masked, torch.tensor([count], dtype=torch.int32, device="cuda"), expected_m=count)
    torch.cuda.synchronize()
    assert gpu_guard.launches(ENTRY) == before + 3
    check_contiguous(out, a, b, m_indices, f"one expert of {rows} rows n={n} k={k}")
    assert torch.equal(by_psum, out)
    check_masked(out_masked, am, b, [count], f"one masked expert of {count} rows n={n} k={k}")


# ---------------------------------------------------------------- masked

MAX_M = 256
MASKED_COUNTS = [0, 1, 63, 64, 65, MAX_M]


def check_masked(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, counts: list[int], what: str) -> None:
    """Rows below each count against float64; rows in 64-row blocks entirely past it still NaN (untouched). Rows
    past the count inside its last block are unspecified and not read."""
    for g, count in enumerate(counts):
        if count:
            check(out[g, :count], masked_float64(a, b, g, count), f"{what} group {g} ({count} rows)")
        untouched_from = -(-count // MASKED_BLOCK) * MASKED_BLOCK
        assert out[g, untouched_from:].isnan().all(), \
            f"{what} group {g}: rows in blocks past masked_m={count} must stay untouched"


@pytest.mark.parametrize("out_dtype", [BF16, FP32])
@pytest.mark.parametrize("n,k", [
    pytest.param(4096, 7168, marks=pytest.mark.quick),
    (7168, 2048),
    pytest.param(136, 72, marks=pytest.mark.quick),
])
def test_masked_against_float64_leaves_blocks_past_the_count(n: int, k: int, out_dtype: torch.dtype, seed: int,
                                                             gpu_guard) -> None:
    groups = len(MASKED_COUNTS)
    a, b = bf16(groups, MAX_M, k), bf16(groups, n, k)
    for g, count in enumerate(MASKED_COUNTS):
        a[g, count:] = NAN  # rows past the count reach no row below it
    masked_m = torch.tensor(MASKED_COUNTS, dtype=torch.int32, device="cuda")
    out = nan_out(groups, MAX_M, n, dtype=out_dtype)
    what = f"masked n={n} k={k} out={out_dtype} " + tile(GemmKind.GROUPED_MASKED, Bf16Geometry(groups * MAX_M, groups,
                                                                                               MAX_M), n, k, out_dtype,
                                                          None, 64)
    before = gpu_guard.launches(ENTRY)
    assert masked(a, b, out, masked_m, expected_m=64) is out
    torch.cuda.synchronize()
    assert gpu_guard.launches(ENTRY) == before + 1
    check_masked(out, a, b, MASKED_COUNTS, what)


def test_masked_every_tile_the_hint_picks(seed: int, gpu_guard) -> None:
    """expected_m from decode-sized to max_m picks 64- and 128-row tiles; each is right for every count."""
    groups, n, k = len(MASKED_COUNTS), 2048, 1024
    geometry = Bf16Geometry(groups * MAX_M, groups, MAX_M)
    hints = (1, 16, 64, 128, 256)
    tiles = {e: tile(GemmKind.GROUPED_MASKED, geometry, n, k, BF16, None, api._masked_bucket(e, MAX_M)) for e in hints}
    assert {label.split()[0] for label in tiles.values()} == {"bm64", "bm128"}, tiles
    a, b = bf16(groups, MAX_M, k), bf16(groups, n, k)
    masked_m = torch.tensor(MASKED_COUNTS, dtype=torch.int32, device="cuda")
    for expected_m in hints:
        out = nan_out(groups, MAX_M, n)
        masked(a, b, out, masked_m, expected_m)
        torch.cuda.synchronize()
        check_masked(out, a, b, MASKED_COUNTS, f"expected_m={expected_m} {tiles[expected_m]}")
    assert gpu_guard.launches(ENTRY) >= len(hints)


@pytest.mark.quick
@pytest.mark.parametrize("out_dtype", [BF16, FP32])
def test_masked_graph_replay_with_new_counts(out_dtype: torch.dtype, seed: int, gpu_guard) -> None:
    groups, n, k = len(MASKED_COUNTS), 4096, 7168
    a, b = bf16(groups, MAX_M, k), bf16(groups, n, k)
    masked_m = torch.tensor(MASKED_COUNTS, dtype=torch.int32, device="cuda")
    out = torch.empty(groups, MAX_M, n, dtype=out_dtype, device="cuda")
    masked(a, b, out, masked_m, expected_m=64)  # warm
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        masked(a, b, out, masked_m, expected_m=64)
    for counts in (MASKED_COUNTS, [MAX_M, 65, 64, 63, 1, 0], [17, 0, 200, 128, 129, 3], [0] * groups):
        masked_m.copy_(torch.tensor(counts, dtype=torch.int32))
        out.fill_(NAN)
        graph.replay()
        torch.cuda.synchronize()
        check_masked(out, a, b, counts, f"graph replay {counts}")
    masked_m.copy_(torch.tensor(MASKED_COUNTS, dtype=torch.int32))
    a.copy_(bf16(groups, MAX_M, k))
    out.fill_(NAN)
    graph.replay()
    torch.cuda.synchronize()
    check_masked(out, a, b, MASKED_COUNTS, "replay after new A")
    assert gpu_guard.launches(ENTRY) >= 2  # the warm-up and the captured launch (replays are not counted)


# ---------------------------------------------------------------- k-grouped

KS_4 = [1024, 0, 128, 384]
KS_8 = [0, 128, 256, 0, 640, 128, 384, 1152]


@pytest.mark.parametrize("c_form", ["none", "c", "c_is_out"])
@pytest.mark.parametrize("ks", [pytest.param(KS_4, id="4groups"), pytest.param(KS_8, id="8groups")])
@pytest.mark.parametrize("m,n", [
    pytest.param(4096, 7168, marks=pytest.mark.quick),
    (7168, 4096),
    pytest.param(136, 136, marks=pytest.mark.quick),
    (8, 4096),
    (4096, 8),
    (136, 8),
])
def test_k_grouped_against_float64(m: int, n: int, ks: list[int], c_form: str, seed: int, gpu_guard) -> None:
    a, b = bf16(sum(ks), m), bf16(sum(ks), n)
    c_dtype = None if c_form == "none" else FP32
    what = f"k-grouped M={m} N={n} ks={ks} {c_form} " + tile(GemmKind.K_GROUPED, Bf16Geometry(m, len(ks)), n, 0, FP32,
                                                            c_dtype)
    out = torch.full((len(ks), m, n), NAN, device="cuda")
    c = None
    if c_form == "c":
        c = torch.randn(len(ks), m, n, device="cuda")
    elif c_form == "c_is_out":
        out.normal_()
        c = out
    start = None if c is None else c.clone()
    before = gpu_guard.launches(ENTRY)
    assert k_grouped(a, b, out, ks, c) is out
    torch.cuda.synchronize()
    assert gpu_guard.launches(ENTRY) == before + 1
    ref = k_grouped_float64(a, b, ks, start)
    for g, k in enumerate(ks):
        if k == 0:
            expected = start[g] if start is not None else torch.zeros_like(out[g])
            assert torch.equal(out[g], expected), f"{what}: group {g} has no tokens: out must be C (or zeros)"
        else:
            check(out[g], ref[g], f"{what} group {g} ({k} tokens)")


@pytest.mark.quick
@pytest.mark.parametrize("n", [136, 7168])  # 64- and 128-row tiles on 132 SMs
@pytest.mark.parametrize("with_c", [False, True])
def test_k_grouped_tail_block_does_not_clobber_the_next_group(n: int, with_c: bool, seed: int, gpu_guard) -> None:
    """M = 136: each group's last M-block holds 8 rows of a 64-row store box (block_m 64; with block_m 128 the second
    warpgroup has no rows at all). Groups alternate long K ranges and none,
    so an empty group's tile stores its zeros (or C) long before the previous group's tail tile stores: a box that
    crossed into the next group's rows (a 2-D store) would overwrite them last."""
    m, ks = 136, [2048, 0] * 4
    geometry = Bf16Geometry(m, len(ks))
    label = tile(GemmKind.K_GROUPED, geometry, n, 0, FP32, FP32 if with_c else None)
    a, b = bf16(sum(ks), m), bf16(sum(ks), n)
    c = torch.randn(len(ks), m, n, device="cuda") if with_c else None
    ref = k_grouped_float64(a, b, ks, c)
    for repeat in range(3):
        out = torch.full((len(ks), m, n), NAN, device="cuda")
        k_grouped(a, b, out, ks, c)
        torch.cuda.synchronize()
        for g, k in enumerate(ks):
            if k:
                check(out[g], ref[g], f"{label} group {g} (repeat {repeat})")
            else:
                expected = c[g] if c is not None else torch.zeros(m, n, device="cuda")
                clobbered = (out[g] != expected).any(dim=1).nonzero().flatten().tolist()
                assert not clobbered, (f"{label}: group {g} (no tokens) rows {clobbered[:8]}... were overwritten, "
                                       f"by group {g - 1}'s tail block?")
    assert gpu_guard.launches(ENTRY) == 3


@pytest.mark.quick
@pytest.mark.parametrize("n", [136, 7168])  # 64- and 128-row tiles on 132 SMs
def test_k_grouped_m136_writes_nothing_outside_out(n: int, seed: int, gpu_guard) -> None:
    """8 groups of M = 136 inside a NaN buffer with 64 rows of margin on both sides: the last group's tail block must
    not store past the end of `out` (nor anything before it), and every element of `out` is written."""
    m, ks = 136, KS_8
    groups, margin = len(ks), 64 * n
    storage = torch.full((margin + groups * m * n + margin,), NAN, device="cuda")
    out = storage[margin:margin + groups * m * n].view(groups, m, n)
    assert out.data_ptr() % 16 == 0
    a, b = bf16(sum(ks), m), bf16(sum(ks), n)
    k_grouped(a, b, out, ks)
    torch.cuda.synchronize()
    assert storage[:margin].isnan().all(), "written before out"
    written_after = (~storage[margin + groups * m * n:].isnan()).nonzero()
    assert written_after.numel() == 0, f"written past the end of out: {written_after.numel()} elements"
    ref = k_grouped_float64(a, b, ks, None)
    for g, k in enumerate(ks):
        if k:
            check(out[g], ref[g], f"group {g}")
        else:
            assert (out[g] == 0).all()
    assert gpu_guard.launches(ENTRY) == 1


@pytest.mark.quick
@pytest.mark.parametrize("m,n", [(4096, 4096), (136, 7168), (7168, 136)])
def test_k_grouped_in_place_matches_a_loaded_c_bitwise(m: int, n: int, seed: int, gpu_guard) -> None:
    """c = out adds each tile into out with TMA reduce-add stores; a separate C is loaded and added in registers.
    Both round acc + C once per element on the same tile, so they agree bitwise (and wide FP32 tiles run with the
    chunked epilogue at 4096 x 4096)."""
    ks = [1024, 0, 128, 384]
    spec = grouped_spec(GemmKind.K_GROUPED, Bf16Geometry(m, len(ks)), n, 0, FP32, FP32, 0, sm_count(0), True)
    if (m, n) == (4096, 4096):
        assert spec.config.block_n == 256 and spec.config.store_n == 32, spec.label()
    a, b = bf16(sum(ks), m), bf16(sum(ks), n)
    c0 = torch.randn(len(ks), m, n, device="cuda")
    in_place = c0.clone()
    loaded = torch.full_like(c0, NAN)
    before = gpu_guard.launches(ENTRY)
    k_grouped(a, b, in_place, ks, c=in_place)
    k_grouped(a, b, loaded, ks, c=c0)
    torch.cuda.synchronize()
    assert gpu_guard.launches(ENTRY) == before + 2
    assert torch.equal(in_place, loaded), f"{spec.label()}: in-place and loaded C differ"
    ref = k_grouped_float64(a, b, ks, c0)
    for g in range(len(ks)):
        check(in_place[g], ref[g], f"{spec.label()} group {g}")


@pytest.mark.quick
def test_k_grouped_cuda_graph_replay(seed: int, gpu_guard) -> None:
    m, n, ks = 4096, 7168, KS_4
    a, b = bf16(sum(ks), m), bf16(sum(ks), n)
    out = torch.empty(len(ks), m, n, device="cuda")
    acc = torch.zeros(len(ks), m, n, device="cuda")
    k_grouped(a, b, out, ks)  # warm up: compiled, loaded, offsets uploaded for this ks
    k_grouped(a, b, acc, ks, c=acc)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        k_grouped(a, b, out, ks)
        k_grouped(a, b, acc, ks, c=acc)
    for _ in range(2):
        a.copy_(bf16(sum(ks), m))
        b.copy_(bf16(sum(ks), n))
        out.fill_(NAN)
        start = acc.clone()
        graph.replay()
        expected = torch.full_like(out, NAN)
        k_grouped(a, b, expected, ks)
        torch.cuda.synchronize()
        assert torch.equal(out, expected), "the replay differs from an eager call"
        ref = k_grouped_float64(a, b, ks, None)
        for g, k in enumerate(ks):
            if k:
                check(out[g], ref[g], f"replay group {g}")
                check(acc[g], ref[g] + start[g].double(), f"replayed accumulation group {g}")
            else:
                assert (out[g] == 0).all() and torch.equal(acc[g], start[g])
    with pytest.raises(deepgemm.GraphCaptureError, match="ks|warm|eager"), torch.cuda.graph(torch.cuda.CUDAGraph()):
        k_grouped(a, b, out, [384, 0, 1024, 128])  # new ks: offsets not uploaded yet
    assert gpu_guard.launches(ENTRY) >= 4


# ---------------------------------------------------------------- every form: repeatable, nothing written outside


@pytest.mark.quick
def test_bitwise_repeatable(seed: int, gpu_guard) -> None:
    m_indices = contiguous_layout(COUNTS)
    a, b = bf16(m_indices.numel(), 7168), bf16(len(COUNTS), 4096, 7168)
    first = contiguous(a, b, nan_out(m_indices.numel(), 4096), m_indices)
    assert torch.equal(contiguous(a, b, nan_out(m_indices.numel(), 4096), m_indices), first)
    am = bf16(len(MASKED_COUNTS), MAX_M, 2048)
    bm = bf16(len(MASKED_COUNTS), 7168, 2048)
    masked_m = torch.tensor(MASKED_COUNTS, dtype=torch.int32, device="cuda")
    first = masked(am, bm, torch.zeros(len(MASKED_COUNTS), MAX_M, 7168, dtype=BF16, device="cuda"), masked_m, 64)
    again = masked(am, bm, torch.zeros(len(MASKED_COUNTS), MAX_M, 7168, dtype=BF16, device="cuda"), masked_m, 64)
    assert torch.equal(first, again)
    ka, kb = bf16(sum(KS_8), 4096), bf16(sum(KS_8), 7168)
    first = k_grouped(ka, kb, torch.empty(len(KS_8), 4096, 7168, device="cuda"), KS_8)
    for _ in range(2):
        assert torch.equal(k_grouped(ka, kb, torch.full_like(first, NAN), KS_8), first)
    assert gpu_guard.launches(ENTRY) == 7


@pytest.mark.quick
def test_m_grouped_strided_out_keeps_its_padding_columns(seed: int, gpu_guard) -> None:
    """Contiguous and masked outputs given as views of wider buffers (rows 16-byte apart, N = 136: an N tail): the
    columns past N stay untouched."""
    n, width, k = 136, 144, 72
    m_indices = contiguous_layout(COUNTS)
    a, b = bf16(m_indices.numel(), k), bf16(len(COUNTS), n, k)
    storage = nan_out(m_indices.numel(), width)
    out = storage[:, :n]
    contiguous(a, b, out, m_indices)
    groups = len(MASKED_COUNTS)
    am, bm = bf16(groups, MAX_M, k), bf16(groups, n, k)
    masked_storage = nan_out(groups, MAX_M, width, dtype=FP32)
    masked_out = masked_storage[:, :, :n]
    masked(am, bm, masked_out, torch.tensor(MASKED_COUNTS, dtype=torch.int32, device="cuda"), 64)
    torch.cuda.synchronize()
    assert storage[:, n:].isnan().all() and masked_storage[:, :, n:].isnan().all()
    check_contiguous(out, a, b, m_indices, "strided contiguous out")
    check_masked(masked_out, am, bm, MASKED_COUNTS, "strided masked out")
    assert gpu_guard.launches(ENTRY) == 2


@pytest.mark.quick
def test_device_rules_on_cuda(seed: int, gpu_guard) -> None:
    """Grouping tensors on the host next to CUDA operands, and ks as a CUDA tensor, are refused naming them."""
    a, b = bf16(128, 64), bf16(1, 32, 64)
    with pytest.raises(ValueError, match="'m_indices' is on cpu"):
        contiguous(a, b, nan_out(128, 32), torch.zeros(128, dtype=torch.int32))
    with pytest.raises(ValueError, match="'masked_m' is on cpu"):
        masked(a.view(1, 128, 64), b, nan_out(1, 128, 32), torch.zeros(1, dtype=torch.int32), 8)
    with pytest.raises(TypeError, match="'ks'"):
        k_grouped(bf16(128, 16), bf16(128, 8), torch.empty(1, 16, 8, device="cuda"),
                  torch.tensor([128], device="cuda"))
    assert gpu_guard.launches(ENTRY) == 0
