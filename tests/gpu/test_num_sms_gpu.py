"""fp8_gemm_nt(num_sms=) on an sm_90 GPU: a call capped at 32 SMs and an uncapped one on the same inputs, both
against float64 (NaN-poisoned outputs; equal bits are not required: the tile choice, hence the summation order, may
differ), the capped plan's grid within 32 CTAs, and each cap's own launch-ready entry on warm repeats."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import deepgemm
from deepgemm.api import gemm as gemm_api
from tests.gpu.guard import GEMM_ENTRY, GpuGuard
from tests.helpers import assert_close_to_reference, random_operands, reference_abs_fp64, reference_fp64

pytestmark = [pytest.mark.gpu, pytest.mark.quick]

CAP = 32
# (m, n, k): many waves on every SM count (the capped grid is exactly the cap), a decode shape with a K split tail
# on 132 SMs, one tile.
SHAPES = [(4096, 2112, 7168), (64, 7168, 2048), (1, 136, 256)]


@pytest.fixture(scope="module", autouse=True)
def _precompile() -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        jobs = [pool.submit(deepgemm.precompile_fp8_gemm_nt, m, n, k, num_sms=num_sms)
                for m, n, k in SHAPES for num_sms in (CAP, None)]
        jobs.append(pool.submit(deepgemm.precompile_fp8_gemm_nt, 64, 256, 512))  # the refusal test's valid call
        for job in jobs:
            job.result()


def _poisoned_call(a, b, num_sms: int | None, out: torch.Tensor | None = None) -> torch.Tensor:  # noqa: ANN001
    if out is None:
        out = torch.empty((a[0].shape[0], b[0].shape[0]), dtype=torch.bfloat16, device="cuda")
    out.fill_(float("nan"))
    assert deepgemm.fp8_gemm_nt(a, b, out, num_sms=num_sms) is out
    return out


@pytest.mark.parametrize("m,n,k", SHAPES, ids=str)
def test_capped_and_uncapped_calls_match_float64(m: int, n: int, k: int, gpu_guard: GpuGuard) -> None:
    seed = 4100 + m
    print(f"seed {seed}")
    a, b = random_operands(m, n, k, "cuda", seed)
    ref, ref_abs = reference_fp64(a, b), reference_abs_fp64(a, b)
    plans = {}
    for num_sms in (CAP, None):
        before = gpu_guard.launches(GEMM_ENTRY)
        out = _poisoned_call(a, b, num_sms)
        torch.cuda.synchronize()
        assert gpu_guard.launches(GEMM_ENTRY) == before + 1, "no GEMM kernel launched"
        assert_close_to_reference(out, ref, ref_abs)
        # The plan this call made and remembered (a[1] is quantize_per_token_group's M-major layout: no copy).
        plans[num_sms] = gemm_api._ready[gemm_api._metadata_key(a[0], a[1], b[0], b[1], out, num_sms)][0]
        # Warm repeat into the re-poisoned output: the launch-ready fast path launches the same plan again.
        entries = len(gemm_api._ready)
        _poisoned_call(a, b, num_sms, out)
        torch.cuda.synchronize()
        assert gpu_guard.launches(GEMM_ENTRY) == before + 2 and len(gemm_api._ready) == entries
        assert_close_to_reference(out, ref, ref_abs)
    capped, full = plans[CAP], plans[None]
    assert capped is not full
    assert capped.spec.config.num_sms == CAP and 1 <= capped.grid <= CAP, (capped.spec.label(), capped.grid)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert full.spec.config.num_sms == gemm_api.sm_count(0) <= sms and full.grid <= full.spec.config.num_sms
    if m == 4096:
        assert capped.grid == CAP and full.grid > CAP  # many waves: every allowed SM busy


def test_num_sms_above_the_gpus_sm_count_is_refused(gpu_guard: GpuGuard) -> None:
    a, b = random_operands(64, 256, 512, "cuda", seed=4200)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    before = gpu_guard.launches(GEMM_ENTRY)
    for bad, error in ((sms + 1, ValueError), (0, ValueError), (True, TypeError), (32.0, TypeError)):
        with pytest.raises(error, match="'num_sms'"):
            deepgemm.fp8_gemm_nt(a, b, num_sms=bad)
    assert gpu_guard.launches(GEMM_ENTRY) == before, "a GEMM kernel was launched for a rejected call"
    torch.cuda.synchronize()
    assert_close_to_reference(_poisoned_call(a, b, gemm_api.sm_count(0)), reference_fp64(a, b),
                              reference_abs_fp64(a, b))
