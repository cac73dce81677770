"""Seeded random shapes on an sm_90 GPU against float64: dense fp8_gemm_nt (M 1-6000, N 8-20000 with N % 8 == 0,
K 16-8192 with K % 16 == 0, BF16 and FP32 output) and grouped GEMMs (contiguous in the m_indices and psum forms,
masked). Each output is NaN-poisoned first, so an unwritten element fails; each element is held to
tests.helpers.assert_close_to_reference's bound.

The cases are drawn at collection from DEEPGEMM_TEST_SEED (default below): DENSE_COUNT dense and GROUPED_COUNT
grouped ones (issue 25 asks for >= 200 / >= 50; DEEPGEMM_TEST_RANDOM_DENSE / DEEPGEMM_TEST_RANDOM_GROUPED change
the counts). The first QUICK_DENSE / QUICK_GROUPED also run in the quick subset, the rest in `full` only. Every test
prints the seed and its case; a failing case re-runs alone from its node id.

Compiles bound the run time, not the GEMMs: a kernel is specialised on N, K and the out dtype (and on the tile
config the planner picks, which M moves too), so every new (N, K) brings its own compiles while a new M mostly
reuses one. Each case therefore takes (N, K) from a pool drawn once per seed (DENSE_POOL / GROUPED_POOL pairs,
the corners of the ranges among them) and M (and the grouped row counts) freely. At the default seed the 216 dense
cases need 91 distinct kernels where free (N, K) would need 214, the 54 grouped cases 43 (free: 54; their tile also
follows the expert count and rows); the module's fixture compiles them in parallel first (about 1.4 s of one core
each). Operands are drawn on the GPU (tests.gpu.checks), so a 20000 x 8192 B
costs no host time.
"""

from __future__ import annotations

import math
import os
import random
import warnings
from dataclasses import dataclass

import pytest
import torch

import deepgemm
from tests.gpu.checks import (
    check_contiguous,
    check_masked,
    contiguous_layout,
    cuda_activations,
    cuda_grouped_weights,
    cuda_operands,
    max_diff_for,
    nan_like_out,
    padded_rows,
    poison_padding,
    psum_of,
)
from tests.gpu.guard import GEMM_ENTRY
from tests.helpers import assert_close_to_reference, reference_abs_fp64, reference_fp64

pytestmark = pytest.mark.gpu

SEED = int(os.environ.get("DEEPGEMM_TEST_SEED", "20261201"))
DENSE_COUNT = int(os.environ.get("DEEPGEMM_TEST_RANDOM_DENSE", "216"))
GROUPED_COUNT = int(os.environ.get("DEEPGEMM_TEST_RANDOM_GROUPED", "54"))
QUICK_DENSE = 6  # the first cases (the four corners among them) also run in the quick subset
QUICK_GROUPED = 3  # one contiguous, one psum, one masked

M_MAX, N_MAX, K_MAX = 6000, 20000, 8192
DENSE_POOL = 16  # (N, K) pairs the dense cases share (see the module docstring)
GROUPED_N_MAX, GROUPED_K_MAX = 7168, 7168
GROUPED_POOL = 8
GROUPED_B_ELEMENTS = 64_000_000  # G * N * K of a grouped case
GROUPED_ROWS = 8192  # M_total (contiguous) or G * max_m (masked)


def _dtype_name(dtype: torch.dtype) -> str:
    return "fp32" if dtype == torch.float32 else "bf16"


@dataclass(frozen=True)
class DenseCase:
    m: int
    n: int
    k: int
    out_dtype: torch.dtype
    seed: int

    def __str__(self) -> str:
        return f"{self.m}x{self.n}x{self.k}-{_dtype_name(self.out_dtype)}"


@dataclass(frozen=True)
class GroupedCase:
    index: int
    layout: str  # "contiguous" (m_indices), "psum" or "masked"
    n: int
    k: int
    out_dtype: torch.dtype
    seed: int
    counts: tuple[int, ...]  # rows per expert (contiguous / psum) or masked_m
    extra_padding_segments: int = 0  # contiguous / psum: 128-row segments of padding after the experts
    max_m: int = 0  # masked
    expected_m: int = 0  # masked

    @property
    def groups(self) -> int:
        return len(self.counts)

    def __str__(self) -> str:
        rows = f"-maxm{self.max_m}" if self.layout == "masked" else f"-m{self.m_total}"
        return f"{self.index:02d}-{self.layout}-g{self.groups}{rows}-n{self.n}-k{self.k}-{_dtype_name(self.out_dtype)}"

    @property
    def m_total(self) -> int:
        return sum(padded_rows(c) for c in self.counts) + 128 * self.extra_padding_segments


def _log_int(rng: random.Random, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(math.exp(rng.uniform(math.log(lo), math.log(hi))))))


