"""Grouping tensors with any values (m_indices, psum, masked_m, malformed ones included): what the kernel computes,
the CPU reference computing exactly that, and deepgemm.check_grouped_layout / validate=True refusing what breaks a
layout's rules.

What the kernel computes is known here without a GPU: tile_schedulers_host.cpp compiles the kernel's own tile
schedulers (deepgemm/include/deepgemm/scheduler/grouped_tiles.cuh) for the host and stores each tile as the
kernel does, zeroing padding rows by the epilogue's per-row rule (epilogue/contiguous_padding.cuh, mirrored in
its store_tile). Its `dump` mode prints the group each output row is written with, for block_m 64, 128 and 256 over
several grids, and fails on any out-of-bounds read of the grouping tensor or of B. The reference's row maps
(deepgemm.reference.contiguous_row_experts, m_indices_from_psum, the masked clamp) are held to that dump, then the
public functions' CPU path to per-row float64 products under the documented rules, written out per row in
tests/grouped_layout_cases.py.
tests/gpu/test_grouped_layouts_gpu.py runs the same layouts through the kernels on an H200.
"""

from __future__ import annotations

import random
import subprocess

import pytest
import torch

import deepgemm
from deepgemm.api import grouped as api_grouped
from deepgemm.reference import contiguous_row_experts, fp8_gemm_nt_reference, m_indices_from_psum
from tests.cpu.test_tile_schedulers import HERE, INCLUDE, host_compiler
from tests.grouped_layout_cases import (
    M_INDICES_CASES,
    MASKED_CASES,
    PSUM_CASES,
    SEGMENT,
    random_m_indices,
    rule_m_indices,
    rule_masked,
    rule_psum,
)
from tests.helpers import assert_close_to_reference

# ---------------------------------------------------------------- the kernel's schedulers, compiled for the host


