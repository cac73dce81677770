"""Real sm_90a compile-only builds (NVRTC, no GPU) of the BF16 GEMM in every layout: the cost model's choices for a
few shapes and hand-picked tiles it may pick (block_m 64 and 128, narrow and wide block_n, N and K tails, BF16 and
FP32 out, with and without C), and the grouped kinds' plans (contiguous, psum, masked, k-grouped). Each must compile without register spills, stack frame or wgmma serialization
(ptxas C7514, and in the SASS: no wait after every HGMMA)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from deepgemm.errors import CompileError
from deepgemm.jit import compile_kernel
from deepgemm.kernels.common.hopper import SMEM_CAPACITY, elem_bytes
from deepgemm.kernels.sm90_bf16_gemm.config import Bf16GemmConfig
from deepgemm.kernels.sm90_bf16_gemm.cost_model import group_rows_for, stages_for
from deepgemm.kernels.common.kind import GemmKind
from deepgemm.kernels.sm90_bf16_gemm.plan import Bf16Geometry, bf16_spec, grouped_spec
from deepgemm.kernels.sm90_bf16_gemm.spec import LAYOUTS, Bf16GemmSpec, b_mn_major, compile_spec, render_source
from deepgemm.utils import ceil_div
from tests.cpu.test_kernel_builds import assert_waits_for_previous_grid, disassemble
from tests.helpers import assert_clean_build, build_in_isolated_cache

BF16, FP32 = torch.bfloat16, torch.float32

# The cost model's pick on 132 SMs: (id, m, n, k, out dtype, C dtype).
PLANNED = [
    ("large", 4096, 7168, 16384, BF16, None),
    ("decode", 64, 2112, 7168, BF16, None),
    ("fp32_out_fp32_c", 4096, 2112, 7168, FP32, FP32),
]

# Hand-built tiles: (id, block_m, block_n, n, k, out dtype, C dtype). block_n not a multiple of 64 only where B is
# K-major (nt, tt): an MN-major B tile is whole 64-column atoms.
EXPLICIT = [
    ("bm64_bn16", 64, 16, 2112, 7168, BF16, None),
    ("bm64_bn96_c_bf16", 64, 96, 4096, 7168, BF16, BF16),
    ("bm128_bn176_fp32_c_fp32", 128, 176, 7168, 2048, FP32, FP32),
    ("bm128_bn256", 128, 256, 7168, 16384, BF16, None),
    ("bm64_bn256_fp32", 64, 256, 4096, 7168, FP32, None),
    ("bm128_bn64_n136_k72_c_bf16", 128, 64, 136, 72, BF16, BF16),  # N and K tails
]
# Split-K builds (dense decode sizes), same fields.
EXPLICIT_SPLIT = [
    ("bm128_bn64_splitk_fp32_c_fp32", 128, 64, 2112, 7168, FP32, FP32),
    ("bm64_bn128_splitk_c_bf16", 64, 128, 4096, 7168, BF16, BF16),
]


@dataclasses.dataclass
class Build:
    name: str
    spec: Bf16GemmSpec
    resources: Any
    log: str
    cubin: Path


def explicit_spec(layout: str, block_m: int, block_n: int, n: int, k: int, out_dtype: torch.dtype,
                  c_dtype: torch.dtype | None, split_k: bool = False) -> Bf16GemmSpec:
    """The tile with as many stages as shared memory holds (as the cost model sizes them), on 132 SMs."""
    stages = stages_for(block_m, block_n, elem_bytes(out_dtype), split_k)
    group = group_rows_for(ceil_div(4096, block_m), ceil_div(n, block_n), 132)
    config = Bf16GemmConfig(block_m, block_n, stages, group, 132, split_k)
    return bf16_spec(4096, n, k, layout, out_dtype, c_dtype, 132, config)


def _requests() -> list[tuple[str, Bf16GemmSpec]]:
    requests = []
    for layout in LAYOUTS:
        for name, m, n, k, out_dtype, c_dtype in PLANNED:
            requests.append((f"{layout}-planned-{name}", bf16_spec(m, n, k, layout, out_dtype, c_dtype, 132)))
        for name, bm, bn, n, k, out_dtype, c_dtype in EXPLICIT:
            if b_mn_major(layout) and bn % 64:
                continue
            requests.append((f"{layout}-{name}", explicit_spec(layout, bm, bn, n, k, out_dtype, c_dtype)))
        for name, bm, bn, n, k, out_dtype, c_dtype in EXPLICIT_SPLIT:
            requests.append((f"{layout}-{name}", explicit_spec(layout, bm, bn, n, k, out_dtype, c_dtype, True)))
    return requests


# The grouped kinds: the plans the API would build on 132 SMs.
CONTIGUOUS_SHAPES = [
    ("n7168_k2048", Bf16Geometry(4 * 4096, 4), 7168, 2048, BF16),
    ("n4096_k7168_fp32", Bf16Geometry(4 * 4096, 4), 4096, 7168, FP32),
    ("small_m_n4096_k7168", Bf16Geometry(512, 4), 4096, 7168, BF16),
    ("small_m_n7168_k2048_fp32", Bf16Geometry(256, 2), 7168, 2048, FP32),
    ("n136_k72_fp32", Bf16Geometry(512, 4), 136, 72, FP32),
    ("one_group_m128_n256_k7168", Bf16Geometry(128, 1), 256, 7168, BF16),  # no split-K for one group
]
MASKED_SHAPES = [
    ("n7168_k2048_e1", Bf16Geometry(4 * 128, 4, 128), 7168, 2048, BF16, 1),
    ("n4096_k7168_e64_fp32", Bf16Geometry(8 * 256, 8, 256), 4096, 7168, FP32, 64),
    ("n4096_k7168_e256", Bf16Geometry(4 * 256, 4, 256), 4096, 7168, BF16, 256),
    ("n7168_k2048_e128_fp32", Bf16Geometry(4 * 256, 4, 256), 7168, 2048, FP32, 128),
    ("n136_k72_e64", Bf16Geometry(2 * 64, 2, 64), 136, 72, BF16, 64),
    ("one_group_n2112_k7168_e64", Bf16Geometry(64, 1, 64), 2112, 7168, BF16, 64),
]
K_GROUPED_SHAPES = [  # (id, M, G, N, C dtype, C is out)
    ("m4096_n7168", 4096, 4, 7168, None, False),
    ("m7168_n4096_c", 7168, 8, 4096, FP32, False),
    ("m7168_n4096_inplace", 7168, 8, 4096, FP32, True),
    ("m4096_n4096_inplace", 4096, 4, 4096, FP32, True),
    ("m136_n4096", 136, 4, 4096, None, False),
    ("m4096_n136_c", 4096, 8, 136, FP32, False),
    ("m136_n136_c", 136, 8, 136, FP32, False),
    ("m136_n136_inplace", 136, 8, 136, FP32, True),
    ("m8_n8", 8, 4, 8, None, False),
    ("m64_n512_g1", 64, 1, 512, None, False),
]


def _grouped_requests() -> list[tuple[str, Bf16GemmSpec]]:
    requests = []
    for kind in (GemmKind.GROUPED_CONTIGUOUS, GemmKind.GROUPED_CONTIGUOUS_PSUM):
        for name, geometry, n, k, out_dtype in CONTIGUOUS_SHAPES:
            requests.append((f"{kind.name.lower()}-{name}",
                             grouped_spec(kind, geometry, n, k, out_dtype, None, 0, 132)))
    for name, geometry, n, k, out_dtype, expected_m in MASKED_SHAPES:
        requests.append((f"grouped_masked-{name}",
                         grouped_spec(GemmKind.GROUPED_MASKED, geometry, n, k, out_dtype, None, expected_m, 132)))
    for name, m, groups, n, c_dtype, in_place in K_GROUPED_SHAPES:
        requests.append((f"k_grouped-{name}",
                         grouped_spec(GemmKind.K_GROUPED, Bf16Geometry(m, groups), n, 0, FP32, c_dtype, 0, 132,
                                      in_place)))
    return requests


REQUESTS = _requests() + _grouped_requests()
IDS = [name for name, _ in REQUESTS]


def _build(request: tuple[str, Bf16GemmSpec]) -> Build:
    name, spec = request
    compiled = compile_spec(spec)
    return Build(name, spec, compiled.resources, compiled.log, Path(compiled.cubin_path))


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Build]:
    results = build_in_isolated_cache(tmp_path_factory, _build, REQUESTS)
    print("\ncovered BF16 GEMM configs:")
    for b in results:
        print(f"  {b.name:36s} {b.spec.label()}  regs={b.resources.registers if b.resources else '?'}")
    return {b.name: b for b in results}


@pytest.mark.parametrize("name", IDS)
def test_no_spills_no_stack(builds: dict[str, Build], name: str) -> None:
    b = builds[name]
    assert_clean_build(name, b.resources, b.log, b.spec.config.num_threads)
    assert b.spec.smem_bytes <= SMEM_CAPACITY


@pytest.mark.parametrize("name", IDS)
def test_no_wgmma_serialization(builds: dict[str, Build], name: str) -> None:
    log = builds[name].log
    assert "Compiling entry function" in log  # the log is ptxas's verbose report, not empty
    assert "C7514" not in log, f"{name}: ptxas serialized wgmma:\n{log}"


@pytest.mark.parametrize("name", IDS)
def test_wgmma_not_serialized_in_sass(builds: dict[str, Build], name: str) -> None:
    """Each 64-deep K block issues four k16 wgmmas as one group: only its last HGMMA carries the group's scoreboard
    (gsb0). ptxas serializing them (it can do so without a C7514 message) gives every HGMMA its own gsb0 and wait."""
    sass = disassemble(builds[name].cubin)
    mma_lines = [line for line in sass.splitlines() if "HGMMA" in line]
    group_ends = sum("gsb0" in line for line in mma_lines)
    assert mma_lines, f"{name}: no HGMMA in the SASS"
    assert 2 * group_ends <= len(mma_lines), (
        f"{name}: {group_ends} of {len(mma_lines)} HGMMA end a wgmma group: ptxas serialized the MMAs")


@pytest.mark.parametrize("name", IDS)
def test_global_accesses_wait_for_the_previous_grid(builds: dict[str, Build], name: str) -> None:
    assert_waits_for_previous_grid(name, builds[name].cubin)


def test_builds_cover_the_template_space(builds: dict[str, Build]) -> None:
    specs = [b.spec for b in builds.values()]
    for layout in LAYOUTS:
        mine = [s for s in specs if s.layout == layout]
        assert {s.config.block_m for s in mine} == {64, 128}, layout
        assert any(s.out_dtype == FP32 and s.addend == 2 for s in mine), layout
        assert any(s.addend == 1 for s in mine), layout
        assert any(s.config.block_n == 256 for s in mine), layout
        assert {s.config.block_m for s in mine if s.config.split_k} == {64, 128}, layout  # split-K builds
        assert builds[f"{layout}-planned-decode"].spec.config.split_k, layout  # the model's decode pick splits
        assert any(s.k % 64 for s in mine) and any(s.n % s.config.block_n for s in mine), layout
        if not b_mn_major(layout):
            assert {16, 96, 176} <= {s.config.block_n for s in mine}, layout


def test_static_assert_catches_smem_mismatch(builds: dict[str, Build]) -> None:
    """render_source pins the host's shared-memory size against the kernel's: a config the device would size
    differently fails to compile."""
    spec = builds["nt-bm128_bn64_n136_k72_c_bf16"].spec
    source = render_source(spec)
    wrong = dataclasses.replace(source, code=source.code.replace(f"== {spec.smem_bytes}u",
                                                                 f"== {spec.smem_bytes + 1024}u"))
    assert wrong.code != source.code
    with pytest.raises(CompileError):
        compile_kernel(wrong)


def test_grouped_builds_cover_the_kinds_and_tiles(builds: dict[str, Build]) -> None:
    specs = [b.spec for b in builds.values()]
    for kind in (GemmKind.GROUPED_CONTIGUOUS, GemmKind.GROUPED_CONTIGUOUS_PSUM, GemmKind.GROUPED_MASKED,
                 GemmKind.K_GROUPED):
        mine = [s for s in specs if s.kind == kind]
        assert {s.config.block_m for s in mine} == {64, 128}, kind
        assert {s.layout for s in mine} == {"tn" if kind == GemmKind.K_GROUPED else "nt"}, kind
        assert any(s.n % s.config.block_n for s in mine), f"{kind}: no N tail"
        if kind == GemmKind.K_GROUPED:
            assert all(s.k == 0 and s.out_dtype == FP32 for s in mine)
            assert {s.addend for s in mine} == {0, 2, 3}  # none, FP32 C loaded, C = out (reduce-add stores)
            assert any(s.config.store_n for s in mine), "no chunked (wide FP32) k-grouped tile"
        else:
            assert {s.out_dtype for s in mine} == {BF16, FP32}, kind
            assert all(s.addend == 0 for s in mine)
            assert any(s.k % 64 for s in mine), f"{kind}: no K tail"


def test_grouped_specs_refuse_other_layouts() -> None:
    spec = grouped_spec(GemmKind.K_GROUPED, Bf16Geometry(136, 4), 136, 0, FP32, None, 0, 132)
    with pytest.raises(ValueError, match="K_GROUPED.*tn"):
        dataclasses.replace(spec, layout="nt")
    spec = grouped_spec(GemmKind.GROUPED_MASKED, Bf16Geometry(128, 2, 64), 136, 72, BF16, None, 64, 132)
    with pytest.raises(ValueError, match="GROUPED_MASKED.*nt"):
        dataclasses.replace(spec, layout="tn")