def _dim(rng: random.Random, hi: int, step: int) -> int:
    """A multiple of `step` in [step, hi]: log-uniform half the time (small sizes are where the edge cases are),
    uniform otherwise."""
    units = hi // step
    return step * (_log_int(rng, 1, units) if rng.random() < 0.5 else rng.randint(1, units))


def _out_dtype(rng: random.Random) -> torch.dtype:
    return torch.float32 if rng.random() < 0.25 else torch.bfloat16


def shape_pool(rng: random.Random, size: int, n_max: int, k_max: int,
               corners: tuple[tuple[int, int], ...] = ()) -> list[tuple[int, int]]:
    """`size` distinct (N, K) pairs: `corners` first, then N a multiple of 8 in [8, n_max] and K a multiple of 16 in
    [16, k_max], each log-uniform half the time."""
    pool: list[tuple[int, int]] = list(dict.fromkeys(corners))[:size]
    while len(pool) < size:
        pair = (_dim(rng, n_max, 8), _dim(rng, k_max, 16))
        if pair not in pool:
            pool.append(pair)
    return pool


def dense_cases(seed: int, count: int) -> list[DenseCase]:
    rng = random.Random(seed)
    pool = shape_pool(rng, DENSE_POOL, N_MAX, K_MAX, ((8, 16), (N_MAX, K_MAX), (N_MAX, 16), (8, K_MAX)))
    corners = [(1, 8, 16, torch.bfloat16), (M_MAX, N_MAX, K_MAX, torch.bfloat16), (1, N_MAX, K_MAX, torch.float32),
               (M_MAX, 8, 16, torch.float32)]
    cases: list[DenseCase] = []
    seen: set[tuple[int, int, int, torch.dtype]] = set()
    for m, n, k, dtype in corners:
        if len(cases) < count:
            cases.append(DenseCase(m, n, k, dtype, rng.randrange(2**31)))
            seen.add((m, n, k, dtype))
    while len(cases) < count:
        m = _log_int(rng, 1, M_MAX) if rng.random() < 0.5 else rng.randint(1, M_MAX)
        (n, k), dtype = rng.choice(pool), _out_dtype(rng)
        if (m, n, k, dtype) not in seen:
            seen.add((m, n, k, dtype))
            cases.append(DenseCase(m, n, k, dtype, rng.randrange(2**31)))
    return cases


def _contiguous_counts(rng: random.Random, groups: int) -> tuple[list[int], int]:
    """Rows per expert (0, under one segment, exactly one, long) and trailing padding segments; M_total in
    [128, GROUPED_ROWS] with at least one row."""
    while True:
        counts = [rng.choice([0, rng.randint(1, 127), 128, rng.randint(129, 1000), rng.randint(1, 2500)])
                  for _ in range(groups)]
        extra = rng.choice([0, 0, 1])
        total = sum(padded_rows(c) for c in counts) + 128 * extra
        if sum(counts) > 0 and total <= GROUPED_ROWS:
            return counts, extra


