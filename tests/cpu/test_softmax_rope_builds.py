"""Real sm_90a compile-only builds (NVRTC, no GPU) of the softmax (forward, backward) and RoPE kernels: each variant
class the launchers can pick compiles without spills or stack frame, within one CTA's registers, and waits for the
previous grid before touching global memory (PDL). Plus the host rules that pick the variants: softmax_shape and
lanes_per_row."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from deepgemm.jit import compile_kernel
from deepgemm.jit.compiler import KernelSource
from deepgemm.kernels.common.elements import vector_elements
from deepgemm.kernels.rope.launch import THREADS as ROPE_THREADS
from deepgemm.kernels.rope.launch import lanes_per_row, rope_source
from deepgemm.kernels.softmax.launch import (
    CACHED_WORDS,
    CACHED_WORDS_1024,
    MAX_CLUSTER_CTAS,
    MAX_ITEMS,
    MAX_THREADS_PER_ROW,
    SoftmaxShape,
    backward_source,
    forward_source,
    softmax_shape,
)
from tests.cpu.test_kernel_builds import assert_waits_for_previous_grid
from tests.helpers import assert_clean_build, build_in_isolated_cache

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

# (id, dtype, n, vectorized, causal[, rows]): forward builds; every shape class of softmax_shape (1 thread a row up to 1024,
# one CTA, a cluster of CTAs, streaming; scalar and 16-byte vectors), bf16 and fp32.
FORWARD = [
    ("fwd_bf16_n1_scalar", BF16, 1, False, False),
    ("fwd_bf16_n8_vec_causal", BF16, 8, True, True),
    ("fwd_fp32_n100_scalar_causal", FP32, 100, False, True),
    ("fwd_bf16_n4096_vec", BF16, 4096, True, False),
    ("fwd_bf16_n32768_vec", BF16, 32768, True, False),              # the longest row one CTA holds: 1024 x 4 x 8
    ("fwd_fp32_n8192_scalar", FP32, 8192, False, False),            # the longest scalar one: 1024 x 8
    ("fwd_bf16_n40000_vec_cluster", BF16, 40000, True, False),      # a cluster of 2
    ("fwd_fp32_n131072_vec_causal_cluster", FP32, 131072, True, True),  # a cluster of 8, full
    ("fwd_bf16_n300000_vec_streaming", BF16, 300000, True, False),
    ("fwd_bf16_n100000_scalar_streaming", BF16, 100000, False, False),
    ("fwd_bf16_n40000_vec_streaming_1000_rows", BF16, 40000, True, False, 1000),  # rows fill the SMs: one CTA a row
]
# (id, dtype, n, vectorized): backward builds.
BACKWARD = [
    ("bwd_fp32_n1_scalar", FP32, 1, False),
    ("bwd_fp32_n100_scalar", FP32, 100, False),
    ("bwd_bf16_n4096_vec", BF16, 4096, True),
    ("bwd_bf16_n8192_scalar", BF16, 8192, False),
    ("bwd_bf16_n32768_vec_cluster", BF16, 32768, True),
    ("bwd_fp32_n300000_vec_streaming", FP32, 300000, True),
]
# (id, dtype, cache dtype, interleaved, vectorized, int64 positions, rotary_dim): lanes from lanes_per_row.
ROPE = [
    ("rope_bf16_fp32cache_neox_vec_pos64_r128", BF16, FP32, False, True, True, 128),
    ("rope_bf16_bf16cache_inter_vec_pos32_r64", BF16, BF16, True, True, False, 64),
    ("rope_fp16_fp32cache_inter_scalar_pos64_r32", FP16, FP32, True, False, True, 32),
    ("rope_fp16_fp16cache_neox_vec_pos32_r64", FP16, FP16, False, True, False, 64),
    ("rope_fp32_fp32cache_neox_vec_pos32_r128", FP32, FP32, False, True, False, 128),
    ("rope_fp32_fp32cache_inter_scalar_pos64_r128", FP32, FP32, True, False, True, 128),
    ("rope_bf16_bf16cache_neox_scalar_pos32_r2", BF16, BF16, False, False, False, 2),
]


@dataclasses.dataclass
class Build:
    name: str
    source: KernelSource
    threads: int
    resources: object
    log: str
    cubin: Path


def _sources() -> list[tuple[str, KernelSource, int]]:
    out: list[tuple[str, KernelSource, int]] = []
    for name, dtype, n, vectorized, causal, *rows in FORWARD:
        shape = softmax_shape(n, dtype, vectorized, rows=rows[0] if rows else 1)
        out.append((name, forward_source(dtype, shape, causal), shape.cta_threads))
    for name, dtype, n, vectorized in BACKWARD:
        shape = softmax_shape(n, dtype, vectorized, backward=True)
        out.append((name, backward_source(dtype, shape), shape.cta_threads))
    for name, dtype, cache_dtype, interleaved, vectorized, pos64, rotary in ROPE:
        lanes = lanes_per_row(rotary, vector_elements(dtype) if vectorized else 1)
        out.append((name, rope_source(dtype, cache_dtype, interleaved, vectorized, pos64, lanes), ROPE_THREADS))
    return out


def _build(item: tuple[str, KernelSource, int]) -> Build:
    name, source, threads = item
    compiled = compile_kernel(source)
    return Build(name, source, threads, compiled.resources, compiled.log, Path(compiled.cubin_path))


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Build]:
    results = build_in_isolated_cache(tmp_path_factory, _build, _sources())
    return {b.name: b for b in results}


ALL_IDS = [r[0] for r in FORWARD] + [r[0] for r in BACKWARD] + [r[0] for r in ROPE]


def test_build_list_is_modest_and_covers_the_variant_classes() -> None:
    """At most 24 builds; among them one-CTA, cluster and streaming rows of both directions, scalar and vector paths,
    causal, every RoPE dtype, both cache kinds, both layouts and both position widths."""
    assert len(ALL_IDS) == len(set(ALL_IDS)) <= 24
    for shapes in ([softmax_shape(n, d, v, rows=r[0] if r else 1) for _, d, n, v, _, *r in FORWARD],
                   [softmax_shape(n, d, v, backward=True) for _, d, n, v in BACKWARD]):
        assert {s.streaming for s in shapes} == {True, False} and {s.vector > 1 for s in shapes} == {True, False}
        assert any(s.cluster > 1 and not s.streaming for s in shapes), "no cached cluster row"
        assert any(s.cluster == 1 and s.threads_per_row == MAX_THREADS_PER_ROW for s in shapes)
        assert any(s.threads_per_row < 32 for s in shapes)
    assert {r[4] for r in FORWARD} == {True, False}
    assert {r[1] for r in ROPE} == {BF16, FP16, FP32} and {r[3] for r in ROPE} == {True, False}
    assert {r[4] for r in ROPE} == {True, False} and {r[5] for r in ROPE} == {True, False}
    assert any(r[1] == r[2] != FP32 for r in ROPE) and any(r[1] != r[2] == FP32 for r in ROPE)


@pytest.mark.parametrize("name", ALL_IDS)
def test_no_spills_no_stack(builds: dict[str, Build], name: str) -> None:
    """ptxas reports no spill, no stack frame, and registers x the CTA's threads within one SM's register file."""
    b = builds[name]
    assert "Compiling entry function" in b.log
    assert f"'{b.source.entry}'" in b.log
    assert_clean_build(name, b.resources, b.log, b.threads)


@pytest.mark.parametrize("name", ALL_IDS)
def test_global_accesses_wait_for_the_previous_grid(builds: dict[str, Build], name: str) -> None:
    """PDL: the grid dependency wait precedes every global access in the SASS, and dependents are released."""
    assert_waits_for_previous_grid(name, builds[name].cubin)


def test_launch_bounds_match_the_cta() -> None:
    """The source's __launch_bounds__ is the CTA the launcher starts (cta_threads for softmax, 256 for RoPE)."""
    for name, source, threads in _sources():
        assert f"__launch_bounds__({threads})" in source.code, name