@pytest.fixture(scope="module")
def scheduler_dump(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    compiler = host_compiler()
    if compiler is None:
        pytest.skip("no host C++ compiler (c++, g++ or clang++) on PATH")
    binary = tmp_path_factory.mktemp("layouts") / "tile_schedulers_host"
    build = subprocess.run([compiler, "-std=c++17", "-O2", "-Wall", "-Werror", f"-I{INCLUDE}",
                            str(HERE / "tile_schedulers_host.cpp"), "-o", str(binary)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr

    def dump(form: str, values: list[int], groups: int, rows: int) -> dict[int, list[int]]:
        """block_m -> the group each output row is written with (-1: zeros, -2: never written)."""
        done = subprocess.run([str(binary), "dump", form, str(groups), str(rows)], input=" ".join(map(str, values)),
                              capture_output=True, text=True, timeout=120)
        lines = done.stdout.split("\n")
        assert done.returncode == 0, done.stdout[-2000:]
        result = {}
        for line in lines:
            if line.startswith("block_m="):
                head, *cells = line.split()
                result[int(head.removeprefix("block_m="))] = [int(c) for c in cells]
        assert sorted(result) == [64, 128, 256], done.stdout[-2000:]
        return result

    return dump


@pytest.mark.parametrize("name", list(M_INDICES_CASES))
def test_reference_reads_m_indices_as_the_kernel_schedulers_do(name: str, scheduler_dump) -> None:  # noqa: ANN001
    groups, m_indices = M_INDICES_CASES[name]
    by_block_m = scheduler_dump("m_indices", m_indices, groups, len(m_indices))
    values = torch.tensor(m_indices, dtype=torch.int32)
    for block_m, rows in by_block_m.items():
        lookup = min(block_m, SEGMENT)
        assert rows == rule_m_indices(m_indices, groups, lookup), f"block_m {block_m}: the rule"
        assert rows == contiguous_row_experts(values, groups, lookup).tolist(), f"block_m {block_m}: the reference"


def test_reference_reads_random_m_indices_as_the_kernel_schedulers_do(seed: int, scheduler_dump) -> None:  # noqa: ANN001
    rng = random.Random(seed)
    differing = 0
    for _ in range(6):
        groups = rng.randint(1, 5)
        m_indices = random_m_indices(rng, groups, rng.randint(1, 6))
        by_block_m = scheduler_dump("m_indices", m_indices, groups, len(m_indices))
        values = torch.tensor(m_indices, dtype=torch.int32)
        for block_m, rows in by_block_m.items():
            assert rows == contiguous_row_experts(values, groups, min(block_m, SEGMENT)).tolist(), (block_m, m_indices)
        differing += by_block_m[64] != by_block_m[128]
    print(f"layouts read differently by block_m 64 and 128 tiles: {differing} of 6")


@pytest.mark.parametrize("name", list(PSUM_CASES))
def test_reference_reads_psum_as_the_kernel_schedulers_do(name: str, scheduler_dump) -> None:  # noqa: ANN001
    psum, m_total = PSUM_CASES[name]
    by_block_m = scheduler_dump("psum", psum, len(psum), m_total)
    expected = rule_psum(psum, m_total)
    assert m_indices_from_psum(torch.tensor(psum, dtype=torch.int32), m_total).tolist() == expected
    for block_m, rows in by_block_m.items():
        assert rows == expected, f"block_m {block_m}"


def test_reference_reads_random_psum_as_the_kernel_schedulers_do(seed: int, scheduler_dump) -> None:  # noqa: ANN001
    rng = random.Random(seed)
    for _ in range(6):
        m_total = SEGMENT * rng.randint(1, 6)
        psum = [rng.randint(-20, m_total + 40) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.5:
            psum.sort()
        expected = m_indices_from_psum(torch.tensor(psum, dtype=torch.int32), m_total).tolist()
        assert expected == rule_psum(psum, m_total), psum
        for block_m, rows in scheduler_dump("psum", psum, len(psum), m_total).items():
            assert rows == expected, (block_m, psum, m_total)


@pytest.mark.parametrize("name", list(MASKED_CASES))
def test_masked_counts_are_clamped_by_the_kernel_schedulers(name: str, scheduler_dump) -> None:  # noqa: ANN001
    masked_m, max_m = MASKED_CASES[name]
    for block_m, rows in scheduler_dump("masked", masked_m, len(masked_m), max_m).items():
        for group, (valid, written) in enumerate(rule_masked(masked_m, max_m)):
            got = rows[group * max_m:(group + 1) * max_m]
            assert got[:valid] == [group] * valid, (block_m, group)
            assert all(v != -2 for v in got[valid:written]), (block_m, group)  # written, values unspecified
            assert got[written:] == [-2] * (max_m - written), (block_m, group)  # untouched


# ---------------------------------------------------------------- the public functions on CPU tensors


def _weights(groups: int, n: int, k: int):
    parts = [deepgemm.quantize_per_block(torch.randn(n, k)) for _ in range(groups)]
    return torch.stack([q for q, _ in parts]), torch.stack([s for _, s in parts])


def _check_rows(out: torch.Tensor, a, b, experts: list[int]) -> None:  # noqa: ANN001
    """Rows with an expert against their float64 product with it; the others exactly zero."""
    for row, expert in enumerate(experts):
        if expert < 0:
            assert (out[row] == 0).all(), f"row {row} must be zero"
    rows = [r for r, e in enumerate(experts) if e >= 0]
    if not rows:
        return
    ref = torch.cat([fp8_gemm_nt_reference(a[0][r:r + 1], a[1][r:r + 1], b[0][experts[r]], b[1][experts[r]],
                                           torch.float64) for r in rows])
    ref_abs = torch.cat([fp8_gemm_nt_reference(a[0][r:r + 1].float().abs(), a[1][r:r + 1].abs(),
                                               b[0][experts[r]].float().abs(), b[1][experts[r]].abs(), torch.float64)
                         for r in rows])
    assert_close_to_reference(out[rows], ref, ref_abs)


@pytest.mark.parametrize("lookup", [64, 128])
@pytest.mark.parametrize("name", [n for n in M_INDICES_CASES if n != "well formed"])
def test_cpu_path_follows_the_kernels_reading_of_m_indices(name: str, lookup: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """With the tile rule faked to block_m 64 or 128 (the lookup the kernel would use), the CPU result is the
    kernel's for that tile."""
    groups, m_indices = M_INDICES_CASES[name]
    monkeypatch.setattr(api_grouped, "_kernel_lookup_rows", lambda *args: lookup)
    a = deepgemm.quantize_per_token_group(torch.randn(len(m_indices), 256))
    b = _weights(groups, 24, 256)
    out = torch.full((len(m_indices), 24), float("nan"), dtype=torch.bfloat16)
    deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, torch.tensor(m_indices, dtype=torch.int32))
    _check_rows(out, a, b, rule_m_indices(m_indices, groups, lookup))


def test_cpu_path_asks_the_tile_rule_the_kernel_uses() -> None:
    """A small M_total plans block_m 64 tiles, a long one 128 or more: a segment whose second half names another
    expert is then read per 64 rows, or per 128."""
    from deepgemm.kernels.common.device import planning_sm_count
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import Geometry, grouped_spec
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind

    api_grouped.clear_grouped_plans()
    seen = set()
    for segments in (1, 32):
        m_indices = [0] * 64 + [1] * 64 + [1] * SEGMENT * (segments - 1)
        m_total, n, k = len(m_indices), 256, 256
        spec = grouped_spec(GemmKind.GROUPED_CONTIGUOUS, Geometry(rows=m_total, groups=2), n, k, torch.bfloat16,
                            m_total, planning_sm_count())
        lookup = min(spec.config.block_m, SEGMENT)
        seen.add(lookup)
        a = deepgemm.quantize_per_token_group(torch.randn(m_total, k))
        b = _weights(2, n, k)
        out = torch.empty(m_total, n, dtype=torch.bfloat16)
        deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, torch.tensor(m_indices, dtype=torch.int32))
        _check_rows(out[:SEGMENT], (a[0][:SEGMENT], a[1][:SEGMENT]), b, rule_m_indices(m_indices, 2, lookup)[:SEGMENT])
    assert seen == {64, 128}, f"the tile rule no longer picks block_m 64 for 128 rows and >= 128 for 4096: {seen}"


@pytest.mark.parametrize("name", list(PSUM_CASES))
def test_cpu_path_follows_the_kernels_reading_of_psum(name: str) -> None:
    psum, m_total = PSUM_CASES[name]
    a = deepgemm.quantize_per_token_group(torch.randn(m_total, 256))
    b = _weights(len(psum), 24, 256)
    out = torch.full((m_total, 24), float("nan"), dtype=torch.bfloat16)
    deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, out, torch.tensor(psum, dtype=torch.int32))
    _check_rows(out, a, b, rule_psum(psum, m_total))


@pytest.mark.parametrize("name", list(MASKED_CASES))
def test_cpu_path_clamps_masked_m_like_the_kernel(name: str) -> None:
    masked_m, max_m = MASKED_CASES[name]
    groups, n, k = len(masked_m), 24, 256
    a2d = deepgemm.quantize_per_token_group(torch.randn(groups * max_m, k))
    a = (a2d[0].view(groups, max_m, k), a2d[1].reshape(groups, max_m, -1))
    b = _weights(groups, n, k)
    out = torch.full((groups, max_m, n), float("nan"), dtype=torch.bfloat16)
    deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, torch.tensor(masked_m, dtype=torch.int32), expected_m=max_m)
    for group, (valid, written) in enumerate(rule_masked(masked_m, max_m)):
        if valid:
            _check_rows(out[group, :valid], (a[0][group, :valid], a[1][group, :valid]), b, [group] * valid)
        # Rows past the count: unspecified up to `written` on the kernel, untouched on the CPU; untouched past it.
        assert out[group, valid:].isnan().all(), f"expert {group}: rows past masked_m must stay as they were"


# ---------------------------------------------------------------- check_grouped_layout and validate=True


def test_well_formed_layouts_pass() -> None:
    groups, m_indices = M_INDICES_CASES["well formed"]
    deepgemm.check_grouped_layout(num_groups=groups, m_indices=torch.tensor(m_indices, dtype=torch.int32))
    deepgemm.check_grouped_layout(num_groups=groups, m_indices=torch.tensor(m_indices, dtype=torch.int32),
                                  m_total=len(m_indices))
    interior_groups, interior = M_INDICES_CASES["padding inside an expert's rows"]  # zeros: the same on every tile
    deepgemm.check_grouped_layout(num_groups=interior_groups, m_indices=torch.tensor(interior, dtype=torch.int32))
    for psum, m_total in ([200, 256, 312], 384), ([200, 200, 312], 384), ([0, 0], 128), ([128, 256], 256):
        deepgemm.check_grouped_layout(num_groups=len(psum), psum=torch.tensor(psum, dtype=torch.int32),
                                      m_total=m_total)
    deepgemm.check_grouped_layout(num_groups=3, masked_m=torch.tensor([0, 64, 128], dtype=torch.int32), max_m=128)
    deepgemm.check_grouped_layout(num_groups=0, masked_m=torch.zeros(0, dtype=torch.int32), max_m=64)


@pytest.mark.parametrize("name,row,rule", [
    ("two experts in one segment", 100, "starts with expert 0"),
    ("segment starting with -1", 10, "starts with -1"),
    ("second half of another expert", 64, "starts with expert 0"),
    ("second half starting with -1", 64, "second 64-row half"),
    ("second half starting with -1, first half padding", 65, "starts with -1"),
    ("out-of-range experts", 50, r"in \[0, 3\) or -1"),
])
def test_malformed_m_indices_are_refused(name: str, row: int, rule: str) -> None:
    groups, m_indices = M_INDICES_CASES[name]
    with pytest.raises(deepgemm.GroupedLayoutError, match=rule) as caught:
        deepgemm.check_grouped_layout(num_groups=groups, m_indices=torch.tensor(m_indices, dtype=torch.int32))
    assert isinstance(caught.value, ValueError)
    assert caught.value.argument == "m_indices" and caught.value.index == row
    assert f"'m_indices'[{row}]" in str(caught.value)


def test_m_indices_length_must_be_whole_segments() -> None:
    with pytest.raises(deepgemm.GroupedLayoutError, match="multiple of 128"):
        deepgemm.check_grouped_layout(num_groups=1, m_indices=torch.zeros(100, dtype=torch.int32))


@pytest.mark.parametrize("psum,m_total,expert,rule", [
    ([-5, 130, 200], 256, 0, "negative"),
    ([100, 900], 256, 1, "past M_total"),
    ([300, 100, 500], 640, 1, "decreases"),
    ([100, 120, 300], 384, 1, "alignment padding"),
])
def test_malformed_psum_is_refused(psum: list[int], m_total: int, expert: int, rule: str) -> None:
    with pytest.raises(deepgemm.GroupedLayoutError, match=rule) as caught:
        deepgemm.check_grouped_layout(num_groups=len(psum), psum=torch.tensor(psum, dtype=torch.int32),
                                      m_total=m_total)
    assert caught.value.argument == "psum" and caught.value.index == expert and "'psum'" in str(caught.value)


@pytest.mark.parametrize("masked_m,expert,rule", [([3, -1, 5], 1, "negative"), ([3, 65, 5], 1, "past max_m")])
def test_malformed_masked_m_is_refused(masked_m: list[int], expert: int, rule: str) -> None:
    with pytest.raises(deepgemm.GroupedLayoutError, match=rule) as caught:
        deepgemm.check_grouped_layout(num_groups=3, masked_m=torch.tensor(masked_m, dtype=torch.int32), max_m=64)
    assert caught.value.argument == "masked_m" and caught.value.index == expert


def test_check_grouped_layout_argument_errors() -> None:
    m_indices = torch.zeros(128, dtype=torch.int32)
    with pytest.raises(TypeError, match="exactly one"):
        deepgemm.check_grouped_layout(num_groups=1)
    with pytest.raises(TypeError, match="exactly one"):
        deepgemm.check_grouped_layout(num_groups=1, m_indices=m_indices, masked_m=m_indices[:1], max_m=64)
    with pytest.raises(TypeError, match="'m_indices'.*int32"):
        deepgemm.check_grouped_layout(num_groups=1, m_indices=m_indices.long())
    with pytest.raises(TypeError, match="'m_indices'.*torch.Tensor"):
        deepgemm.check_grouped_layout(num_groups=1, m_indices=[0] * 128)
    with pytest.raises(ValueError, match="'m_indices'.*1-D"):
        deepgemm.check_grouped_layout(num_groups=1, m_indices=m_indices.view(2, 64))
    with pytest.raises(ValueError, match="'m_total'"):
        deepgemm.check_grouped_layout(num_groups=1, m_indices=m_indices, m_total=256)
    with pytest.raises(TypeError, match="'psum' needs 'm_total'"):
        deepgemm.check_grouped_layout(num_groups=1, psum=torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="'psum'.*one entry per expert"):
        deepgemm.check_grouped_layout(num_groups=2, psum=torch.zeros(1, dtype=torch.int32), m_total=128)
    with pytest.raises(TypeError, match="'masked_m' needs 'max_m'"):
        deepgemm.check_grouped_layout(num_groups=1, masked_m=torch.zeros(1, dtype=torch.int32))
    with pytest.raises(TypeError, match="'max_m' does not apply"):
        deepgemm.check_grouped_layout(num_groups=1, m_indices=m_indices, max_m=64)
    with pytest.raises(ValueError, match="'num_groups'"):
        deepgemm.check_grouped_layout(num_groups=-1, m_indices=m_indices)


def test_layouts_that_pass_read_the_same_on_every_tile(seed: int) -> None:
    """Property over random layouts of every kind: whenever the check passes, block_m 64 and 128 tiles read the
    layout alike, as plain per-row indices; so whenever the two tiles would read it differently, it fails."""
    rng = random.Random(seed)
    outcomes = {"passed": 0, "refused": 0, "refused, tiles differ": 0}
    for _ in range(400):
        groups = rng.randint(1, 4)
        m_indices = torch.tensor(random_m_indices(rng, groups, rng.randint(1, 4)), dtype=torch.int32)
        per_128 = contiguous_row_experts(m_indices, groups, 128)
        per_64 = contiguous_row_experts(m_indices, groups, 64)
        try:
            deepgemm.check_grouped_layout(num_groups=groups, m_indices=m_indices)
        except deepgemm.GroupedLayoutError:
            outcomes["refused, tiles differ" if not torch.equal(per_64, per_128) else "refused"] += 1
            continue
        outcomes["passed"] += 1
        assert torch.equal(per_64, per_128), m_indices.tolist()
        assert torch.equal(per_128, torch.where(m_indices >= 0, m_indices, -1)), m_indices.tolist()
    print(f"seed={seed} outcomes: {outcomes}")
    assert outcomes["passed"] and outcomes["refused, tiles differ"]


@pytest.mark.parametrize("form", ["contiguous", "psum", "masked"])
def test_validate_true_checks_the_layout_and_names_the_function(form: str) -> None:
    k, n = 256, 24
    b = _weights(2, n, k)
    if form == "masked":
        a2d = deepgemm.quantize_per_token_group(torch.randn(2 * 64, k))
        a = (a2d[0].view(2, 64, k), a2d[1].reshape(2, 64, -1))
        out = torch.zeros(2, 64, n, dtype=torch.bfloat16)
        good, bad = torch.tensor([5, 64], dtype=torch.int32), torch.tensor([5, 65], dtype=torch.int32)

        def call(grouping: torch.Tensor, validate: bool) -> torch.Tensor:
            return deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, grouping, 32, validate=validate)
        where = "m_grouped_fp8_gemm_nt_masked"
    else:
        a = deepgemm.quantize_per_token_group(torch.randn(256, k))
        out = torch.zeros(256, n, dtype=torch.bfloat16)
        if form == "psum":
            good, bad = torch.tensor([100, 200], dtype=torch.int32), torch.tensor([100, 120], dtype=torch.int32)
            function, where = deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum, "m_grouped_fp8_gemm_nt_contiguous_psum"
        else:
            good = torch.tensor([0] * 100 + [-1] * 28 + [1] * 128, dtype=torch.int32)
            bad = torch.tensor([0] * 100 + [1] * 28 + [1] * 128, dtype=torch.int32)
            function, where = deepgemm.m_grouped_fp8_gemm_nt_contiguous, "m_grouped_fp8_gemm_nt_contiguous"

        def call(grouping: torch.Tensor, validate: bool) -> torch.Tensor:
            return function(a, b, out, grouping, validate=validate)
    expected = call(good, False).clone()
    assert torch.equal(call(good, True), expected)
    with pytest.raises(deepgemm.GroupedLayoutError, match=f"{where} \\(validate=True\\)"):
        call(bad, True)
    call(bad, False)  # the documented reading, no error: the host never reads the grouping tensor by default


def test_validate_true_is_refused_under_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    import deepgemm.ops.grouped as ops_grouped

    monkeypatch.setattr(ops_grouped, "compiling", lambda: True)
    a = deepgemm.quantize_per_token_group(torch.randn(128, 256))
    with pytest.raises(ValueError, match="validate=True.*check_grouped_layout"):
        ops_grouped.m_grouped_fp8_gemm_nt_contiguous(a, _weights(1, 24, 256), torch.empty(128, 24),
                                                     torch.zeros(128, dtype=torch.int32), validate=True)