def grouped_cases(seed: int, count: int) -> list[GroupedCase]:
    rng = random.Random(seed + 1)
    pool = shape_pool(rng, GROUPED_POOL, GROUPED_N_MAX, GROUPED_K_MAX, ((8, 16), (GROUPED_N_MAX, GROUPED_K_MAX)))
    cases = []
    for index in range(count):
        layout = ("contiguous", "psum", "masked")[index % 3]
        (n, k), dtype = rng.choice(pool), _out_dtype(rng)
        groups = rng.randint(1, max(1, min(16, GROUPED_B_ELEMENTS // (n * k))))
        case_seed = rng.randrange(2**31)
        if layout == "masked":
            max_m = 64 * rng.randint(1, 16)
            groups = max(1, min(groups, GROUPED_ROWS // max_m))
            counts = [rng.choice([0, max_m, rng.randint(1, max_m), rng.randint(1, 64)]) for _ in range(groups)]
            expected_m = rng.choice([max(1, sum(counts) // groups), rng.randint(1, max_m)])
            cases.append(GroupedCase(index, layout, n, k, dtype, case_seed, tuple(counts), max_m=max_m,
                                     expected_m=expected_m))
        else:
            counts, extra = _contiguous_counts(rng, groups)
            cases.append(GroupedCase(index, layout, n, k, dtype, case_seed, tuple(counts),
                                     extra_padding_segments=extra))
    return cases


DENSE = dense_cases(SEED, DENSE_COUNT)
GROUPED = grouped_cases(SEED, GROUPED_COUNT)


def _params(cases: list, quick: int) -> list:
    return [pytest.param(case, id=str(case), marks=[pytest.mark.quick] if i < quick else [])
            for i, case in enumerate(cases)]


@pytest.fixture(scope="module", autouse=True)
def _precompile_selected(request: pytest.FixtureRequest) -> None:
    """Compile, in parallel, the kernels of the cases this session runs (compiles run out of process). A failure
    only warns: each test then compiles its own kernel and the failing case fails alone."""
    from deepgemm.api.precompile import compile_sources, dense_kernel, local_target, masked_kernel, unique_sources
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import Geometry, grouped_spec
    from deepgemm.kernels.sm90_fp8_gemm_1d2d.problem import GemmKind

    selected = [item.callspec.params["case"] for item in request.session.items
                if getattr(item, "module", None) is request.module and hasattr(item, "callspec")
                and "case" in item.callspec.params]
    try:
        target = local_target()
        kernels = []
        for case in selected:
            if isinstance(case, DenseCase):
                kernels.append(dense_kernel(case.m, case.n, case.k, case.out_dtype, target))
            elif case.layout == "masked":
                kernels.append(masked_kernel(case.expected_m, case.max_m, case.groups, case.n, case.k, case.out_dtype,
                                             target))
            else:
                kind = GemmKind.GROUPED_CONTIGUOUS_PSUM if case.layout == "psum" else GemmKind.GROUPED_CONTIGUOUS
                kernels.append(grouped_spec(kind, Geometry(rows=case.m_total, groups=case.groups), case.n, case.k,
                                            case.out_dtype, case.m_total, target.num_sms))
        compile_sources(unique_sources(kernels))
    except Exception as error:  # noqa: BLE001  (the tests themselves report what is wrong)
        warnings.warn(f"precompiling the random-shape kernels failed ({type(error).__name__}: {error}); "
                      "each test compiles its own", stacklevel=1)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _launched_gemm(guard, before: int) -> None:  # noqa: ANN001
    if guard.counting_launches:
        assert guard.launches(GEMM_ENTRY) > before, "no GEMM kernel launched"


@pytest.mark.parametrize("case", _params(DENSE, QUICK_DENSE))
def test_random_dense_shape_against_float64(case: DenseCase, gpu_guard) -> None:  # noqa: ANN001
    print(f"DEEPGEMM_TEST_SEED={SEED} dense case {case} (operand seed {case.seed})")
    a, b = cuda_operands(case.m, case.n, case.k, _generator(case.seed))
    out = nan_like_out((case.m, case.n), case.out_dtype)
    before = gpu_guard.launches(GEMM_ENTRY)
    assert deepgemm.fp8_gemm_nt(a, b, out) is out
    _launched_gemm(gpu_guard, before)
    assert_close_to_reference(out, reference_fp64(a, b), reference_abs_fp64(a, b), max_diff_for(case.out_dtype))


@pytest.mark.parametrize("case", _params(GROUPED, QUICK_GROUPED))
def test_random_grouped_against_float64(case: GroupedCase, gpu_guard) -> None:  # noqa: ANN001
    print(f"DEEPGEMM_TEST_SEED={SEED} grouped case {case} counts={list(case.counts)} "
          f"extra_padding_segments={case.extra_padding_segments} expected_m={case.expected_m} "
          f"(operand seed {case.seed})")
    max_diff = max_diff_for(case.out_dtype)
    before = gpu_guard.launches(GEMM_ENTRY)
    generator = _generator(case.seed)
    if case.layout == "masked":
        a2d = cuda_activations(case.groups * case.max_m, case.k, generator)  # scales: one M-major [G * max_m, K/128]
        a = (a2d[0].view(case.groups, case.max_m, case.k), a2d[1].reshape(case.groups, case.max_m, -1))
        b = cuda_grouped_weights(case.groups, case.n, case.k, generator)
        masked_m = torch.tensor(case.counts, dtype=torch.int32, device="cuda")
        out = nan_like_out((case.groups, case.max_m, case.n), case.out_dtype)
        assert deepgemm.m_grouped_fp8_gemm_nt_masked(a, b, out, masked_m, expected_m=case.expected_m) is out
        _launched_gemm(gpu_guard, before)
        check_masked(out, a, b, case.counts, max_diff)
        return
    m_indices = contiguous_layout(case.counts, case.extra_padding_segments)
    assert m_indices.numel() == case.m_total
    a = cuda_activations(case.m_total, case.k, generator)
    poison_padding(a, m_indices)
    b = cuda_grouped_weights(case.groups, case.n, case.k, generator)
    out = nan_like_out((case.m_total, case.n), case.out_dtype)
    if case.layout == "psum":
        result = deepgemm.m_grouped_fp8_gemm_nt_contiguous_psum(a, b, out, psum_of(case.counts).cuda())
    else:
        result = deepgemm.m_grouped_fp8_gemm_nt_contiguous(a, b, out, m_indices.cuda())
    assert result is out
    _launched_gemm(gpu_guard, before)
    check_contiguous(out, a, b, m_indices, max_diff)