# ---------------------------------------------------------------------------------------------- host rules

# Elements one 1024-thread CTA holds (a row of more spans a cluster of CTAs, and past MAX_CLUSTER_CTAS of them it
# streams): 16-byte vectors, 4 a thread (forward) or 2 (backward, which keeps y and dy).
CTA_CAPACITY = {BF16: 32768, FP16: 32768, FP32: 16384}


def _words(vectorized: bool, backward: bool) -> int:
    return (4 if vectorized else 1) * (2 if backward else 1)


def _check_shape(shape: SoftmaxShape, n: int, dtype: torch.dtype, vectorized: bool, backward: bool) -> None:
    t, cluster = shape.threads_per_row, shape.cluster
    words = _words(vectorized, backward)
    assert 1 <= t <= MAX_THREADS_PER_ROW and t & (t - 1) == 0, shape
    assert shape.vector == (vector_elements(dtype) if vectorized else 1)
    assert shape.items >= 1 and shape.items & (shape.items - 1) == 0 and shape.items <= MAX_ITEMS, shape
    budget = CACHED_WORDS_1024 if t == MAX_THREADS_PER_ROW else CACHED_WORDS
    assert shape.items * words <= budget, f"n={n}: {shape.items} items of {words} words past {budget}"
    assert 1 <= cluster <= MAX_CLUSTER_CTAS and cluster & (cluster - 1) == 0, shape
    assert cluster == 1 or t == MAX_THREADS_PER_ROW, f"a cluster splits only rows that fill a CTA: {shape}"
    assert shape.cta_threads == max(256, t) and shape.rows_per_cta * t == shape.cta_threads
    assert shape.grid(5) == (5 * cluster if cluster > 1 else -(-5 // shape.rows_per_cta))
    covered = t * shape.items * shape.vector * cluster  # columns one pass covers
    vectors = -(-n // shape.vector)
    if shape.streaming:
        assert t == MAX_THREADS_PER_ROW and cluster == MAX_CLUSTER_CTAS, shape
        largest = MAX_THREADS_PER_ROW * min(MAX_ITEMS, CACHED_WORDS_1024 // words) * MAX_CLUSTER_CTAS * shape.vector
        assert n > largest, f"n={n} streams although the largest cluster caches {largest}"
    else:
        assert covered >= n, f"n={n}: a cached row must be covered in one pass: {shape}"
        if cluster > 1:  # the smallest cluster that holds the row
            assert t * shape.items * (cluster // 2) < vectors, shape
        elif t > 1:  # the fewest threads: half as many would need more than ITEMS_PER_THREAD vectors each
            assert vectors > (t // 2) * 4, shape


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("vectorized", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("dtype", [BF16, FP16, FP32])
def test_softmax_shape_rules(dtype: torch.dtype, vectorized: bool, backward: bool) -> None:
    """For every n (all of 1..300 and a spread up to 2^31 - 1): threads a power of two <= 1024, a cached row covered
    by one pass with the fewest threads (or the smallest cluster), cached words within the register budget,
    streaming only once the largest cluster cannot hold the row; one CTA, cluster, streaming in that order as n
    grows."""
    vector = vector_elements(dtype) if vectorized else 1
    ns = list(range(1, 301)) + [2**e + d for e in range(9, 31) for d in (-vector, 0, vector)] + [100000, 2**31 - 1]
    ns = sorted({n - n % vector if vectorized and n >= vector else n for n in ns})
    stage = 0  # 0: one CTA, 1: a cluster, 2: streaming
    for n in ns:
        shape = softmax_shape(n, dtype, vectorized, backward)
        _check_shape(shape, n, dtype, vectorized, backward)
        now = 2 if shape.streaming else int(shape.cluster > 1)
        assert now >= stage, f"n={n} takes a smaller class ({now}) than a shorter row ({stage})"
        stage = now


@pytest.mark.parametrize("dtype", [BF16, FP16, FP32])
def test_vectorized_rows_cluster_then_stream_past_the_cta_capacity(dtype: torch.dtype) -> None:
    """A vectorized forward row of up to 32768 bf16 / fp16 (16384 fp32) values fits one CTA (read once); one vector
    more spans a cluster of 2; up to 8 CTAs' worth stays cached, one vector more streams (read twice). The backward
    (y and dy cached) holds half as much a CTA."""
    vector = vector_elements(dtype)
    for backward, cap in ((False, CTA_CAPACITY[dtype]), (True, CTA_CAPACITY[dtype] // 2)):
        one = softmax_shape(cap, dtype, True, backward)
        assert (one.cluster, one.streaming) == (1, False)
        two = softmax_shape(cap + vector, dtype, True, backward)
        assert (two.cluster, two.streaming) == (2, False)
        full = softmax_shape(cap * MAX_CLUSTER_CTAS, dtype, True, backward)
        assert (full.cluster, full.streaming) == (MAX_CLUSTER_CTAS, False)
        assert softmax_shape(cap * MAX_CLUSTER_CTAS + vector, dtype, True, backward).streaming


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_rows_that_fill_the_sms_stream_instead_of_clustering(backward: bool) -> None:
    """A row past one CTA's capacity spans a cluster only while the rows leave SMs idle (rows < num_sms); from
    num_sms rows on it streams on one CTA a row (measured faster there: softmax_shape's docstring)."""
    for rows in (1, 64, 131):
        assert softmax_shape(40000, BF16, True, backward, rows, 132).cluster > 1
    for rows in (132, 4096):
        shape = softmax_shape(40000, BF16, True, backward, rows, 132)
        assert shape.streaming and shape.cluster == 1
        assert softmax_shape(4096, BF16, True, backward, rows, 132) == softmax_shape(4096, BF16, True, backward)


def test_scalar_rows_fit_a_cta_up_to_8192() -> None:
    """The scalar path (one 32-bit word a value, at most 8 a thread) holds rows up to 1024 x 8 values in one CTA."""
    for dtype in (BF16, FP32):
        assert softmax_shape(8192, dtype, False).cluster == 1
        assert softmax_shape(8193, dtype, False).cluster == 2
        assert not softmax_shape(65536, dtype, False).streaming and softmax_shape(65537, dtype, False).streaming


@pytest.mark.parametrize("rotary,vector,lanes", [(2, 1, 1), (6, 1, 4), (32, 1, 16), (64, 1, 32), (128, 1, 32),
                                                 (512, 1, 32), (16, 8, 1), (64, 8, 4), (128, 8, 8), (128, 4, 16),
                                                 (64, 4, 8), (1024, 8, 32)])
def test_lanes_per_row(rotary: int, vector: int, lanes: int) -> None:
    """Lanes a row: the power of two that steps over the row's R/2 pairs (vector pairs a lane) once, capped at a warp;
    half as many would not cover it."""
    got = lanes_per_row(rotary, vector)
    assert got == lanes
    assert got & (got - 1) == 0 and 1 <= got <= 32
    assert got == 32 or got * vector >= rotary // 2
    assert got == 1 or (got // 2) * vector < rotary // 2
