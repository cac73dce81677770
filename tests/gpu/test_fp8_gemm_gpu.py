"""FP8 GEMM on an sm_90 GPU against a float64 reference: main shapes, odd shapes, graphs, determinism."""

from __future__ import annotations

import dataclasses

import itertools
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import deepgemm
from tests.helpers import assert_close_to_reference, random_operands, reference_abs_fp64, reference_fp64

pytestmark = pytest.mark.gpu

MAIN_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
MAIN_SHAPES = [(m, n, k) for m in (64, 128, 4096) for n, k in MAIN_NK]
ODD_SHAPES = list(itertools.product((1, 7, 63, 65, 129, 1000, 4097), (8, 136, 2056, 7168), (128, 144, 7168, 7296)))


@pytest.fixture(scope="module", autouse=True)
def _precompile_all() -> None:
    """Compile every kernel these tests need in parallel (compiles run out of process)."""
    shapes = MAIN_SHAPES + ODD_SHAPES
    with ThreadPoolExecutor(max_workers=16) as pool:
        jobs = [pool.submit(deepgemm.precompile_fp8_gemm_nt, m, n, k) for m, n, k in shapes]
        jobs += [pool.submit(deepgemm.precompile_fp8_gemm_nt, 129, 136, 144, out_dtype=torch.float32)]
        for job in jobs:
            job.result()


