"""Real sm_90a compile-only builds (NVRTC, no GPU): the GEMM kernels the planner picks, a few
hand-picked configs the planner may pick, and the quantize kernels. Each must compile without
register spills, stack frame, or wgmma serialization (ptxas C7514, and in the SASS: ptxas can also
wait after every wgmma without saying so)."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

import deepgemm
from deepgemm.api.gemm import planned_spec
from deepgemm.errors import CompileError
from deepgemm.jit import compile_kernel
from deepgemm.kernels.common.hopper import SMEM_CAPACITY, elem_bytes
from deepgemm.kernels.quantize_fp8.launch import (
    block_source,
    block_vector_layout,
    token_group_source,
    transposed_source,
)
from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import clusters_allowed, make_config, pipelined_for
from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind
from deepgemm.kernels.sm90_fp8_gemm_1d2d.smem import max_stages
from deepgemm.kernels.sm90_fp8_gemm_1d2d.spec import compile_spec, Fp8GemmSpec, last_box_rows_b, render_source
from tests.helpers import assert_clean_build

BF16, FP32 = torch.bfloat16, torch.float32

# Through precompile_fp8_gemm_nt: (id, m, n, k, out_dtype, num_sms, cluster) - cluster: the model's tile as a 2-CTA
# cluster (a config the tuner times; the model never picks clusters).
PLANNED = [
    ("n8", 1, 8, 128, BF16, 132, False),
    ("large_compute_bound", 4096, 7168, 16384, BF16, 132, False),
    ("k144_fp32", 4096, 136, 144, FP32, 132, False),
    ("k7296_sms114", 1000, 2056, 7296, BF16, 114, False),
    ("fp32_wide_sms78", 129, 7168, 16384, FP32, 78, False),
    ("n32768_k512_sms78", 65, 32768, 512, BF16, 78, False),
    ("decode_sms114", 129, 2112, 7168, BF16, 114, False),
    ("n7_k16", 1, 7, 16, BF16, 132, False),
    ("k7184_fp32", 4096, 4100, 7184, FP32, 132, False),
    ("cluster_large", 4096, 7168, 16384, BF16, 132, True),
    ("cluster_k144", 4096, 136, 144, BF16, 78, True),
    ("cluster_fp32_k7296", 1000, 2056, 7296, FP32, 132, True),
]

# Hand-built configs (tiles the candidate set allows), to cover what the current heuristic may not
# pick: (id, block_m, block_n, cluster_m, n, k, out_dtype).
EXPLICIT = [
    ("bm64_bn192", 64, 192, 1, 24576, 1536, BF16),
    ("bm64_bn136_fp32_k144", 64, 136, 1, 136, 144, FP32),
    ("bm128_bn192_cm2_fp32", 128, 192, 2, 32768, 512, FP32),
    ("bm128_bn144_cm2_k7296", 128, 144, 2, 2056, 7296, BF16),
    ("bm128_bn104_k7296", 128, 104, 1, 2056, 7296, BF16),
    ("bm256_bn128_k16384", 256, 128, 1, 7168, 16384, BF16),
    ("bm256_bn128_fp32_k7296", 256, 128, 1, 4100, 7296, FP32),
    ("bm256_bn64_k144", 256, 64, 1, 136, 144, BF16),
    ("bm256_bn128_cm2_k7168", 256, 128, 2, 4096, 7168, BF16),
    ("bm256_bn128_chunked_k7168", 256, 128, 1, 4096, 7168, BF16, {"chunked_store": True}),
    ("bm128_bn192_k1536", 128, 192, 1, 24576, 1536, BF16),
    ("bm64_bn96_k144", 64, 96, 1, 4032, 144, BF16),
    ("bm64_bn160_k7168", 64, 160, 1, 4096, 7168, BF16),
    ("bm192_bn128_k16384", 192, 128, 1, 7168, 16384, BF16),
    ("bm192_bn96_fp32_k7184", 192, 96, 1, 4100, 7184, FP32),
    # A partial last N-block (4096 = 21 x 192 + 64) runs a narrower K loop; contiguous kernels also rotate their walk.
    ("bm128_bn192_narrow_k7168", 128, 192, 1, 4096, 7168, BF16),
    ("contiguous_bm128_bn192_narrow_k7168", 128, 192, 1, 4096, 7168, BF16, {"kind": GemmKind.GROUPED_CONTIGUOUS}),
    ("bm64_bn96_narrow_pipelined", 64, 96, 1, 4000, 1536, BF16),
    # A multicast (2-CTA clusters along N): block_m 256 and 128 (pipelined), FP32 chunks, a partial last N-block.
    ("bm256_bn128_cn2_k16384", 256, 128, 1, 7168, 16384, BF16, {"cluster_n": 2}),
    ("bm128_bn128_cn2_k7296", 128, 128, 1, 4000, 7296, BF16, {"cluster_n": 2}),
    ("bm256_bn128_cn2_fp32_k4096", 256, 128, 1, 2048, 4096, FP32, {"cluster_n": 2}),
    # Narrow one-warpgroup tiles: their TMA producer is an elected lane (kElectedProducer), dense, masked (16-row A
    # boxes) and split.
    ("bm64_bn16_k7168", 64, 16, 1, 2112, 7168, BF16),
    ("masked_bm64_bn32_k7168", 64, 32, 1, 4096, 7168, BF16, {"kind": GemmKind.GROUPED_MASKED}),
    ("bm64_bn32_split_k7168", 64, 32, 1, 2112, 7168, BF16, {"split_tail": True}),
]
# The explicit builds whose producer is an elected lane (one math warpgroup, block_n <= 32; every pipelined one).
ELECTED_IDS = ["bm64_bn16_k7168", "masked_bm64_bn32_k7168", "bm64_bn32_split_k7168", "bm128_bn104_k7296",
               "bm128_bn128_cn2_k7296", "bm64_bn96_narrow_pipelined"]

QUANTIZE = [
    ("token_group_bf16_128", token_group_source, BF16, 128),
    ("token_group_fp32_128", token_group_source, FP32, 128),
    ("token_group_fp16_64", token_group_source, torch.float16, 64),
    ("block_bf16_128", block_source, BF16, 128),
    ("block_fp32_128", block_source, FP32, 128),
    ("token_group_fp32_1024", token_group_source, FP32, 1024),
    ("block_fp16_32", block_source, torch.float16, 32),
    ("silu_mul_token_group_bf16_128", functools.partial(token_group_source, silu_mul=True), BF16, 128),
    ("silu_mul_token_group_fp32_1024", functools.partial(token_group_source, silu_mul=True), FP32, 1024),
    ("transposed_bf16", lambda dtype, _size: transposed_source(dtype), BF16, 128),
    ("transposed_fp32", lambda dtype, _size: transposed_source(dtype), FP32, 128),
    ("both_ways_bf16", lambda dtype, _size: transposed_source(dtype, rows_too=True), BF16, 128),
    ("both_ways_fp32", lambda dtype, _size: transposed_source(dtype, rows_too=True), FP32, 128),
    ("block_transposed_fp32_128", functools.partial(block_source, transposed=True), FP32, 128),
    ("block_transposed_bf16_128", functools.partial(block_source, transposed=True), BF16, 128),
    ("block_bf16_128_scalar", functools.partial(block_source, vectorized=False), BF16, 128),
    ("block_transposed_fp32_128_scalar_n_fastest",
     functools.partial(block_source, transposed=True, k_fastest=False, vectorized=False), FP32, 128),
]


@dataclasses.dataclass
class Build:
    name: str
    spec: Fp8GemmSpec | None
    resources: Any
    log: str
    extra: dict
    cubin: Path | None = None


def explicit_spec(block_m: int, block_n: int, cluster_m: int, n: int, k: int, out_dtype: torch.dtype,
                  kind: GemmKind = GemmKind.DENSE, **overrides: Any) -> Fp8GemmSpec:
    out_bytes = 4 if out_dtype == FP32 else 2
    config = make_config(4096, n, k, block_m, block_n, 132, out_bytes, cluster_m=cluster_m, **overrides)
    assert config.num_stages == max_stages(block_m, block_n, k, out_bytes, config.chunked_store)
    assert config.pipelined == pipelined_for(block_m, block_n)
    return Fp8GemmSpec(n=n, k=k, out_dtype=out_dtype, config=config, kind=kind)


def _precompile(request) -> Build:
    name, m, n, k, out_dtype, num_sms, cluster = request
    if cluster:
        c = planned_spec(m, n, k, out_dtype, num_sms).config  # as a cluster where the tile allows one
        cluster_m = 2 if clusters_allowed(m, c.block_m, c.block_n, num_sms) else 1
        config = make_config(m, n, k, c.block_m, c.block_n, num_sms, elem_bytes(out_dtype), cluster_m=cluster_m)
        spec = Fp8GemmSpec(n=n, k=k, out_dtype=out_dtype, config=config)
        compiled = compile_spec(spec)
        return Build(name, spec, compiled.resources, compiled.log,
                     {"m": m, "label": spec.label(), "cubin": str(compiled.cubin_path), "same_cubin": True},
                     Path(compiled.cubin_path))
    info = deepgemm.precompile_fp8_gemm_nt(m, n, k, out_dtype=out_dtype, num_sms=num_sms)
    spec = Fp8GemmSpec(n=n, k=k, out_dtype=out_dtype, config=info.config)
    compiled = compile_kernel(render_source(spec))  # memo/disk hit: the same build, with its log
    return Build(name, spec, info.resources, compiled.log,
                 {"m": m, "label": info.label, "cubin": info.cubin_path, "same_cubin": str(compiled.cubin_path) == info.cubin_path},
                 Path(compiled.cubin_path))


def _explicit(request) -> Build:
    name, bm, bn, cm, n, k, out_dtype, *overrides = request
    spec = explicit_spec(bm, bn, cm, n, k, out_dtype, **(overrides[0] if overrides else {}))
    compiled = compile_spec(spec)
    return Build(name, spec, compiled.resources, compiled.log, {"label": spec.label()}, Path(compiled.cubin_path))


def _quantize(request) -> Build:
    name, make_source, dtype, size = request
    compiled = compile_kernel(make_source(dtype, size))
    return Build(name, None, compiled.resources, compiled.log, {}, Path(compiled.cubin_path))


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Build]:
    # Module fixtures run before the function-scoped cache isolation of conftest: isolate here too.
    with pytest.MonkeyPatch.context() as mp:
        if "DEEPGEMM_CACHE_DIR" not in os.environ:
            mp.setenv("DEEPGEMM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "deepgemm-cache"))
        results: list[Build] = []
        with ThreadPoolExecutor(max_workers=4) as pool:
            others = [pool.submit(_explicit, r) for r in EXPLICIT] + [pool.submit(_quantize, r) for r in QUANTIZE]
            results += pool.map(_precompile, PLANNED)
            results += [f.result() for f in others]
    by_name = {b.name: b for b in results}
    print("\ncovered GEMM configs:")
    for b in results:
        if b.spec is not None:
            r = b.resources
            print(f"  {b.name:24s} {b.spec.label()}  regs={r.registers if r else '?'}")
    return by_name


GEMM_IDS = [r[0] for r in PLANNED] + [r[0] for r in EXPLICIT]
ALL_IDS = GEMM_IDS + [r[0] for r in QUANTIZE]


@pytest.mark.parametrize("name", ALL_IDS)
def test_no_spills_no_stack(builds: dict[str, Build], name: str) -> None:
    b = builds[name]
    assert_clean_build(name, b.resources, b.log, None if b.spec is None else b.spec.config.num_threads)


@pytest.mark.parametrize("name", ALL_IDS)
def test_no_wgmma_serialization(builds: dict[str, Build], name: str) -> None:
    log = builds[name].log
    assert "Compiling entry function" in log  # the log is ptxas's verbose report, not empty
    assert "C7514" not in log, f"{name}: ptxas serialized wgmma:\n{log}"


def nvdisasm() -> str:
    """The nvdisasm of the nvidia-cuda-nvdisasm wheel (a test dependency), else one on PATH."""
    import nvidia

    for root in nvidia.__path__:
        candidate = Path(root) / "cu13" / "bin" / "nvdisasm"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("nvdisasm")
    assert found, "nvdisasm not found: pip install nvidia-cuda-nvdisasm (part of the test extra)"
    return found


def disassemble(cubin: Path) -> str:
    """The cubin's SASS as nvdisasm prints it."""
    return subprocess.run([nvdisasm(), str(cubin)], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("name", GEMM_IDS)
def test_wgmma_not_serialized_in_sass(builds: dict[str, Build], name: str) -> None:
    """Each K block issues four k32 wgmmas and waits once (a wait per K block and accumulator at most): a wait after
    every wgmma means ptxas serialized them. It can do so silently: a first narrow last N-block, which issued its MMAs
    into a prefix of the wide accumulator array, got a wait after every wgmma of every K loop and no C7514 message."""
    sass = disassemble(builds[name].cubin)
    mmas = sass.count("QGMMA")
    waits = sass.count("WARPGROUP.DEPBAR")
    assert mmas > 0, f"{name}: no QGMMA in the SASS"
    assert 2 * waits <= mmas, f"{name}: {waits} wgmma waits for {mmas} QGMMA: ptxas serialized the MMAs"


def innermost_mma_loop(sass: str) -> list[str]:
    """The instructions of the smallest loop (a label up to a branch back to it) that issues wgmma, [] if none."""
    code: list[str] = []
    labels: dict[str, int] = {}  # label -> index of the instruction it marks
    pending: str | None = None
    for line in sass.splitlines():
        label = re.match(r"\s*\.(L_x_\d+):", line)
        if label:
            pending = label.group(1)
            continue
        instruction = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+([^.\s].*?);", line)
        if instruction:
            if pending is not None:
                labels[pending] = len(code)
                pending = None
            code.append(instruction.group(1))
    loops = []
    for index, text in enumerate(code):
        target = re.search(r"BRA.*`\(\.(L_x_\d+)\)", text)
        if target and labels.get(target.group(1), index) < index:
            body = code[labels[target.group(1)]:index + 1]
            if any("QGMMA" in t for t in body):
                loops.append(body)
    return min(loops, key=len) if loops else []


# The builds with a K loop (more than two 128-deep K blocks; with two or fewer a tile runs the loop's tail code).
K_LOOP_IDS = [r[0] for r in PLANNED if r[3] > 256] + [r[0] for r in EXPLICIT if r[5] > 256]


@pytest.mark.parametrize("name", K_LOOP_IDS)
def test_pipelined_promotion_follows_all_four_mmas(builds: dict[str, Build], name: str) -> None:
    """With two accumulators the promotion of K block k runs while block k + 1's MMAs do. Left alone, ptxas puts its
    FFMAs (independent of those MMAs) between the first and the second of the four wgmma of a block, so the tensor
    cores overlap only a quarter of the block with it. In the K loop of every pipelined build no FFMA sits inside a
    block's wgmma group (from its first QGMMA to the one that commits the group, `gsb0`)."""
    spec = builds[name].spec
    assert spec is not None
    config = spec.config
    sass = disassemble(builds[name].cubin)
    loop = innermost_mma_loop(sass)
    assert loop, f"{name}: no loop issuing wgmma"
    groups = 0
    split = 0  # groups with an FFMA inside
    inside = False
    ffma_inside = False
    for text in loop:
        if "QGMMA" in text:
            inside = "gsb0" not in text
            if not inside:
                groups += 1
                split += ffma_inside
                ffma_inside = False
        elif inside and "FFMA" in text:
            ffma_inside = True
    assert groups >= 1, f"{name}: no committed wgmma group in the K loop"
    if config.pipelined:
        assert split == 0, f"{name}: {split} of {groups} wgmma groups in the K loop have promotion FFMAs inside"


@pytest.mark.parametrize("name", ELECTED_IDS)
def test_elected_producer_issues_each_load_once(builds: dict[str, Build], name: str) -> None:
    """Narrow one-warpgroup tiles and pipelined builds issue their TMA loads from an elected lane, so each
    UTMALDG stands alone. A `threadIdx.x == 0` producer gets a loop over the active lanes around every load (ELECT,
    UTMALDG, BRA.U.ANY back): ~320 instead of ~210 cycles per stage in clock64 traces on an H100, which held these
    tiles back."""
    config = builds[name].spec.config
    assert (config.block_m == 64 and config.block_n <= 32) or config.pipelined
    sass = disassemble(builds[name].cubin)
    code = [line for line in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4}\*/", line)]
    loads = [i for i, line in enumerate(code) if "UTMALDG" in line]
    assert len(loads) >= 3, f"{name}: {len(loads)} UTMALDG"
    for i in loads:
        window = code[i + 1:i + 5]
        assert not any("BRA.U.ANY" in line for line in window), f"{name}: a lane loop around\n{code[i]}"


# SASS instructions that may read or write global memory: global, generic, atomic and reduction accesses, TMA and
# bulk copies.
GLOBAL_ACCESS = re.compile(r"\b(LDG|STG|LD|ST|LDGSTS|ATOM|ATOMG|RED|UTMALDG|UTMASTG|UTMAREDG|UBLKCP|UBLKRED)\b")


def assert_waits_for_previous_grid(name: str, cubin: Path) -> None:
    """Programmatic dependent launch (set_pdl) lets a kernel start while the previous one in its stream drains: the
    kernel must wait for it (griddepcontrol.wait, SASS ACQBULK) before its first global-memory access in program
    order, and lets its own dependents launch (griddepcontrol.launch_dependents, PREEXIT). (Program order stands
    for execution order here: the wait follows the prologue's barrier, which every thread passes, and precedes the
    role branches.)"""
    sass = disassemble(cubin)
    code = [line for line in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4}\*/", line)]
    waits = [i for i, line in enumerate(code) if "ACQBULK" in line]
    accesses = [i for i, line in enumerate(code) if GLOBAL_ACCESS.search(line)]
    assert len(waits) == 1 and accesses, f"{name}: {len(waits)} ACQBULK, {len(accesses)} global accesses"
    assert waits[0] < accesses[0], f"{name}: a global access before the grid dependency wait:\n{code[accesses[0]]}"
    assert any("PREEXIT" in line for line in code), f"{name}: no launch_dependents"


@pytest.mark.parametrize("name", ALL_IDS)
def test_global_accesses_wait_for_the_previous_grid(builds: dict[str, Build], name: str) -> None:
    assert_waits_for_previous_grid(name, builds[name].cubin)


def test_narrow_last_block_is_a_config_field() -> None:
    """GemmConfig.narrow_last_n decides both the kernel the spec renders and the B box its plan packs, so they always
    agree (a full-width box for a narrow kernel would overfill the stage's expected bytes and hang the kernel)."""
    narrow = explicit_spec(128, 192, 1, 4096, 7168, BF16)
    assert narrow.config.narrow_last_n and last_box_rows_b(narrow) == 64
    assert render_source(narrow).code.count(", true>;") == 1  # kNarrowLastN, the template's last argument
    full = explicit_spec(128, 192, 1, 4096, 7168, BF16, narrow_last_n=False)
    assert not full.config.narrow_last_n and last_box_rows_b(full) == 192
    assert full.label().endswith(" wide-last-n") and not narrow.label().endswith(" wide-last-n")
    assert render_source(full).code.count(" false, false>;") == 1  # kChunkedStore, kNarrowLastN = false
    assert compile_spec(full).resources.spill_stores == 0  # its static_assert: host and device agree on the box


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block", [32, 64, 128])
def test_per_block_vector_layout_agrees_with_the_kernel(dtype: torch.dtype, block: int) -> None:
    """The host's block_vector_layout (which inputs may take the per-block quantizer's 16-byte path) says exactly what
    the kernel's kCanVectorize does: where it says no, the vectorized build fails its static_assert; the default
    source is the vectorized one wherever the layout allows it."""
    vector = block_vector_layout(dtype.itemsize, block)
    assert vector == (not (block == 32 and dtype.itemsize == 2))
    assert block_source(dtype, block).label.endswith(" scalar") != vector
    if not vector:
        with pytest.raises(CompileError, match="no vectorized layout"):
            compile_kernel(block_source(dtype, block, vectorized=True))


def test_a_multicast_is_a_config_field() -> None:
    """cluster_n = 2 renders a trailing template argument (every other kernel's source is unchanged), shows in the
    label, and needs an even number of N-blocks: an odd count fails the kernel's static_assert."""
    plain = explicit_spec(256, 128, 1, 7168, 16384, BF16)
    paired = explicit_spec(256, 128, 1, 7168, 16384, BF16, cluster_n=2)
    assert render_source(plain).code.count(", 2u>;") == 0 and render_source(paired).code.count(", 2u>;") == 1
    assert paired.label().endswith(" cn2") and "cn" not in plain.label().split("cm1")[1]
    assert paired.config.cluster_size == 2 and last_box_rows_b(paired) == 128
    odd = explicit_spec(128, 128, 1, 2112, 7168, BF16, cluster_n=2)  # 17 N-blocks
    with pytest.raises(CompileError, match="even number of N-blocks"):
        compile_spec(odd)
    for cluster_m, cluster_n in ((1, 3), (2, 2), (4, 1)):
        with pytest.raises(ValueError, match="cluster_m .* and cluster_n .* must be 1 or 2"):
            dataclasses.replace(plain.config, cluster_m=cluster_m, cluster_n=cluster_n)


@pytest.mark.parametrize("name", [r[0] for r in PLANNED])
def test_planned_builds_match_the_heuristic(builds: dict[str, Build], name: str) -> None:
    b = builds[name]
    c = b.spec.config
    assert b.extra["same_cubin"], "the config precompile reports is not the one it built"
    assert c.smem_bytes <= SMEM_CAPACITY and c.num_stages >= 2
    assert c.num_sms == next(r[5] for r in PLANNED if r[0] == name)
    assert b.extra["label"] == b.spec.label()


def test_configs_covered(builds: dict[str, Build]) -> None:
    """The set of builds spans the kernel's template space the brief asks for."""
    specs = [builds[n].spec for n in GEMM_IDS]
    configs = [s.config for s in specs]
    assert {c.block_m for c in configs} == {64, 128, 192, 256}
    assert {c.pipelined for c in configs} == {True, False}
    assert {c.cluster_m for c in configs} == {1, 2}
    assert {c.cluster_n for c in configs} == {1, 2}
    assert any(128 % c.block_n != 0 for c in configs), "no tile straddles scale blocks"
    assert any(128 % c.block_n != 0 and c.block_n > 128 for c in configs)
    assert any(s.k % 128 != 0 for s in specs), "no K tail"
    assert any(s.n == 8 for s in specs)
    assert any(s.out_dtype == FP32 for s in specs)
    assert any(s.out_dtype == FP32 and c.cluster_m == 2 for s, c in zip(specs, configs))
    # Clusters were really planned (not only hand-built) when enabled.
    assert any(builds[r[0]].spec.config.cluster_m == 2 for r in PLANNED if r[6])


def test_static_assert_catches_smem_mismatch(builds: dict[str, Build]) -> None:
    """render_source pins the host's smem size against the kernel's; a wrong one must not compile."""
    spec = builds["k144_fp32"].spec
    bad = dataclasses.replace(spec, config=dataclasses.replace(spec.config, smem_bytes=spec.config.smem_bytes + 1024))
    with pytest.raises(CompileError):
        compile_spec(bad)


def test_precompile_defaults_to_132_sms_without_gpu(builds: dict[str, Build]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: num_sms defaults to its SM count")
    info = deepgemm.precompile_fp8_gemm_nt(1, 8, 128)
    assert info.config.num_sms == 132
    assert info.config == builds["n8"].spec.config
    assert info.cubin_path == builds["n8"].extra["cubin"]


@pytest.mark.parametrize(
    "args,kwargs,exc,match",
    [
        ((0, 8, 128), {}, ValueError, "'m'"),
        ((1, -8, 128), {}, ValueError, "'n'"),
        ((1, 8, 0), {}, ValueError, "'k'"),
        ((1, 8, 100), {}, ValueError, "K=100"),
        ((1.0, 8, 128), {}, ValueError, "'m'"),
        ((1, 8, 128), {"out_dtype": torch.float16}, TypeError, "out_dtype"),
        ((1, 8, 128), {"num_sms": 0}, ValueError, "num_sms"),
    ],
)
def test_precompile_rejects_bad_arguments(args, kwargs, exc, match: str) -> None:
    with pytest.raises(exc, match=match):
        deepgemm.precompile_fp8_gemm_nt(*args, **kwargs)