def _run_poisoned(a, b, m: int, n: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    result = deepgemm.fp8_gemm_nt(a, b, out)
    assert result is out
    return out


@pytest.mark.parametrize("m,n,k", MAIN_SHAPES, ids=lambda v: str(v))
def test_main_shapes(m: int, n: int, k: int) -> None:
    a, b = random_operands(m, n, k, "cuda")
    out = _run_poisoned(a, b, m, n)
    assert_close_to_reference(out, reference_fp64(a, b), reference_abs_fp64(a, b))
    again = _run_poisoned(a, b, m, n)
    assert torch.equal(out, again), "two calls on the same inputs differ"


@pytest.mark.parametrize("m,n,k", ODD_SHAPES, ids=lambda v: str(v))
def test_odd_shapes(m: int, n: int, k: int) -> None:
    a, b = random_operands(m, n, k, "cuda")
    out = _run_poisoned(a, b, m, n)
    assert_close_to_reference(out, reference_fp64(a, b), reference_abs_fp64(a, b))


@pytest.mark.parametrize("m,n,k,block_m,block_n", [(300, 2112, 7168, 128, 128), (129, 4096, 7296, 64, 192), (4097, 136, 144, 128, 64)])
def test_cluster_multicast_configs(m: int, n: int, k: int, block_m: int, block_n: int) -> None:
    """The opt-in 2-CTA B-multicast path (odd M-block counts leave a CTA with no rows)."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan

    config = make_config(m, n, k, block_m, block_n, torch.cuda.get_device_properties(0).multi_processor_count, cluster_m=2)
    plan = get_plan(0, m, n, k, torch.bfloat16, config)
    a, b = random_operands(m, n, k, "cuda")
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    plan.launch(a[0], a[1], b[0], b[1], out)
    assert_close_to_reference(out, reference_fp64(a, b), reference_abs_fp64(a, b))


# A multicast (cluster_n = 2: two CTAs on horizontally adjacent tiles, each loading half of the shared A tile):
# partial last M-blocks (M = 4097: one row; 300, 1000), a partial last N-block (N = 4000), odd K blocks, FP32 out
# (chunked stores), block_m 128 and 256, and a 16-SM grid where each cluster walks many tiles.
A_MULTICAST = [
    (4097, 7168, 2048, 256, 128, torch.bfloat16, None),
    (300, 2048, 7296, 128, 128, torch.bfloat16, None),
    (1000, 4000, 2048, 128, 128, torch.bfloat16, None),
    (700, 2048, 4096, 256, 128, torch.float32, None),
    (1300, 2048, 2048, 256, 64, torch.bfloat16, 16),
]


@pytest.mark.parametrize("m,n,k,block_m,block_n,out_dtype,sms", A_MULTICAST, ids=lambda v: str(v))
def test_a_multicast_configs(m: int, n: int, k: int, block_m: int, block_n: int, out_dtype: torch.dtype,
                             sms: int | None) -> None:
    """The 2-CTA A-multicast path against float64, and bitwise equal to the same tile without clusters."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan

    sms = sms or torch.cuda.get_device_properties(0).multi_processor_count
    plain = make_config(m, n, k, block_m, block_n, sms, 4 if out_dtype == torch.float32 else 2, cluster_m=1)
    clustered = dataclasses.replace(plain, cluster_n=2)
    plan = get_plan(0, m, n, k, out_dtype, clustered)
    assert plan.grid % 2 == 0 and "cn2" in plan.spec.label()
    operands = random_operands(m, n, k, "cuda")
    out = _run_checked(plan, operands, out_dtype)
    assert torch.equal(out, _run_checked(get_plan(0, m, n, k, out_dtype, plain), operands, out_dtype))


def _run_checked(plan, operands, out_dtype: torch.dtype) -> torch.Tensor:  # noqa: ANN001
    """Launch a forced plan into a NaN-poisoned output and check it against the float64 reference."""
    a, b = operands
    out = torch.full((a[0].shape[0], b[0].shape[0]), float("nan"), dtype=out_dtype, device="cuda")
    plan.launch(a[0], a[1], b[0], b[1], out)
    assert_close_to_reference(out, reference_fp64(a, b), reference_abs_fp64(a, b),
                              max_diff=1e-5 if out_dtype == torch.float32 else 1e-3)
    return out


# block_m 256 (two 64-row waves per math warpgroup, chunked epilogue): tails where one or both waves
# of a warpgroup have no rows (M = 300: the second block has 44 rows), fp32 chunks, narrow N, clusters.
# Stores: one buffer per wave used in turn (bf16 default; a tile whose second wave has no rows shifts the
# turn), or 128-byte chunks through one buffer (fp32 default, or forced), also on a 16-SM grid where each
# CTA stores many tiles.
BLOCK_M_256 = [
    (4097, 7168, 7168, 128, 1, torch.bfloat16, None, None),
    (300, 2112, 7296, 128, 1, torch.bfloat16, None, None),
    (129, 136, 144, 64, 1, torch.bfloat16, None, None),
    (1000, 4100, 7184, 128, 1, torch.float32, None, None),
    (700, 2056, 2048, 128, 2, torch.bfloat16, None, None),
    (1300, 2048, 2048, 128, 1, torch.bfloat16, None, 16),
    (1300, 2048, 2048, 128, 1, torch.bfloat16, True, 16),
    (4097, 7168, 2048, 128, 1, torch.bfloat16, True, None),
]


@pytest.mark.parametrize("m,n,k,block_n,cluster_m,out_dtype,chunked,sms", BLOCK_M_256, ids=lambda v: str(v))
def test_block_m_256_configs(m: int, n: int, k: int, block_n: int, cluster_m: int, out_dtype: torch.dtype,
                             chunked: bool | None, sms: int | None) -> None:
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan

    out_bytes = 4 if out_dtype == torch.float32 else 2
    sms = sms or torch.cuda.get_device_properties(0).multi_processor_count
    config = make_config(m, n, k, 256, block_n, sms, out_bytes, cluster_m=cluster_m, chunked_store=chunked)
    assert not config.pipelined and config.num_stages >= 2
    assert config.chunked_store == (chunked or out_dtype == torch.float32)
    plan = get_plan(0, m, n, k, out_dtype, config)
    operands = random_operands(m, n, k, "cuda")
    out = _run_checked(plan, operands, out_dtype)
    assert torch.equal(out, _run_checked(plan, operands, out_dtype))


# Tiles whose block_n does not divide 128 switch to the next sfb block at a column fixed per tile; with at most
# four possible columns the K loop is compiled once per column (block_n 192: 2, 96 and 160: 4), with more a
# run-time select (block_n 112, 144). N spans enough tiles to visit every column; M tails and fp32 output.
# The last four leave a partial last N-block, computed by narrower MMAs from a narrower B box: 136 columns
# that straddle two scale blocks (4168 = 21 x 192 + 136, unpipelined; fp32 too), 64 that straddle (4000 =
# 41 x 96 + 64, pipelined) and 96 that do not (4096 = 25 x 160 + 96).
STRADDLING = [
    (129, 2112, 7168, 128, 192, torch.bfloat16),
    (4097, 1536, 2048, 128, 192, torch.float32),
    (65, 4032, 1536, 64, 96, torch.bfloat16),
    (300, 2720, 7296, 64, 160, torch.bfloat16),
    (1000, 1904, 2048, 128, 112, torch.bfloat16),
    (63, 2304, 144, 64, 144, torch.bfloat16),
    (257, 4168, 2048, 128, 192, torch.bfloat16),
    (129, 4168, 7296, 128, 192, torch.float32),
    (65, 4000, 1536, 64, 96, torch.bfloat16),
    (300, 4096, 2048, 128, 160, torch.bfloat16),
]


@pytest.mark.parametrize("m,n,k,block_m,block_n,out_dtype", STRADDLING, ids=lambda v: str(v))
def test_straddling_block_n(m: int, n: int, k: int, block_m: int, block_n: int, out_dtype: torch.dtype) -> None:
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan

    out_bytes = 4 if out_dtype == torch.float32 else 2
    config = make_config(m, n, k, block_m, block_n, torch.cuda.get_device_properties(0).multi_processor_count, out_bytes)
    _run_checked(get_plan(0, m, n, k, out_dtype, config), random_operands(m, n, k, "cuda"), out_dtype)


# Narrow one-warpgroup tiles (block_n <= 32), whose TMA producer is an elected lane: every narrow width (24 straddles
# the 128-column scale blocks), M within one block and past it, N tails, split K ranges, FP32 output.
NARROW = [
    (1, 2112, 7168, 16, False, torch.bfloat16),
    (63, 136, 7296, 8, False, torch.bfloat16),
    (65, 2056, 2048, 24, False, torch.bfloat16),
    (129, 4096, 7168, 32, False, torch.float32),
    (16, 2112, 7168, 32, True, torch.bfloat16),
    (64, 1544, 7168, 16, True, torch.bfloat16),
]


@pytest.mark.parametrize("m,n,k,block_n,split,out_dtype", NARROW, ids=lambda v: str(v))
def test_narrow_one_warpgroup_tiles(m: int, n: int, k: int, block_n: int, split: bool, out_dtype: torch.dtype) -> None:
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan

    out_bytes = 4 if out_dtype == torch.float32 else 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    config = make_config(m, n, k, 64, block_n, sms, out_bytes, split_tail=split)
    plan = get_plan(0, m, n, k, out_dtype, config)
    assert plan.spec.config.block_n == block_n and plan.spec.config.split_tail == split
    operands = random_operands(m, n, k, "cuda")
    out = _run_checked(plan, operands, out_dtype)
    assert torch.equal(out, _run_checked(plan, operands, out_dtype)), "two launches on the same inputs differ"


# block_m 192 (three math warpgroups; full blocks use all three): a last block with rows for one warpgroup
# (M = 1000: 40 rows) or two (M = 4097: 65 rows, the second warpgroup with one; M = 320: 128; M = 700: 124),
# a single partial block with rows for all three (M = 191), fp32 output, N tails, straddling block_n.
BLOCK_M_192 = [
    (4097, 7168, 7168, 128, torch.bfloat16),
    (320, 2112, 7296, 128, torch.bfloat16),
    (191, 136, 144, 64, torch.bfloat16),
    (1000, 4100, 7184, 128, torch.float32),
    (700, 2056, 2048, 96, torch.bfloat16),
]


@pytest.mark.parametrize("m,n,k,block_n,out_dtype", BLOCK_M_192, ids=lambda v: str(v))
def test_block_m_192_configs(m: int, n: int, k: int, block_n: int, out_dtype: torch.dtype) -> None:
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan

    out_bytes = 4 if out_dtype == torch.float32 else 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    config = make_config(m, n, k, 192, block_n, sms, out_bytes)
    assert not config.pipelined and config.num_threads == 512
    plan = get_plan(0, m, n, k, out_dtype, config)
    operands = random_operands(m, n, k, "cuda")
    out = _run_checked(plan, operands, out_dtype)
    assert torch.equal(out, _run_checked(plan, operands, out_dtype))


def test_cluster_plan_before_any_cuda_work() -> None:
    """Planning a cluster config in a fresh process (no CUDA context yet) queries occupancy correctly."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config\n"
        "from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan\n"
        "sms = torch.cuda.get_device_properties(0).multi_processor_count\n"
        "plan = get_plan(0, 4096, 4096, 7168, torch.bfloat16, make_config(4096, 4096, 7168, 128, 128, sms, cluster_m=2))\n"
        "assert plan.grid % 2 == 0 and 2 <= plan.grid <= sms, plan.grid\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_fp32_output() -> None:
    m, n, k = 129, 136, 144
    a, b = random_operands(m, n, k, "cuda")
    out = _run_poisoned(a, b, m, n, torch.float32)
    assert_close_to_reference(out, reference_fp64(a, b), reference_abs_fp64(a, b), max_diff=1e-5)
    allocated = deepgemm.fp8_gemm_nt(a, b, out_dtype=torch.float32)
    assert allocated.dtype == torch.float32 and torch.equal(allocated, out)


def test_natural_scale_layout_matches_mn_major() -> None:
    m, n, k = 65, 2056, 7168
    a, b = random_operands(m, n, k, "cuda")
    natural = a[1].contiguous()  # row-major [M, K/128]
    assert natural.stride() != a[1].stride()
    out_natural = deepgemm.fp8_gemm_nt((a[0], natural), b)
    out_aligned = deepgemm.fp8_gemm_nt(a, b)
    assert torch.equal(out_natural, out_aligned)


def test_unaligned_n_allocates_padded_rows() -> None:
    m, n, k = 33, 20, 256  # 20 bf16 = 40 bytes per row: allocated with a padded row stride
    a, b = random_operands(m, n, k, "cuda")
    out = deepgemm.fp8_gemm_nt(a, b)
    assert out.shape == (m, n)
    assert_close_to_reference(out, reference_fp64(a, b), reference_abs_fp64(a, b))


def test_empty_dimensions() -> None:
    a, b = random_operands(0, 256, 256, "cuda")
    assert deepgemm.fp8_gemm_nt(a, b).shape == (0, 256)
    a, b = random_operands(16, 0, 256, "cuda")
    assert deepgemm.fp8_gemm_nt(a, b).shape == (16, 0)
    a = (torch.empty(16, 0, dtype=torch.float8_e4m3fn, device="cuda"), torch.empty(16, 0, device="cuda"))
    b = (torch.empty(24, 0, dtype=torch.float8_e4m3fn, device="cuda"), torch.empty(1, 0, device="cuda"))
    out = torch.full((16, 24), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.fp8_gemm_nt(a, b, out)
    assert (out == 0).all()


def test_misaligned_rows_are_rejected() -> None:
    a, b = random_operands(64, 256, 512, "cuda")
    sliced = a[0][:, 8:264]  # base pointer 8 bytes into a row
    with pytest.raises(ValueError, match="a\\[0\\]"):
        deepgemm.fp8_gemm_nt((sliced, a[1][:, :2]), (b[0][:, :256], b[1][:, :2]))


def test_cuda_graph_capture_and_replay() -> None:
    m, n, k = 128, 4096, 7168
    a, b = random_operands(m, n, k, "cuda")
    out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    deepgemm.fp8_gemm_nt(a, b, out)  # warm: compile + load + descriptors
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deepgemm.fp8_gemm_nt(a, b, out)
    fresh_a, fresh_b = random_operands(m, n, k, "cuda")
    for dst, src in zip((a[0], a[1], b[0], b[1]), (fresh_a[0], fresh_a[1], fresh_b[0], fresh_b[1])):
        dst.copy_(src)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to_reference(out, reference_fp64(fresh_a, fresh_b), reference_abs_fp64(fresh_a, fresh_b))


def test_capturing_a_cold_shape_raises() -> None:
    m, n, k = 48, 4104, 1024  # a shape nothing else compiles
    a, b = random_operands(m, n, k, "cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(deepgemm.GraphCaptureError, match="warm|eagerly"):
        with torch.cuda.graph(graph):
            deepgemm.fp8_gemm_nt(a, b)


def test_balanced_grid_gives_every_cta_the_same_tiles() -> None:
    """Dense plans with K >= 1024 launch the fewest CTAs that keep the wave count (512 tiles of 256 x 128 on
    132 SMs: 128 CTAs of four); a config with balanced_grid=False keeps one CTA per SM. Both compute the same."""
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan

    m, n, k = 4096, 4096, 1024
    a, b = random_operands(m, n, k, "cuda")
    outs = []
    for balanced, sms, grid in ((True, 132, 128), (False, 132, 132), (True, 100, 86)):
        config = make_config(m, n, k, 256, 128, sms, cluster_m=1)
        assert config.balanced_grid  # the default from K = 1024
        config = dataclasses.replace(config, balanced_grid=balanced)
        plan = get_plan(0, m, n, k, torch.bfloat16, config)
        assert plan.grid == grid
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        plan.launch(a[0], a[1], b[0], b[1], out)
        outs.append(out)
    assert_close_to_reference(outs[0], reference_fp64(a, b), reference_abs_fp64(a, b))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
